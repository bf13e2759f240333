//! A dm-verity hash area as `veritysetup format` writes it (format 1,
//! SHA-256, 4096-byte data and hash blocks): a superblock in the first
//! hash block, then the tree's levels, the one nearest the root first,
//! each hash `SHA-256(salt || block)` and each hash block zero-padded.
//! `foliofs push --dm-verity` appends it after a layer's EROFS image
//! (erofs-image-spec §3.5), so that `veritysetup verify --hash-offset`
//! and the kernel's dm-verity target take the blob as it is.
//!
//! The salt is not random, as veritysetup's is by default: the same
//! image must give the same blob and root digest (spec §8.3), so it is
//! the SHA-256 of the data it covers, and the superblock's UUID is made
//! from the salt.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

/// The data and hash block size.
pub const BLOCK: u64 = 4096;
const DIGEST: usize = 32;
/// Hashes in a hash block (4096 / 32), as a shift.
const PER_BLOCK_BITS: u32 = 7;

/// A hash area, and what a consumer needs to check data against it.
#[derive(Clone, Debug)]
pub struct Verity {
    /// The superblock block and the tree, to append at the data's end.
    pub area: Vec<u8>,
    /// The root digest.
    pub root: [u8; DIGEST],
    /// The salt the superblock holds.
    pub salt: [u8; DIGEST],
    /// Data blocks covered.
    pub data_blocks: u64,
}

/// The hash area for `data_blocks` blocks read from `data`, salted with
/// `salt`. The tree is built in memory: 1/128 of the data for the
/// lowest level and less for the rest.
pub fn build(data: &mut dyn Read, data_blocks: u64, salt: [u8; DIGEST]) -> io::Result<Verity> {
    let hash = |block: &[u8]| -> [u8; DIGEST] {
        let mut h = Sha256::new();
        h.update(salt);
        h.update(block);
        h.finalize().into()
    };
    let mut block = vec![0u8; BLOCK as usize];
    let mut hashes = Vec::with_capacity((data_blocks as usize).saturating_mul(DIGEST));
    for _ in 0..data_blocks {
        data.read_exact(&mut block)?;
        hashes.extend_from_slice(&hash(&block));
    }
    // As the kernel counts them: levels until one hash block holds all.
    let mut levels = 0u32;
    while PER_BLOCK_BITS * levels < 64
        && data_blocks.saturating_sub(1) >> (PER_BLOCK_BITS * levels) != 0
    {
        levels += 1;
    }
    let mut tree: Vec<Vec<u8>> = Vec::new();
    let root = if levels == 0 {
        // One data block: its own hash is the root.
        let mut r = [0u8; DIGEST];
        r.copy_from_slice(hashes.get(..DIGEST).unwrap_or(&[0; DIGEST]));
        r
    } else {
        let mut below = hashes;
        for _ in 0..levels {
            let per = BLOCK as usize;
            let mut level = Vec::with_capacity(below.len().div_ceil(per) * per);
            for c in below.chunks(per) {
                level.extend_from_slice(c);
                level.resize(level.len().div_ceil(per) * per, 0);
            }
            below = level.chunks(per).flat_map(hash).collect();
            tree.push(level);
        }
        let mut r = [0u8; DIGEST];
        r.copy_from_slice(&below);
        r
    };
    let mut area = superblock(data_blocks, &salt);
    for level in tree.iter().rev() {
        area.extend_from_slice(level);
    }
    Ok(Verity {
        area,
        root,
        salt,
        data_blocks,
    })
}

/// A hash area read back and checked up to its root: the hashes of the
/// data blocks, against which each block is checked as the kernel's
/// dm-verity checks it.
#[derive(Clone, Debug)]
pub struct Tree {
    salt: Vec<u8>,
    /// One hash per data block.
    leaves: Vec<u8>,
    data_blocks: u64,
}

/// The levels of a tree over `data_blocks` blocks: hash blocks per level,
/// the leaves' level first.
fn level_blocks(data_blocks: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut n = data_blocks;
    let mut levels = 0u32;
    while PER_BLOCK_BITS * levels < 64
        && data_blocks.saturating_sub(1) >> (PER_BLOCK_BITS * levels) != 0
    {
        levels += 1;
    }
    for _ in 0..levels {
        n = n.div_ceil(1 << PER_BLOCK_BITS);
        out.push(n);
    }
    out
}

impl Tree {
    /// The hash area `area` (superblock and tree, as [`build`] writes it
    /// and veritysetup reads it) of `data_blocks` blocks of data, checked
    /// from `root` down to its leaves. An area of another shape, or any
    /// hash block that does not hash to its parent's entry, is refused
    /// with what and where.
    pub fn parse(area: &[u8], data_blocks: u64, root: &[u8; DIGEST]) -> Result<Tree, String> {
        let b = BLOCK as usize;
        if area.len() < b {
            return Err(format!("{} bytes: shorter than its superblock", area.len()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(area[o..o + 4].try_into().unwrap());
        if &area[..8] != b"verity\0\0" {
            return Err("no dm-verity superblock (signature) at the hash offset".into());
        }
        if u32_at(8) != 1 || u32_at(12) != 1 {
            return Err(format!(
                "superblock version {} hash type {}: only version 1, type 1 is read",
                u32_at(8),
                u32_at(12)
            ));
        }
        let alg = &area[32..64];
        if &alg[..6] != b"sha256" || alg[6..].iter().any(|&c| c != 0) {
            return Err("its algorithm is not sha256".into());
        }
        if u64::from(u32_at(64)) != BLOCK || u64::from(u32_at(68)) != BLOCK {
            return Err(format!(
                "block sizes {} and {}: only 4096 is read",
                u32_at(64),
                u32_at(68)
            ));
        }
        let blocks = u64::from_le_bytes(area[72..80].try_into().unwrap());
        if blocks != data_blocks {
            return Err(format!(
                "its superblock covers {blocks} data blocks, the hash offset {data_blocks}"
            ));
        }
        let salt_size = usize::from(u16::from_le_bytes([area[80], area[81]]));
        if salt_size > 256 {
            return Err(format!("salt size {salt_size} is over 256"));
        }
        let salt = area[88..88 + salt_size].to_vec();
        let hash = |block: &[u8]| -> [u8; DIGEST] {
            let mut h = Sha256::new();
            h.update(&salt);
            h.update(block);
            h.finalize().into()
        };
        let levels = level_blocks(data_blocks);
        let tree_blocks: u64 = levels.iter().sum();
        let want = BLOCK * (1 + tree_blocks);
        if area.len() as u64 != want {
            return Err(format!(
                "{} bytes, where a tree of {data_blocks} blocks takes {want}",
                area.len()
            ));
        }
        if levels.is_empty() {
            // One data block: the root is its hash.
            return Ok(Tree {
                leaves: root.to_vec(),
                salt,
                data_blocks,
            });
        }
        // The levels lie root first after the superblock.
        let mut at = b;
        let mut spans = vec![(0usize, 0usize); levels.len()];
        for (k, &n) in levels.iter().enumerate().rev() {
            spans[k] = (at, at + n as usize * b);
            at += n as usize * b;
        }
        let top = spans[levels.len() - 1];
        if hash(&area[top.0..top.1]) != *root {
            return Err("its top hash block does not hash to the root digest".into());
        }
        for k in (1..levels.len()).rev() {
            let parent = &area[spans[k].0..spans[k].1];
            let (from, to) = spans[k - 1];
            for (j, block) in area[from..to].chunks(b).enumerate() {
                if hash(block)[..] != parent[j * DIGEST..(j + 1) * DIGEST] {
                    return Err(format!(
                        "hash block {j} of level {k} (at byte {} of the area) does not match its parent",
                        from + j * b
                    ));
                }
            }
        }
        let leaves = area[spans[0].0..spans[0].0 + data_blocks as usize * DIGEST].to_vec();
        Ok(Tree {
            salt,
            leaves,
            data_blocks,
        })
    }

    /// The data blocks the tree covers.
    pub fn data_blocks(&self) -> u64 {
        self.data_blocks
    }

    /// Whether data block `i` holds `block`.
    pub fn check(&self, i: u64, block: &[u8]) -> bool {
        if i >= self.data_blocks || block.len() as u64 != BLOCK {
            return false;
        }
        let mut h = Sha256::new();
        h.update(&self.salt);
        h.update(block);
        let at = i as usize * DIGEST;
        h.finalize()[..] == self.leaves[at..at + DIGEST]
    }
}

/// cryptsetup's `struct verity_sb`, in a block of its own.
fn superblock(data_blocks: u64, salt: &[u8; DIGEST]) -> Vec<u8> {
    let mut sb = Vec::with_capacity(BLOCK as usize);
    sb.extend_from_slice(b"verity\0\0");
    sb.extend_from_slice(&1u32.to_le_bytes()); // version
    sb.extend_from_slice(&1u32.to_le_bytes()); // hash_type: normal
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&Sha256::digest(salt)[..16]);
    // An RFC 9562 version 8 (vendor-defined) UUID.
    uuid[6] = (uuid[6] & 0x0f) | 0x80;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    sb.extend_from_slice(&uuid);
    let mut algorithm = [0u8; 32];
    algorithm[..6].copy_from_slice(b"sha256");
    sb.extend_from_slice(&algorithm);
    sb.extend_from_slice(&(BLOCK as u32).to_le_bytes()); // data_block_size
    sb.extend_from_slice(&(BLOCK as u32).to_le_bytes()); // hash_block_size
    sb.extend_from_slice(&data_blocks.to_le_bytes());
    sb.extend_from_slice(&(DIGEST as u16).to_le_bytes()); // salt_size
    sb.extend_from_slice(&[0u8; 6]);
    let mut s = [0u8; 256];
    s[..DIGEST].copy_from_slice(salt);
    sb.extend_from_slice(&s);
    sb.resize(BLOCK as usize, 0);
    sb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_area_is_sized_as_veritysetup_sizes_it() {
        for (blocks, tree_blocks) in [(1u64, 0u64), (2, 1), (128, 1), (129, 3), (16_385, 132)] {
            let data = vec![7u8; (blocks * BLOCK) as usize];
            let v = build(&mut &data[..], blocks, [1; 32]).unwrap();
            assert_eq!(v.area.len() as u64, BLOCK * (1 + tree_blocks), "{blocks}");
            assert_eq!(&v.area[..8], b"verity\0\0");
        }
    }

    #[test]
    fn a_built_tree_reads_back_and_checks_its_blocks() {
        for blocks in [1u64, 2, 128, 129, 16_385] {
            let data: Vec<u8> = (0..blocks * BLOCK)
                .map(|i| (i / 4096 * 31 + i) as u8)
                .collect();
            let v = build(&mut &data[..], blocks, [5; 32]).unwrap();
            let t = Tree::parse(&v.area, blocks, &v.root).unwrap();
            for i in [0, blocks / 2, blocks - 1] {
                let b = &data[(i * BLOCK) as usize..((i + 1) * BLOCK) as usize];
                assert!(t.check(i, b), "{blocks}: block {i}");
                let mut bad = b.to_vec();
                bad[100] ^= 1;
                assert!(!t.check(i, &bad), "{blocks}: damaged block {i}");
            }
            let mut root = v.root;
            root[0] ^= 1;
            match Tree::parse(&v.area, blocks, &root) {
                // One block: no tree, the root is its hash.
                Ok(t) => assert!(blocks == 1 && !t.check(0, &data[..BLOCK as usize])),
                Err(_) => assert!(blocks > 1),
            }
            if v.area.len() > BLOCK as usize {
                // A flipped byte anywhere in the tree is found.
                let mut area = v.area.clone();
                let last = area.len() - 1;
                area[last - 7] ^= 0x40;
                let e = Tree::parse(&area, blocks, &v.root).unwrap_err();
                assert!(e.contains("match") || e.contains("root"), "{e}");
            }
            assert!(Tree::parse(&v.area, blocks + 1, &v.root).is_err());
        }
    }

    #[test]
    fn the_root_of_one_hash_block_is_that_blocks_hash() {
        let data = vec![3u8; 2 * BLOCK as usize];
        let salt = [9u8; 32];
        let v = build(&mut &data[..], 2, salt).unwrap();
        let h = |b: &[u8]| -> Vec<u8> {
            let mut s = Sha256::new();
            s.update(salt);
            s.update(b);
            s.finalize().to_vec()
        };
        let leaf = h(&data[..BLOCK as usize]);
        let level = &v.area[BLOCK as usize..];
        assert_eq!(&level[..32], &leaf[..]);
        assert_eq!(&level[32..64], &leaf[..]);
        assert!(level[64..].iter().all(|&b| b == 0));
        assert_eq!(v.root.to_vec(), h(level));
    }
}
