//! The tree being built, in memory: metadata only. File data is already in
//! the image (or its tail in the spill file) by the time a file's node is
//! made, so the tree's size depends on the number of entries, never on
//! the bytes they hold. Link counts are not kept here: the layout counts
//! the entries it reaches, so a replaced entry or subtree needs no undoing.

use std::collections::BTreeMap;

use super::data::FileData;

/// An index into [`Tree::nodes`].
pub(crate) type NodeId = usize;

/// The attributes every node has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Meta {
    /// `st_mode`, type bits included.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub nsec: u32,
    /// Full names (`user.foo`) to values, in byte order.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// What a node is, with what it holds.
#[derive(Debug)]
pub(crate) enum Body {
    /// Children by name, in byte order (`strcmp`'s, which EROFS sorts by).
    Dir(BTreeMap<Vec<u8>, NodeId>),
    File(FileData),
    Symlink(Vec<u8>),
    /// A character or block device (the type is in the mode), by its
    /// `dev_t` major and minor.
    Device(u32, u32),
    /// A fifo or a socket: nothing but the mode.
    Special,
}

#[derive(Debug)]
pub(crate) struct Node {
    pub meta: Meta,
    pub body: Body,
    /// A directory no entry declared, made for what is below it: a merge
    /// keeps the attributes the layers below give it.
    pub implied: bool,
}

pub(crate) struct Tree {
    pub nodes: Vec<Node>,
    /// Attributes given to directories no entry declared.
    pub implicit: Meta,
}

/// The root's id.
pub(crate) const ROOT: NodeId = 0;

/// Most symlinks followed resolving one path, as containerd allows.
pub(crate) const MAX_FOLLOW: usize = 255;

impl Tree {
    pub fn new(implicit: Meta) -> Tree {
        let root = Node {
            meta: implicit.clone(),
            body: Body::Dir(BTreeMap::new()),
            implied: true,
        };
        Tree {
            nodes: vec![root],
            implicit,
        }
    }

    fn children_mut(&mut self, dir: NodeId) -> &mut BTreeMap<Vec<u8>, NodeId> {
        match &mut self.nodes[dir].body {
            Body::Dir(c) => c,
            _ => unreachable!("only directories are walked into"),
        }
    }

    /// The directory at `comps`, made (with the implicit attributes) where
    /// missing; an error names a component that is not a directory.
    pub fn dir(&mut self, comps: &[&[u8]]) -> Result<NodeId, String> {
        let mut at = ROOT;
        for (i, c) in comps.iter().enumerate() {
            let next = self.children_mut(at).get(*c).copied();
            at = match next {
                Some(n) if matches!(self.nodes[n].body, Body::Dir(_)) => n,
                Some(_) => {
                    return Err(format!(
                        "{:?} is not a directory",
                        String::from_utf8_lossy(&comps[..=i].join(&b'/'))
                    ))
                }
                None => {
                    let n = self.push(self.implicit.clone(), Body::Dir(BTreeMap::new()));
                    self.nodes[n].implied = true;
                    self.children_mut(at).insert(c.to_vec(), n);
                    n
                }
            };
        }
        Ok(at)
    }

    fn push(&mut self, meta: Meta, body: Body) -> NodeId {
        self.nodes.push(Node {
            meta,
            body,
            implied: false,
        });
        self.nodes.len() - 1
    }

    /// Puts an entry at `comps`. A later entry replaces an earlier one of
    /// the same name, except that a directory over a directory only takes
    /// the new attributes and keeps what is in it, as tar extracts.
    pub fn insert(&mut self, comps: &[&[u8]], meta: Meta, body: Body) -> Result<NodeId, String> {
        // A tar may name the root (`.`, `./`) with any entry type; only a
        // directory's attributes can go there, through `set_root`.
        let Some((name, parents)) = comps.split_last() else {
            return Err("the root must be a directory".into());
        };
        let dir = self.dir(parents)?;
        if let Some(old) = self.children_mut(dir).get(*name).copied() {
            if matches!(self.nodes[old].body, Body::Dir(_)) && matches!(body, Body::Dir(_)) {
                self.nodes[old].meta = meta;
                self.nodes[old].implied = false;
                return Ok(old);
            }
        }
        let n = self.push(meta, body);
        self.children_mut(dir).insert(name.to_vec(), n);
        Ok(n)
    }

    /// Gives the root the attributes of an entry naming it.
    pub fn set_root(&mut self, meta: Meta) {
        self.nodes[ROOT].meta = meta;
        self.nodes[ROOT].implied = false;
    }

    /// The directory path `comps` names with every symlink along it
    /// followed, as containerd resolves an entry's parents: within the
    /// root (an absolute target starts at the root, `..` stops there), at
    /// most [`MAX_FOLLOW`] links. From the first missing name or non-directory on,
    /// the rest is kept as given (making it, or failing on it, is the
    /// caller's business).
    pub fn resolve(&self, comps: &[&[u8]]) -> Result<Vec<Vec<u8>>, String> {
        let mut todo: Vec<Vec<u8>> = comps.iter().rev().map(|c| c.to_vec()).collect();
        let mut path: Vec<Vec<u8>> = Vec::new();
        // The node of each component of `path`, while they all exist.
        let mut nodes: Vec<NodeId> = vec![ROOT];
        let mut follows = 0;
        while let Some(c) = todo.pop() {
            match c.as_slice() {
                b"" | b"." => continue,
                b".." => {
                    if path.pop().is_some() && nodes.len() > path.len() + 1 {
                        nodes.pop();
                    }
                    continue;
                }
                _ => {}
            }
            let here = (nodes.len() == path.len() + 1).then(|| nodes[nodes.len() - 1]);
            let child = here.and_then(|d| match &self.nodes[d].body {
                Body::Dir(ch) => ch.get(&c).copied(),
                _ => None,
            });
            match child.map(|n| (n, &self.nodes[n].body)) {
                Some((_, Body::Symlink(target))) => {
                    follows += 1;
                    if follows > MAX_FOLLOW {
                        return Err(format!(
                            "more than {MAX_FOLLOW} symlinks followed resolving {:?} (a loop?)",
                            String::from_utf8_lossy(&comps.join(&b'/'))
                        ));
                    }
                    if target.first() == Some(&b'/') {
                        path.clear();
                        nodes.truncate(1);
                    }
                    todo.extend(target.split(|&b| b == b'/').rev().map(<[u8]>::to_vec));
                }
                Some((n, Body::Dir(_))) => {
                    path.push(c);
                    nodes.push(n);
                }
                _ => path.push(c),
            }
        }
        Ok(path)
    }

    /// Whether `comps` names a directory, or nothing yet (every component
    /// a directory as far as they exist).
    pub fn is_dir_or_missing(&self, comps: &[Vec<u8>]) -> bool {
        let mut at = ROOT;
        for c in comps {
            match &self.nodes[at].body {
                Body::Dir(ch) => match ch.get(c) {
                    Some(&n) => at = n,
                    None => return true,
                },
                _ => return false,
            }
        }
        matches!(self.nodes[at].body, Body::Dir(_))
    }

    /// The node at `comps`, if there is one.
    pub fn lookup(&self, comps: &[&[u8]]) -> Option<NodeId> {
        let mut at = ROOT;
        for c in comps {
            match &self.nodes[at].body {
                Body::Dir(ch) => at = *ch.get(*c)?,
                _ => return None,
            }
        }
        Some(at)
    }

    /// The paths (components joined by `/`, the root empty) of the
    /// directories no entry declared, in byte order.
    pub fn implied_dirs(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut todo = vec![(ROOT, Vec::new())];
        while let Some((n, path)) = todo.pop() {
            let Body::Dir(children) = &self.nodes[n].body else {
                continue;
            };
            if self.nodes[n].implied {
                out.push(path.clone());
            }
            for (name, &c) in children {
                if matches!(self.nodes[c].body, Body::Dir(_)) {
                    let mut p = path.clone();
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(name);
                    todo.push((c, p));
                }
            }
        }
        out.sort();
        out
    }

    /// Takes the entry `name` (and what is below it) out of directory
    /// `dir`, if it is there.
    pub fn remove(&mut self, dir: NodeId, name: &[u8]) {
        self.children_mut(dir).remove(name);
    }

    /// Empties directory `dir`.
    pub fn clear(&mut self, dir: NodeId) {
        self.children_mut(dir).clear();
    }

    /// Adds a hard link at `comps` to the existing non-directory `target`.
    pub fn link(&mut self, comps: &[&[u8]], target: NodeId) -> Result<(), String> {
        if matches!(self.nodes[target].body, Body::Dir(_)) {
            return Err("a hard link may not name a directory".into());
        }
        let (name, parents) = comps
            .split_last()
            .ok_or("a hard link may not replace the root")?;
        let dir = self.dir(parents)?;
        if let Some(old) = self.children_mut(dir).get(*name).copied() {
            if old == target {
                return Ok(());
            }
            if matches!(self.nodes[old].body, Body::Dir(_)) {
                return Err("a hard link may not replace a directory".into());
            }
        }
        self.children_mut(dir).insert(name.to_vec(), target);
        Ok(())
    }
}
