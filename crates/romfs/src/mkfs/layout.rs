//! Placing headers and data in the image, in file order.

use super::*;

/// One header to write, in file order.
pub(super) struct Slot {
    pub(super) offset: u64,
    /// `next` with type and exec bits.
    pub(super) next: u32,
    pub(super) bits: u32,
    pub(super) spec: u32,
    pub(super) size: u32,
    pub(super) name: Vec<u8>,
    pub(super) data: Data,
}

pub(super) enum Data {
    None,
    File(usize),
    Bytes(Vec<u8>),
}

pub(super) fn meta_size(name_len: usize) -> u64 {
    (HEADER_SIZE + name_len as u64 + 1 + 15) & !15
}

/// The low four bits of `next`: type and exec bit.
pub(super) fn type_bits(ty: EntryType, exec: bool) -> u32 {
    ty.bits() | if exec { 8 } else { 0 }
}

pub(super) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Where everything goes: the headers in file order, the root header's
/// offset (the superblock's size), and the image's size before and after
/// padding.
pub(super) struct Placed {
    pub(super) slots: Vec<Slot>,
    pub(super) root_off: u64,
    pub(super) end: u64,
    pub(super) padded: u64,
}

/// Lays out the tree under `nodes[root]` after a superblock naming a
/// volume of `volume_len` bytes; an image past 4 GiB is an error naming
/// the source tree `src`.
pub(super) fn lay_out(
    nodes: &mut [Node],
    root: usize,
    volume_len: usize,
    src: &Path,
) -> Result<Placed, MkfsError> {
    let root_off = meta_size(volume_len);
    let mut lay = Layout {
        nodes,
        slots: Vec::new(),
        pos: root_off + meta_size(1),
    };
    lay.nodes[root].offset = root_off;
    let root_slot = lay.slot(
        root_off,
        type_bits(EntryType::Directory, lay.nodes[root].exec),
        root_off as u32,
        0,
        b".",
        Data::None,
    );
    lay.dir_list(root, root_off, root_off, Some(root_slot));
    let end = lay.pos;
    let padded = align_up(end, IMAGE_PAD);
    if padded > MAX_IMAGE {
        return Err(MkfsError::ImageTooBig {
            path: src.to_owned(),
            size: padded,
        });
    }
    Ok(Placed {
        slots: lay.slots,
        root_off,
        end,
        padded,
    })
}

pub(super) struct Layout<'a> {
    pub(super) nodes: &'a mut [Node],
    pub(super) slots: Vec<Slot>,
    pub(super) pos: u64,
}

impl Layout<'_> {
    /// Places a header for `name` at the next position meeting `align`
    /// (for the data when `data_aligned`, else for the header itself).
    pub(super) fn place(
        &mut self,
        name: &[u8],
        align: u64,
        data_aligned: bool,
        data_len: u64,
    ) -> u64 {
        let meta = meta_size(name.len());
        let at = if align <= 16 {
            self.pos
        } else if data_aligned {
            align_up(self.pos + meta, align) - meta
        } else {
            align_up(self.pos, align)
        };
        self.pos = at + meta + align_up(data_len, 16);
        at
    }

    pub(super) fn slot(
        &mut self,
        offset: u64,
        bits: u32,
        spec: u32,
        size: u32,
        name: &[u8],
        data: Data,
    ) -> usize {
        self.slots.push(Slot {
            offset,
            next: 0,
            bits,
            spec,
            size,
            name: name.to_vec(),
            data,
        });
        self.slots.len() - 1
    }

    /// Lays out the entry list of directory `dir` (header at `dir_off`),
    /// whose parent's header is at `parent_off`. For the root, `first` is its
    /// own slot: the root header doubles as its "." entry.
    pub(super) fn dir_list(
        &mut self,
        dir: usize,
        dir_off: u64,
        parent_off: u64,
        first: Option<usize>,
    ) -> u64 {
        let children = match &self.nodes[dir].kind {
            Kind::Dir(c) => c.clone(),
            _ => unreachable!("only directories have lists"),
        };
        let mut prev = first;
        let mut head = dir_off;
        let mut link = |l: &mut Self, prev: &mut Option<usize>, off: u64, slot: usize| {
            match *prev {
                Some(p) => l.slots[p].next = off as u32,
                None => head = off,
            }
            *prev = Some(slot);
        };
        if first.is_none() {
            let at = self.place(b".", 16, false, 0);
            let s = self.slot(
                at,
                type_bits(EntryType::HardLink, false),
                dir_off as u32,
                0,
                b".",
                Data::None,
            );
            link(self, &mut prev, at, s);
        }
        let at = self.place(b"..", 16, false, 0);
        let s = self.slot(
            at,
            type_bits(EntryType::HardLink, false),
            parent_off as u32,
            0,
            b"..",
            Data::None,
        );
        link(self, &mut prev, at, s);
        for c in children {
            let (ty, spec, size, data, data_len, data_aligned) = match &self.nodes[c].kind {
                Kind::Dir(_) => (EntryType::Directory, 0, 0, Data::None, 0, false),
                Kind::File { size } => (
                    EntryType::Regular,
                    0,
                    *size as u32,
                    Data::File(c),
                    *size,
                    true,
                ),
                Kind::Symlink(t) => (
                    EntryType::Symlink,
                    0,
                    t.len() as u32,
                    Data::Bytes(t.clone()),
                    t.len() as u64,
                    false,
                ),
                Kind::Device { ty, spec } => (*ty, *spec, 0, Data::None, 0, false),
                Kind::Special(ty) => (*ty, 0, 0, Data::None, 0, false),
                Kind::Link(target) => (
                    EntryType::HardLink,
                    self.nodes[*target].offset as u32,
                    0,
                    Data::None,
                    0,
                    false,
                ),
            };
            let name = self.nodes[c].name.clone();
            let exec =
                self.nodes[c].exec && matches!(ty, EntryType::Directory | EntryType::Regular);
            let at = self.place(&name, self.nodes[c].align, data_aligned, data_len);
            self.nodes[c].offset = at;
            let s = self.slot(at, type_bits(ty, exec), spec, size, &name, data);
            link(self, &mut prev, at, s);
            if ty == EntryType::Directory {
                let list = self.dir_list(c, at, dir_off, None);
                self.slots[s].spec = list as u32;
            }
        }
        head
    }
}
