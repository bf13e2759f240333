//! Directory contents with cookies that stay valid while entries come and go.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};

use foliofs_vfs::{FileType, Ino};

/// One name in a directory.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub name: OsString,
    pub ino: Ino,
    pub kind: FileType,
}

/// A directory's entries. Every entry gets a cookie from a counter that only
/// grows, and listings resume "after cookie N": removing or adding other
/// entries never shifts where a listing resumes, so nothing present for the
/// whole listing is skipped or repeated.
#[derive(Debug)]
pub(crate) struct Dir {
    /// The directory holding this one (the root's parent is itself).
    pub parent: Ino,
    next_cookie: u64,
    by_name: HashMap<OsString, u64>,
    by_cookie: BTreeMap<u64, Entry>,
}

impl Dir {
    pub fn new(parent: Ino) -> Self {
        Dir {
            parent,
            next_cookie: 1,
            by_name: HashMap::new(),
            by_cookie: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.by_cookie.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_cookie.is_empty()
    }

    pub fn get(&self, name: &OsStr) -> Option<&Entry> {
        self.by_name.get(name).and_then(|c| self.by_cookie.get(c))
    }

    /// Adds an entry; the caller has checked the name is free.
    pub fn insert(&mut self, name: &OsStr, ino: Ino, kind: FileType) {
        let cookie = self.next_cookie;
        self.put(name, cookie, ino, kind);
    }

    /// The cookie of entry `name`.
    pub fn cookie(&self, name: &OsStr) -> Option<u64> {
        self.by_name.get(name).copied()
    }

    /// Puts entry `name` at `cookie` (a restarted server's replay, whose
    /// model holds each name once); the caller has checked the name is
    /// free.
    pub fn put(&mut self, name: &OsStr, cookie: u64, ino: Ino, kind: FileType) {
        self.next_cookie = self.next_cookie.max(cookie + 1);
        self.by_name.insert(name.to_owned(), cookie);
        self.by_cookie.insert(
            cookie,
            Entry {
                name: name.to_owned(),
                ino,
                kind,
            },
        );
    }

    pub fn remove(&mut self, name: &OsStr) -> Option<Entry> {
        let cookie = self.by_name.remove(name)?;
        self.by_cookie.remove(&cookie)
    }

    /// Points an existing name at another inode, keeping its cookie (the
    /// name stays where it was in a listing).
    pub fn replace(&mut self, name: &OsStr, ino: Ino, kind: FileType) {
        if let Some(c) = self.by_name.get(name) {
            if let Some(e) = self.by_cookie.get_mut(c) {
                e.ino = ino;
                e.kind = kind;
            }
        }
    }

    /// Entries after cookie `offset`, each with the cookie that resumes after it.
    pub fn after(&self, offset: u64) -> impl Iterator<Item = (u64, &Entry)> {
        self.by_cookie
            .range(offset.saturating_add(1)..)
            .map(|(&c, e)| (c, e))
    }
}
