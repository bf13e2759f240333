//! Reading a ledger back: its transactions applied in order to a plain
//! model of the file system, then checked as a whole before a restarted
//! server builds its inodes from it (`durable.rs`).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use foliofs_vfs::{FileType, Ino};

use super::record::{Image, Reader, Rec};
use super::{frames, LedgerError};

/// Requests remembered for resends: a resent one is among the last a dead
/// server read, so the last few thousand cover every queue.
pub(crate) const DONE_KEPT: usize = 4096;

/// A directory entry: its cookie, inode and type.
pub(crate) type Named = (u64, Ino, FileType);

/// What a ledger says the file system is.
#[derive(Debug, Default)]
pub(crate) struct Model {
    pub inodes: HashMap<Ino, Image>,
    pub names: HashMap<Ino, HashMap<Vec<u8>, Named>>,
    pub xattrs: HashMap<Ino, BTreeMap<Vec<u8>, Vec<u8>>>,
    pub blocks: HashMap<Ino, BTreeMap<u64, u64>>,
    pub next_ino: u64,
    pub done: VecDeque<(u64, Ino, u64)>,
}

impl Model {
    pub fn apply(&mut self, r: Rec) {
        match r {
            Rec::Inode(i) => {
                self.next_ino = self.next_ino.max(i.ino + 1);
                match self.inodes.get(&i.ino) {
                    Some(old) if old.version >= i.version => {}
                    _ => {
                        self.inodes.insert(i.ino, i);
                    }
                }
            }
            Rec::Name {
                parent,
                name,
                cookie,
                ino,
                kind,
            } => {
                self.names
                    .entry(parent)
                    .or_default()
                    .insert(name, (cookie, ino, kind));
            }
            Rec::NoName { parent, name } => {
                if let Some(d) = self.names.get_mut(&parent) {
                    d.remove(&name);
                }
            }
            Rec::Xattr { ino, name, value } => {
                let x = self.xattrs.entry(ino).or_default();
                match value {
                    Some(v) => {
                        x.insert(name, v);
                    }
                    None => {
                        x.remove(&name);
                    }
                }
            }
            Rec::Map { ino, idx, k } => {
                self.blocks.entry(ino).or_default().insert(idx, k);
            }
            Rec::Cut { ino, idx } => {
                if let Some(b) = self.blocks.get_mut(&ino) {
                    b.split_off(&idx);
                }
            }
            Rec::Unmap { ino, idx } => {
                if let Some(b) = self.blocks.get_mut(&ino) {
                    b.remove(&idx);
                }
            }
            Rec::NextIno(n) => self.next_ino = self.next_ino.max(n),
            Rec::Done { request, ino, fh } => {
                if self.done.len() == DONE_KEPT {
                    self.done.pop_front();
                }
                self.done.push_back((request, ino, fh));
            }
        }
    }

    /// The model of a region's bytes.
    pub fn read(bytes: &[u8], region: usize) -> Result<Model, LedgerError> {
        let mut m = Model::default();
        let mut offset = 0u64;
        for f in frames(bytes, region) {
            let tx = f?;
            let mut rd = Reader::new(tx);
            // A transaction is applied whole or not at all.
            let mut recs = Vec::new();
            loop {
                match rd.next_rec() {
                    Ok(Some(r)) => recs.push(r),
                    Ok(None) => break,
                    Err(e) => {
                        return Err(LedgerError::Damaged {
                            region,
                            offset,
                            what: e.to_string(),
                        })
                    }
                }
            }
            for r in recs {
                m.apply(r);
            }
            offset += (8 + tx.len()).next_multiple_of(8) as u64;
        }
        m.settle();
        m.check()?;
        Ok(m)
    }

    /// Drops what nothing can reach any more: inodes with no name and no
    /// open handle, with their blocks, xattrs and entries.
    fn settle(&mut self) {
        let gone: HashSet<Ino> = self
            .inodes
            .values()
            .filter(|i| i.nlink == 0 && i.opens == 0)
            .map(|i| i.ino)
            .collect();
        for ino in &gone {
            self.inodes.remove(ino);
            self.names.remove(ino);
        }
        self.blocks.retain(|ino, _| self.inodes.contains_key(ino));
        self.xattrs.retain(|ino, _| self.inodes.contains_key(ino));
        self.names.retain(|ino, _| self.inodes.contains_key(ino));
    }

    /// What must hold for a server to serve this: every name leads to an
    /// inode of its type, in a directory; no block belongs to two places.
    fn check(&self) -> Result<(), LedgerError> {
        let bad = |what: String| LedgerError::Damaged {
            region: 0,
            offset: 0,
            what,
        };
        if !self
            .inodes
            .get(&crate::ROOT_INO)
            .is_some_and(|r| r.kind == FileType::Directory)
        {
            return Err(bad("it has no root directory".into()));
        }
        for (parent, entries) in &self.names {
            let p = &self.inodes[parent];
            if p.kind != FileType::Directory {
                return Err(bad(format!("inode {parent} has names but is no directory")));
            }
            for (name, (_, ino, kind)) in entries {
                let shown = String::from_utf8_lossy(name);
                match self.inodes.get(ino) {
                    None => {
                        return Err(bad(format!(
                            "entry {shown:?} of directory {parent} names inode {ino}, which is gone"
                        )))
                    }
                    Some(i) if i.kind != *kind => {
                        return Err(bad(format!(
                        "entry {shown:?} of directory {parent} names inode {ino} as another type"
                    )))
                    }
                    _ => {}
                }
            }
        }
        let mut owner: HashMap<u64, Ino> = HashMap::new();
        for (ino, map) in &self.blocks {
            if self.inodes[ino].kind != FileType::RegularFile {
                return Err(bad(format!("inode {ino} has data blocks but is no file")));
            }
            for k in map.values() {
                if let Some(other) = owner.insert(*k, *ino) {
                    return Err(bad(format!(
                        "block {k} of the data file belongs to inodes {other} and {ino}"
                    )));
                }
            }
        }
        Ok(())
    }
}
