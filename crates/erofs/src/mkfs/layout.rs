//! The metadata, laid out once every file's data is in the image: inodes placed in
//! breadth-first order (a directory's entries side by side, the root
//! first), link counts from the entries reached, directory blocks sorted
//! as the kernel's binary search expects, tails inlined where they fit,
//! then the shared xattrs and the inodes, each packed best-fit into the
//! metadata blocks (`Packer`).

use std::collections::HashMap;

use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

use crate::format::{
    erofs_dirent, erofs_inode_chunk_index, erofs_inode_compact, erofs_inode_extended, Layout,
    CHUNK_FORMAT_BLKBITS_MASK, CHUNK_FORMAT_INDEXES, DIRENT_SIZE, FT_BLKDEV, FT_CHRDEV, FT_DIR,
    FT_FIFO, FT_REG_FILE, FT_SOCK, FT_SYMLINK, INODE_COMPACT_SIZE, I_FORMAT_EXTENDED,
    MAX_INODE_SIZE,
};

use super::data::{FileData, Writer};
use super::tree::{Body, NodeId, Tree, ROOT};
use super::xattr::{icount, Shared};
use super::zindex;
use super::BuildError;

mod packer;

use packer::Packer;

/// Where the metadata went, for the superblock.
pub(crate) struct Placed {
    pub root_nid: u64,
    pub inos: u64,
    pub meta_blkaddr: u64,
    pub xattr_blkaddr: u64,
    pub xattr_filter: bool,
    /// Some file is compressed.
    pub compressed: bool,
}

/// One inode's plan.
struct Plan {
    node: NodeId,
    nid: u64,
    nlink: u32,
    /// Parent directory's position in the order (directories only).
    parent: usize,
    size: u64,
    layout: Layout,
    extended: bool,
    xattrs: Vec<u8>,
    /// The `i_u` field: first block, or the encoded device number.
    i_u: u32,
    /// Inline tail length (0: none), or for a compressed or chunk-based
    /// file the bytes of its indexes and the padding before them.
    tail: u64,
    /// For a chunk-based file: the bytes of one index entry (8 with
    /// device ids, 4 for a plain block map) and the number of entries.
    chunk_index: Option<(u64, u64)>,
}

const S_IFMT: u32 = 0o170000;

fn file_type(mode: u32) -> u8 {
    match mode & S_IFMT {
        0o100000 => FT_REG_FILE,
        0o040000 => FT_DIR,
        0o020000 => FT_CHRDEV,
        0o060000 => FT_BLKDEV,
        0o010000 => FT_FIFO,
        0o140000 => FT_SOCK,
        _ => FT_SYMLINK,
    }
}

/// Linux's `new_encode_dev`, as EROFS stores `rdev`.
pub(crate) fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// A directory's entries ("." and ".." among them) split into blocks:
/// each block's entries, in byte order across the whole directory.
fn dir_blocks(names: &[&[u8]], blksz: u64) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0u64);
    for (i, n) in names.iter().enumerate() {
        let need = (DIRENT_SIZE + n.len()) as u64;
        if used + need > blksz {
            out.push(start..i);
            start = i;
            used = 0;
        }
        used += need;
    }
    out.push(start..names.len());
    out
}

/// The size of a directory with these entry names.
fn dir_size(names: &[&[u8]], blksz: u64) -> u64 {
    let blocks = dir_blocks(names, blksz);
    let last = blocks.last().expect("a directory has . and ..");
    let tail: u64 = names[last.clone()]
        .iter()
        .map(|n| (DIRENT_SIZE + n.len()) as u64)
        .sum();
    (blocks.len() as u64 - 1) * blksz + tail
}

/// The bytes of a directory: entries are (name, nid, file type), sorted.
fn dir_bytes(entries: &[(&[u8], u64, u8)], blksz: u64) -> Vec<u8> {
    let names: Vec<&[u8]> = entries.iter().map(|e| e.0).collect();
    let mut out = Vec::new();
    let blocks = dir_blocks(&names, blksz);
    let n = blocks.len();
    for (b, range) in blocks.into_iter().enumerate() {
        let start = out.len();
        let mut nameoff = DIRENT_SIZE * range.len();
        for (name, nid, ft) in &entries[range.clone()] {
            let de = erofs_dirent {
                nid: (*nid).into(),
                nameoff: (nameoff as u16).into(),
                file_type: *ft,
                reserved: 0,
            };
            out.extend_from_slice(de.as_bytes());
            nameoff += name.len();
        }
        for (name, _, _) in &entries[range] {
            out.extend_from_slice(name);
        }
        if b + 1 < n {
            out.resize(start + blksz as usize, 0);
        }
    }
    out
}

/// A directory's sorted entries: (name, node), "." and ".." included.
fn entries_of(tree: &Tree, dir: NodeId, parent: NodeId) -> Vec<(&[u8], NodeId)> {
    let Body::Dir(children) = &tree.nodes[dir].body else {
        unreachable!("entries of a directory")
    };
    let mut v: Vec<(&[u8], NodeId)> = vec![(b".", dir), (b"..", parent)];
    v.extend(children.iter().map(|(n, &c)| (n.as_slice(), c)));
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// Bytes of a chunk index: advise, device id, block address.
const CHUNK_INDEX_SIZE: u64 = size_of::<erofs_inode_chunk_index>() as u64;
/// Bytes of a block map entry: a block address.
const BLOCK_MAP_ENTRY_SIZE: u64 = size_of::<U32>() as u64;

/// log2 of the chunk size for a file that is one run of bytes in a tar:
/// the file in one chunk, as far as the format's 5 bits of chunk size
/// above the block allow.
fn tar_chunkbits(size: u64, blkszbits: u8) -> u8 {
    let need = (64 - size.saturating_sub(1).leading_zeros()) as u8;
    need.clamp(blkszbits, blkszbits + CHUNK_FORMAT_BLKBITS_MASK as u8)
}

pub(crate) struct Params {
    pub epoch: i64,
    pub nsec: u32,
    /// How compressed files' indexes are laid out.
    pub zindex: zindex::Shape,
}

/// Lays out and writes every block after the file data: the inodes'
/// order, each one's plan, their places in the metadata area, then the
/// directory and symlink blocks, the shared xattrs and the inodes.
pub(crate) fn write(tree: &Tree, w: &mut Writer, p: &Params) -> Result<Placed, BuildError> {
    let blksz = w.blksz;
    let too_big = |blocks: u64| BuildError::ImageTooBig {
        blocks,
        block_size: blksz as u32,
    };
    let order = Order::breadth_first(tree);
    let shared = Shared::new(order.nodes.iter().map(|&n| &tree.nodes[n].meta.xattrs));
    // Directory and symlink blocks go right after the file data.
    let mut planned = plan(tree, &order, &shared, w.next_block, blksz, p);
    if planned.next_block > u64::from(u32::MAX) {
        return Err(too_big(planned.next_block));
    }
    let xattr_blkaddr = planned.next_block;
    let meta_blkaddr = xattr_blkaddr + (shared.bytes.len() as u64).div_ceil(blksz);
    let meta_end = meta_blkaddr + place(&mut planned.plans, blksz) / blksz;
    if meta_end > u64::from(u32::MAX) {
        return Err(too_big(meta_end));
    }
    let plans = &planned.plans;
    let dir_tails = write_dir_blocks(tree, w, &order, plans)?;
    debug_assert_eq!(w.next_block, xattr_blkaddr);
    if !shared.bytes.is_empty() {
        w.blocks(&shared.bytes)
            .map_err(BuildError::io("writing the image"))?;
    }
    write_inodes(tree, w, plans, &dir_tails, p)?;
    debug_assert_eq!(w.next_block, meta_end);
    Ok(Placed {
        root_nid: plans[0].nid,
        inos: plans.len() as u64,
        meta_blkaddr,
        xattr_blkaddr,
        xattr_filter: planned.filter,
        compressed: planned.compressed,
    })
}

/// The order inodes are placed in: breadth first, the root first, so
/// that a directory's entries sit side by side.
struct Order {
    nodes: Vec<NodeId>,
    /// Each node's position in `nodes`.
    slot: HashMap<NodeId, usize>,
    /// Each node's parent directory's position (the first reaching it).
    parent_of: Vec<usize>,
    /// Link counts, from the entries reached.
    nlink: Vec<u32>,
}

impl Order {
    fn breadth_first(tree: &Tree) -> Order {
        let mut o = Order {
            nodes: vec![ROOT],
            slot: HashMap::from([(ROOT, 0)]),
            parent_of: vec![0],
            nlink: vec![2],
        };
        let mut i = 0;
        while i < o.nodes.len() {
            if let Body::Dir(children) = &tree.nodes[o.nodes[i]].body {
                for &c in children.values() {
                    let is_dir = matches!(tree.nodes[c].body, Body::Dir(_));
                    if is_dir {
                        o.nlink[i] += 1;
                    }
                    match o.slot.get(&c) {
                        Some(&s) => o.nlink[s] += 1,
                        None => {
                            o.slot.insert(c, o.nodes.len());
                            o.nodes.push(c);
                            o.parent_of.push(i);
                            o.nlink.push(if is_dir { 2 } else { 1 });
                        }
                    }
                }
            }
            i += 1;
        }
        o
    }
}

/// Every inode's plan, in the order, and what planning found.
struct Planned {
    plans: Vec<Plan>,
    /// The first block after the directory and symlink blocks.
    next_block: u64,
    /// Some inode's name filter excludes a name.
    filter: bool,
    compressed: bool,
}

/// Plans each inode: its size, layout, `i_u`, form and what follows it,
/// giving directory and symlink data blocks from `next_block` on.
fn plan(
    tree: &Tree,
    order: &Order,
    shared: &Shared,
    mut next_block: u64,
    blksz: u64,
    p: &Params,
) -> Planned {
    let blkszbits = blksz.trailing_zeros() as u8;
    let mut filter = false;
    let mut compressed = false;
    let mut plans = Vec::with_capacity(order.nodes.len());
    for (k, &n) in order.nodes.iter().enumerate() {
        let node = &tree.nodes[n];
        let m = &node.meta;
        let (xattrs, f) = shared.body(&m.xattrs);
        filter |= f;
        let mut plan = Plan {
            node: n,
            nid: 0,
            nlink: order.nlink[k],
            parent: order.parent_of[k],
            size: 0,
            layout: Layout::FlatPlain,
            extended: false,
            xattrs,
            i_u: 0,
            tail: 0,
            chunk_index: None,
        };
        let mut spread = |plan: &mut Plan, size: u64| {
            // Data that has no blocks yet: full blocks here, the tail
            // inline if it fits after the inode (judged at the extended
            // size, which the inode may yet need).
            let tail = size % blksz;
            let fits = tail > 0 && MAX_INODE_SIZE as u64 + plan.xattrs.len() as u64 + tail <= blksz;
            let in_blocks = if fits { size - tail } else { size };
            let blocks = in_blocks.div_ceil(blksz);
            if blocks > 0 {
                plan.i_u = next_block as u32;
                next_block += blocks;
            }
            if fits {
                plan.layout = Layout::FlatInline;
                plan.tail = tail;
            }
            plan.size = size;
        };
        match &node.body {
            Body::Dir(_) => {
                let names: Vec<&[u8]> = entries_of(tree, n, n).iter().map(|e| e.0).collect();
                spread(&mut plan, dir_size(&names, blksz));
            }
            Body::Symlink(t) => spread(&mut plan, t.len() as u64),
            Body::File(d) if d.z.is_some() => {
                plan.size = d.size;
                plan.layout = if p.zindex.compact {
                    Layout::CompressedCompact
                } else {
                    Layout::CompressedFull
                };
                plan.i_u = d.blocks as u32;
                compressed = true;
            }
            Body::File(FileData {
                size,
                device_at: Some(_),
                ..
            }) => {
                // One chunk covers the file where the format allows: its
                // bytes are one run in the tar.
                plan.size = *size;
                plan.layout = Layout::ChunkBased;
                let bits = tar_chunkbits(*size, blkszbits);
                plan.i_u = u32::from(CHUNK_FORMAT_INDEXES | u16::from(bits - blkszbits));
                plan.chunk_index = Some((CHUNK_INDEX_SIZE, size.div_ceil(1 << bits)));
            }
            Body::File(FileData {
                size,
                indexes: Some((bits, _, count)),
                ..
            }) => {
                // A merged file: chunk indexes into the layers' devices.
                plan.size = *size;
                plan.layout = Layout::ChunkBased;
                plan.i_u = u32::from(CHUNK_FORMAT_INDEXES | u16::from(bits - blkszbits));
                plan.chunk_index = Some((CHUNK_INDEX_SIZE, u64::from(*count)));
            }
            Body::File(FileData {
                size,
                chunks: Some((bits, _, count)),
                ..
            }) => {
                // A sparse file: a block map, holes as NULL_ADDR.
                plan.size = *size;
                plan.layout = Layout::ChunkBased;
                plan.i_u = u32::from(bits - blkszbits);
                plan.chunk_index = Some((BLOCK_MAP_ENTRY_SIZE, u64::from(*count)));
            }
            Body::File(d) => {
                plan.size = d.size;
                plan.i_u = d.blkaddr as u32;
                if let Some((_, len)) = d.tail {
                    plan.layout = Layout::FlatInline;
                    plan.tail = u64::from(len);
                }
            }
            Body::Device(major, minor) => plan.i_u = encode_dev(*major, *minor),
            Body::Special => {}
        }
        plan.extended = m.uid > 0xffff
            || m.gid > 0xffff
            || plan.nlink > 0xffff
            || plan.size > u64::from(u32::MAX)
            || m.mtime != p.epoch
            || m.nsec != p.nsec;
        // Indexes are 8-byte aligned after the inode and xattrs.
        let isize = if plan.extended {
            MAX_INODE_SIZE
        } else {
            INODE_COMPACT_SIZE
        };
        let end = (isize + plan.xattrs.len()) as u64;
        if plan.layout.is_compressed() {
            plan.tail = end.next_multiple_of(8) - end + zindex::len(plan.size, end, &p.zindex);
        } else if let Some((unit, count)) = plan.chunk_index {
            plan.tail = end.next_multiple_of(unit) - end + unit * count;
        }
        plans.push(plan);
    }
    Planned {
        plans,
        next_block,
        filter,
        compressed,
    }
}

/// Gives each inode its nid, packing the inodes into the metadata area;
/// returns the area's bytes.
fn place(plans: &mut [Plan], blksz: u64) -> u64 {
    let mut packer = Packer::new(blksz);
    for plan in plans {
        let isize = if plan.extended {
            MAX_INODE_SIZE
        } else {
            INODE_COMPACT_SIZE
        } as u64;
        let at = packer.place(isize + plan.xattrs.len() as u64 + plan.tail);
        plan.nid = at / INODE_COMPACT_SIZE as u64;
    }
    packer.len()
}

/// Writes directory and symlink blocks, in the order they were given.
/// Only directory tails are kept for the inodes (there are far fewer
/// directories than files); file tails are read back from the spill file
/// and symlink tails taken from the tree as each inode is written.
fn write_dir_blocks(
    tree: &Tree,
    w: &mut Writer,
    order: &Order,
    plans: &[Plan],
) -> Result<HashMap<usize, Vec<u8>>, BuildError> {
    let blksz = w.blksz;
    let wio = |e| BuildError::io("writing the image")(e);
    let mut dir_tails: HashMap<usize, Vec<u8>> = HashMap::new();
    for (k, plan) in plans.iter().enumerate() {
        let node = &tree.nodes[plan.node];
        let dir;
        let bytes: &[u8] = match &node.body {
            Body::Dir(_) => {
                let parent = order.nodes[plan.parent];
                let entries: Vec<(&[u8], u64, u8)> = entries_of(tree, plan.node, parent)
                    .into_iter()
                    .map(|(name, c)| {
                        let cp = &plans[order.slot[&c]];
                        (name, cp.nid, file_type(tree.nodes[c].meta.mode))
                    })
                    .collect();
                dir = dir_bytes(&entries, blksz);
                &dir
            }
            Body::Symlink(t) => t,
            _ => continue,
        };
        let in_blocks = bytes.len() - plan.tail as usize;
        if in_blocks > 0 {
            let at = w.blocks(&bytes[..in_blocks]).map_err(wio)?;
            debug_assert_eq!(at, u64::from(plan.i_u));
        }
        if matches!(node.body, Body::Dir(_)) && plan.tail > 0 {
            dir_tails.insert(k, bytes[in_blocks..].to_vec());
        }
    }
    Ok(dir_tails)
}

/// Writes the inodes, each with its xattrs and what follows it (inline
/// tail, chunk table or compressed indexes), by nid, streamed out a few
/// MiB at a time.
fn write_inodes(
    tree: &Tree,
    w: &mut Writer,
    plans: &[Plan],
    dir_tails: &HashMap<usize, Vec<u8>>,
    p: &Params,
) -> Result<(), BuildError> {
    let blksz = w.blksz;
    let blkszbits = blksz.trailing_zeros() as u8;
    let wio = |e| BuildError::io("writing the image")(e);
    let mut buf: Vec<u8> = Vec::new();
    let mut base = 0u64;
    let mut by_nid: Vec<usize> = (0..plans.len()).collect();
    by_nid.sort_unstable_by_key(|&k| plans[k].nid);
    for k in by_nid {
        let plan = &plans[k];
        let at = plan.nid * INODE_COMPACT_SIZE as u64 - base;
        buf.resize(at as usize, 0);
        put_inode(&mut buf, tree, plan, k as u32 + 1);
        buf.extend_from_slice(&plan.xattrs);
        match &tree.nodes[plan.node].body {
            Body::File(FileData { tail: Some(t), .. }) => {
                let tail = w
                    .tail(*t)
                    .map_err(BuildError::io("reading the spill file"))?;
                buf.extend_from_slice(&tail);
            }
            Body::Symlink(t) if plan.tail > 0 => {
                buf.extend_from_slice(&t[t.len() - plan.tail as usize..]);
            }
            Body::Dir(_) if plan.tail > 0 => buf.extend_from_slice(&dir_tails[&k]),
            Body::File(FileData {
                device_at: Some(at),
                size,
                ..
            }) => {
                // Each chunk's blocks on device 1, the tar.
                buf.resize(buf.len().next_multiple_of(8), 0);
                let bits = tar_chunkbits(*size, blkszbits);
                for k in 0..size.div_ceil(1 << bits) {
                    let blk = (at + (k << bits)) >> blkszbits;
                    let index = erofs_inode_chunk_index {
                        startblk_hi: 0.into(),
                        device_id: 1.into(),
                        startblk_lo: (blk as u32).into(),
                    };
                    buf.extend_from_slice(index.as_bytes());
                }
            }
            Body::File(FileData {
                indexes: Some((_, off, count)),
                ..
            }) => {
                let indexes = w
                    .spilled(*off, *count as usize * CHUNK_INDEX_SIZE as usize)
                    .map_err(BuildError::io("reading the spill file"))?;
                buf.resize(buf.len().next_multiple_of(CHUNK_INDEX_SIZE as usize), 0);
                buf.extend_from_slice(&indexes);
            }
            Body::File(FileData {
                chunks: Some((_, off, count)),
                ..
            }) => {
                let map = w
                    .chunk_map(*off, *count)
                    .map_err(BuildError::io("reading the spill file"))?;
                buf.resize(buf.len().next_multiple_of(BLOCK_MAP_ENTRY_SIZE as usize), 0);
                buf.extend_from_slice(&map);
            }
            Body::File(FileData {
                z: Some(ext),
                size,
                blkaddr,
                ..
            }) => {
                let ext = w
                    .extents(*ext)
                    .map_err(BuildError::io("reading the spill file"))?;
                let end = (buf.len() as u64 + base) - plan.nid * INODE_COMPACT_SIZE as u64;
                buf.resize(buf.len().next_multiple_of(8), 0);
                let idx = zindex::encode(*size, *blkaddr, &ext, end, &p.zindex);
                buf.extend_from_slice(&idx);
            }
            _ => {}
        }
        if buf.len() >= 4 << 20 {
            let cut = buf.len() as u64 / blksz * blksz;
            w.raw(&buf[..cut as usize]).map_err(wio)?;
            buf.drain(..cut as usize);
            base += cut;
        }
    }
    w.blocks(&buf).map_err(wio)?;
    Ok(())
}

fn put_inode(out: &mut Vec<u8>, tree: &Tree, plan: &Plan, ino: u32) {
    let m = &tree.nodes[plan.node].meta;
    let layout = plan.layout as u16;
    let icount = icount(plan.xattrs.len());
    if plan.extended {
        let die = erofs_inode_extended {
            i_format: (layout << 1 | I_FORMAT_EXTENDED).into(),
            i_xattr_icount: icount.into(),
            i_mode: (m.mode as u16).into(),
            i_size: plan.size.into(),
            i_u: plan.i_u.into(),
            i_ino: ino.into(),
            i_uid: m.uid.into(),
            i_gid: m.gid.into(),
            i_mtime: (m.mtime as u64).into(),
            i_mtime_nsec: m.nsec.into(),
            i_nlink: plan.nlink.into(),
            ..Default::default()
        };
        out.extend_from_slice(die.as_bytes());
    } else {
        // The mtime is the epoch's: no offset from it (`i_mtime` 0).
        let dic = erofs_inode_compact {
            i_format: (layout << 1).into(),
            i_xattr_icount: icount.into(),
            i_mode: (m.mode as u16).into(),
            i_nb: (plan.nlink as u16).into(),
            i_size: (plan.size as u32).into(),
            i_u: plan.i_u.into(),
            i_ino: ino.into(),
            i_uid: (m.uid as u16).into(),
            i_gid: (m.gid as u16).into(),
            ..Default::default()
        };
        out.extend_from_slice(dic.as_bytes());
    }
}
