//! What the EROFS tests compare: every field of every path, walked through
//! a mount (the kernel's or foliofs's) with the system calls a user makes,
//! or through the library's `FileSystem` trait; and the kernel's own
//! file-backed mount to walk. Also the host-side setters the trees use.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use foliofs_erofs::Erofs;
use foliofs_vfs::{FileSystem, FileType, Scratch};
use sha2::{Digest, Sha256};

/// Everything compared for one path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// `st_ino`: the EROFS nid, as the kernel reports it.
    pub ino: u64,
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub nlink: u64,
    pub rdev: (u32, u32),
    pub target: Option<Vec<u8>>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub sha256: Option<String>,
}

pub type Tree = BTreeMap<PathBuf, Node>;

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a live buffer for the call.
    let rc = unsafe {
        libc::lsetxattr(
            cstr(path).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr {name} on {}", path.display());
}

pub fn set_mtime(path: &Path, sec: i64, nsec: i64) {
    let ts = [
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            cstr(path).as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", path.display());
}

pub fn host_xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let p = cstr(path);
    let mut names = vec![0u8; 1 << 16];
    // SAFETY: valid path and a buffer of the stated size.
    let n = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let mut out = BTreeMap::new();
    for name in names[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 1 << 16];
        // SAFETY: as above.
        let m = unsafe { libc::lgetxattr(p.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(
            m >= 0,
            "getxattr {} {:?}: {}",
            path.display(),
            String::from_utf8_lossy(name),
            std::io::Error::last_os_error()
        );
        v.truncate(m as usize);
        out.insert(name.to_vec(), v);
    }
    out
}

/// Walks a mounted directory through the system calls a user would make.
pub fn walk_mounted(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let md = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
        let ft = md.file_type();
        let kind = foliofs_vfs::FileType::from_std(ft)
            .map_or("unknown", foliofs_vfs::FileType::short_name);
        let mut sha256 = None;
        if ft.is_file() {
            let mut h = Sha256::new();
            let mut f = fs::File::open(&p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f
                    .read(&mut buf)
                    .unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            sha256 = Some(format!("{:x}", h.finalize()));
        }
        let target = ft
            .is_symlink()
            .then(|| fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec());
        out.insert(
            rel.clone(),
            Node {
                ino: md.ino(),
                kind,
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                size: md.size(),
                mtime: (md.mtime(), md.mtime_nsec()),
                nlink: md.nlink(),
                rdev: (libc::major(md.rdev()), libc::minor(md.rdev())),
                target,
                xattrs: host_xattrs(&p),
                sha256,
            },
        );
        if ft.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
    }
    out
}

/// Walks the library directly, through the `FileSystem` trait.
pub fn walk_library(fs: &Erofs) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(PathBuf::new(), fs.root())];
    let mut scratch = Scratch::new();
    while let Some((rel, ino)) = stack.pop() {
        let a = fs
            .getattr(ino)
            .unwrap_or_else(|e| panic!("getattr {}: {e}", rel.display()));
        let mut sha256 = None;
        let mut target = None;
        match a.kind {
            FileType::RegularFile => {
                let mut h = Sha256::new();
                let mut off = 0u64;
                loop {
                    let got = fs
                        .read(ino, off, 1 << 17, &mut scratch)
                        .unwrap_or_else(|e| panic!("read {}: {e}", rel.display()));
                    if got.is_empty() {
                        break;
                    }
                    h.update(got);
                    off += got.len() as u64;
                }
                assert_eq!(off, a.size, "{}: read length", rel.display());
                sha256 = Some(format!("{:x}", h.finalize()));
            }
            FileType::Symlink => target = Some(fs.readlink(ino).unwrap()),
            FileType::Directory => {
                let mut children = Vec::new();
                fs.readdir(ino, 0, &mut |e| {
                    children.push((e.name.to_owned(), e.ino, e.kind));
                    false
                })
                .unwrap();
                for (name, child, kind) in children {
                    let looked = fs.lookup(ino, &name).unwrap();
                    assert_eq!((looked.ino, looked.kind), (child, kind), "lookup {name:?}");
                    stack.push((rel.join(name), child));
                }
            }
            _ => {}
        }
        let mut xattrs = BTreeMap::new();
        for n in fs.listxattr(ino).unwrap() {
            let v = fs.getxattr(ino, OsStr::from_bytes(&n)).unwrap();
            xattrs.insert(n, v);
        }
        out.insert(
            rel,
            Node {
                ino: a.ino,
                kind: a.kind.short_name(),
                mode: a.mode(),
                uid: a.uid,
                gid: a.gid,
                size: a.size,
                mtime: (a.mtime.sec, i64::from(a.mtime.nsec)),
                nlink: u64::from(a.nlink),
                rdev: (a.rdev.major, a.rdev.minor),
                target,
                xattrs,
                sha256,
            },
        );
    }
    out
}

pub fn assert_same(what: &str, want: &Tree, got: &Tree) {
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("missing: {}", p.display())),
            Some(g) if g != w => {
                diffs.push(format!("{}:\n  kernel {w:?}\n  {what} {g:?}", p.display()))
            }
            _ => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("unexpected: {}", p.display()));
    }
    let n = diffs.len();
    diffs.truncate(20);
    assert!(
        n == 0,
        "{what} differs from the kernel in {n} place(s):\n{}",
        diffs.join("\n")
    );
}

/// A kernel EROFS mount of an image file (file-backed, no loop device),
/// detached when dropped.
pub struct KernelMount {
    dir: tempfile::TempDir,
}

impl KernelMount {
    pub fn new(image: &Path, data: &str) -> KernelMount {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-kerofs.")
            .tempdir()
            .unwrap();
        let data = CString::new(data).unwrap();
        let fstype = CString::new("erofs").unwrap();
        // SAFETY: every pointer is a valid NUL-terminated string for the call.
        let rc = unsafe {
            libc::mount(
                cstr(image).as_ptr(),
                cstr(dir.path()).as_ptr(),
                fstype.as_ptr(),
                libc::MS_RDONLY,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "kernel file-backed mount of {}: {}",
            image.display(),
            std::io::Error::last_os_error()
        );
        KernelMount { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(cstr(self.dir.path()).as_ptr(), libc::MNT_DETACH) };
    }
}

/// Every name `dir` lists, "." and ".." included, in the order readdir(3)
/// returns them: what `fs::read_dir` hides (the dots) and sorts away by
/// being collected into a tree.
pub fn listing_in_order(dir: &Path) -> Vec<Vec<u8>> {
    let p = cstr(dir);
    // SAFETY: a valid NUL-terminated path.
    let d = unsafe { libc::opendir(p.as_ptr()) };
    assert!(
        !d.is_null(),
        "opendir {}: {}",
        dir.display(),
        std::io::Error::last_os_error()
    );
    let mut names = Vec::new();
    loop {
        // SAFETY: `d` is an open directory stream, not yet closed.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir returned an entry whose d_name is NUL-terminated
        // and valid until the next readdir or closedir on `d`.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        names.push(name.to_bytes().to_vec());
    }
    // SAFETY: `d` is open and closed once.
    unsafe { libc::closedir(d) };
    names
}

/// The names `path` lists in listxattr(2)'s order.
pub fn xattr_names_in_order(path: &Path) -> Vec<Vec<u8>> {
    let mut names = vec![0u8; 1 << 16];
    // SAFETY: valid path and a buffer of the stated size.
    let n =
        unsafe { libc::llistxattr(cstr(path).as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(
        n >= 0,
        "listxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    names[..n as usize]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}
/// getxattr(2) of `name` on `path`: the value, or the errno.
pub fn getxattr(path: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let n = CString::new(name).unwrap();
    let mut v = vec![0u8; 1 << 16];
    // SAFETY: valid NUL-terminated strings and a buffer of the stated size.
    let m = unsafe {
        libc::lgetxattr(
            cstr(path).as_ptr(),
            n.as_ptr(),
            v.as_mut_ptr().cast(),
            v.len(),
        )
    };
    if m < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    v.truncate(m as usize);
    Ok(v)
}
