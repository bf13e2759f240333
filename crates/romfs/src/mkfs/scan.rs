//! Walking the source tree: what to store, in which order, aligned how.

use super::*;

#[derive(Debug)]
pub(super) enum Kind {
    Dir(Vec<usize>),
    File {
        size: u64,
    },
    Symlink(Vec<u8>),
    Device {
        ty: EntryType,
        spec: u32,
    },
    Special(EntryType),
    /// A later name of an already stored file.
    Link(usize),
}

#[derive(Debug)]
pub(super) struct Node {
    pub(super) name: Vec<u8>,
    /// Path on the host.
    pub(super) path: PathBuf,
    pub(super) kind: Kind,
    pub(super) exec: bool,
    /// Alignment of the data (regular files) or the header (others).
    pub(super) align: u64,
    /// Header offset, once laid out.
    pub(super) offset: u64,
}

pub(super) struct Matcher {
    pub(super) by_name: GlobSet,
    pub(super) by_path: GlobSet,
    /// Index in the pattern list of each glob in the two sets.
    pub(super) name_ids: Vec<usize>,
    pub(super) path_ids: Vec<usize>,
}

impl Matcher {
    pub(super) fn new(patterns: &[&str]) -> Result<Matcher, MkfsError> {
        let mut by_name = GlobSetBuilder::new();
        let mut by_path = GlobSetBuilder::new();
        let (mut name_ids, mut path_ids) = (Vec::new(), Vec::new());
        for (i, p) in patterns.iter().enumerate() {
            let glob = GlobBuilder::new(p)
                .literal_separator(true)
                .build()
                .map_err(|e| MkfsError::BadPattern {
                    pattern: p.to_string(),
                    why: e.kind().to_string(),
                })?;
            if p.contains('/') {
                by_path.add(glob);
                path_ids.push(i);
            } else {
                by_name.add(glob);
                name_ids.push(i);
            }
        }
        let build = |b: GlobSetBuilder| {
            b.build().map_err(|e| MkfsError::BadPattern {
                pattern: patterns.join(" "),
                why: e.to_string(),
            })
        };
        Ok(Matcher {
            by_name: build(by_name)?,
            by_path: build(by_path)?,
            name_ids,
            path_ids,
        })
    }

    /// Indices of the patterns matching an entry.
    pub(super) fn matches(&self, name: &[u8], rel: &Path) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .by_name
            .matches(std::ffi::OsStr::from_bytes(name))
            .into_iter()
            .map(|i| self.name_ids[i])
            .collect();
        let rooted = Path::new("/").join(rel);
        out.extend(
            self.by_path
                .matches(&rooted)
                .into_iter()
                .map(|i| self.path_ids[i]),
        );
        out
    }
}

/// The scanned tree: its nodes, the root's index among them, and the
/// regular files and data bytes to copy.
pub(super) struct Scanned {
    pub(super) nodes: Vec<Node>,
    pub(super) root: usize,
    pub(super) files: u64,
    pub(super) bytes: u64,
}

/// Scans the tree at `src` (whose metadata is `root_md`), leaving out the
/// excluded entries and the image being written (`output`, its device and
/// inode).
pub(super) fn scan_tree(
    src: &Path,
    root_md: &Metadata,
    opts: &MkfsOptions,
    output: (u64, u64),
) -> Result<Scanned, MkfsError> {
    let excl: Vec<&str> = opts.excludes.iter().map(String::as_str).collect();
    let alpat: Vec<&str> = opts
        .align_patterns
        .iter()
        .map(|(_, p)| p.as_str())
        .collect();
    let mut sc = Scanner {
        opts,
        excludes: Matcher::new(&excl)?,
        aligns: Matcher::new(&alpat)?,
        nodes: Vec::new(),
        linked: HashMap::new(),
        output: Some(output),
        files: 0,
        bytes: 0,
    };
    let root = sc.push(
        Vec::new(),
        src.to_owned(),
        Kind::Dir(Vec::new()),
        root_md.mode() & 0o111 != 0,
        0,
    );
    let children = sc.scan_dir(src, Path::new(""))?;
    sc.nodes[root].kind = Kind::Dir(children);
    Ok(Scanned {
        nodes: sc.nodes,
        root,
        files: sc.files,
        bytes: sc.bytes,
    })
}

pub(super) fn check_align(a: u64) -> Result<u64, MkfsError> {
    if a.is_power_of_two() && (MIN_ALIGN..=MAX_ALIGN).contains(&a) {
        Ok(a)
    } else {
        Err(MkfsError::BadAlign(a))
    }
}

pub(super) struct Scanner<'a> {
    pub(super) opts: &'a MkfsOptions,
    pub(super) excludes: Matcher,
    pub(super) aligns: Matcher,
    pub(super) nodes: Vec<Node>,
    /// (dev, ino) of multiply linked files already stored.
    pub(super) linked: HashMap<(u64, u64), usize>,
    /// The image being written, never stored in itself.
    pub(super) output: Option<(u64, u64)>,
    pub(super) files: u64,
    pub(super) bytes: u64,
}

impl Scanner<'_> {
    pub(super) fn scan_dir(&mut self, dir: &Path, rel: &Path) -> Result<Vec<usize>, MkfsError> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io_err(dir))?;
        names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = dir.join(&name);
            let rel = rel.join(&name);
            let name = name.as_bytes().to_vec();
            if !self.excludes.matches(&name, &rel).is_empty() {
                continue;
            }
            if name.len() > MAX_NAME {
                return Err(MkfsError::NameTooLong {
                    len: name.len(),
                    path,
                });
            }
            let md = std::fs::symlink_metadata(&path).map_err(io_err(&path))?;
            if self.output == Some((md.dev(), md.ino())) {
                continue;
            }
            let idx = self.node(name, path, &rel, &md)?;
            out.push(idx);
        }
        Ok(out)
    }

    pub(super) fn node(
        &mut self,
        name: Vec<u8>,
        path: PathBuf,
        rel: &Path,
        md: &Metadata,
    ) -> Result<usize, MkfsError> {
        let ft = md.file_type();
        let mut align = 0;
        for i in self.aligns.matches(&name, rel) {
            align = align.max(self.opts.align_patterns[i].0);
        }
        let exec = md.mode() & 0o111 != 0;
        let key = (md.dev(), md.ino());
        if !ft.is_dir() && md.nlink() > 1 {
            if let Some(&first) = self.linked.get(&key) {
                return Ok(self.push(name, path, Kind::Link(first), false, 0));
            }
        }
        let kind = if ft.is_dir() {
            let idx = self.push(name, path.clone(), Kind::Dir(Vec::new()), exec, align);
            let children = self.scan_dir(&path, rel)?;
            self.nodes[idx].kind = Kind::Dir(children);
            return Ok(idx);
        } else if ft.is_file() {
            let size = md.len();
            if size >= MAX_IMAGE {
                return Err(MkfsError::FileTooBig { path, size });
            }
            self.files += 1;
            self.bytes += size;
            align = align.max(self.opts.align);
            Kind::File { size }
        } else if ft.is_symlink() {
            let t = std::fs::read_link(&path).map_err(io_err(&path))?;
            Kind::Symlink(t.as_os_str().as_bytes().to_vec())
        } else if ft.is_block_device() || ft.is_char_device() {
            let (major, minor) = (libc::major(md.rdev()), libc::minor(md.rdev()));
            if major > 0xffff || minor > 0xffff {
                return Err(MkfsError::DeviceNumber { path, major, minor });
            }
            let ty = if ft.is_block_device() {
                EntryType::BlockDevice
            } else {
                EntryType::CharDevice
            };
            Kind::Device {
                ty,
                spec: major << 16 | minor,
            }
        } else if ft.is_fifo() {
            Kind::Special(EntryType::Fifo)
        } else if ft.is_socket() {
            Kind::Special(EntryType::Socket)
        } else {
            return Err(MkfsError::UnsupportedType { path });
        };
        let idx = self.push(name, path, kind, exec, align);
        if md.nlink() > 1 {
            self.linked.insert(key, idx);
        }
        Ok(idx)
    }

    pub(super) fn push(
        &mut self,
        name: Vec<u8>,
        path: PathBuf,
        kind: Kind,
        exec: bool,
        align: u64,
    ) -> usize {
        self.nodes.push(Node {
            name,
            path,
            kind,
            exec,
            align,
            offset: 0,
        });
        self.nodes.len() - 1
    }
}
