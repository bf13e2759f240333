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
}

pub(crate) struct Tree {
    pub nodes: Vec<Node>,
    /// Attributes given to directories no entry declared.
    pub implicit: Meta,
}

/// The root's id.
pub(crate) const ROOT: NodeId = 0;

impl Tree {
    pub fn new(implicit: Meta) -> Tree {
        let root = Node {
            meta: implicit.clone(),
            body: Body::Dir(BTreeMap::new()),
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
                    self.children_mut(at).insert(c.to_vec(), n);
                    n
                }
            };
        }
        Ok(at)
    }

    fn push(&mut self, meta: Meta, body: Body) -> NodeId {
        self.nodes.push(Node { meta, body });
        self.nodes.len() - 1
    }

    /// Puts an entry at `comps` (not empty: the root is [`Tree::set_root`]).
    /// A later entry replaces an earlier one of the same name, except that
    /// a directory over a directory only takes the new attributes and keeps
    /// what is in it, as tar extracts.
    pub fn insert(&mut self, comps: &[&[u8]], meta: Meta, body: Body) -> Result<NodeId, String> {
        let (name, parents) = comps.split_last().expect("the root is set, not inserted");
        let dir = self.dir(parents)?;
        if let Some(old) = self.children_mut(dir).get(*name).copied() {
            if matches!(self.nodes[old].body, Body::Dir(_)) && matches!(body, Body::Dir(_)) {
                self.nodes[old].meta = meta;
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
