//! Extent records on hand-made images: every record size, stored,
//! compressed, unmapped, partial, interlaced and fragment extents, and the
//! hostile tables a reader must refuse.

use foliofs_vfs::Error;
use rand::{Rng, SeedableRng};

use crate::format::{
    ADVISE_EXTENTS, ADVISE_FRAGMENT_PCLUSTER, ADVISE_INTERLACED_PCLUSTER, INCOMPAT_48BIT,
    INCOMPAT_FRAGMENTS, INCOMPAT_LZ4_0PADDING, PLEN_FMT_SHIFT, PLEN_PARTIAL,
};
use crate::testimage::{TestImage, BS, COMPRESSED_FULL, DATA_BLK, FLAT_PLAIN};
use crate::{Corrupt, Erofs};

/// The file's nid.
const F: u64 = 8;
/// The packed inode's nid.
const PACKED: u64 = 16;
const STORED: u32 = 0;
const LZ4: u32 = 1 << PLEN_FMT_SHIFT;

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

fn text(len: usize) -> Vec<u8> {
    b"extent records in a hand-made image "
        .iter()
        .cycle()
        .take(len)
        .copied()
        .collect()
}

/// An image whose root lists `f` (nid [`F`]), a compressed file of `size`
/// bytes whose map header has `advise` (EXTENTS and the record size added
/// here), `clusterbits` and, for 16/32-byte records, `count`; `records`
/// are written where they belong. Returns the image and the records'
/// position.
fn image(
    extra: u32,
    size: u32,
    recsz: u64,
    advise: u16,
    clusterbits: u8,
    count: u64,
    records: &[u8],
) -> (TestImage, u64) {
    let mut t = TestImage::new(INCOMPAT_LZ4_0PADDING | INCOMPAT_48BIT | extra, 0);
    t.root(&[("f", F, 1)]);
    t.inode(F, COMPRESSED_FULL, 0o100644, size, 1);
    let h = TestImage::inode_pos(F) + 32;
    let code = recsz.trailing_zeros() as u16 - 2;
    let advise = advise | ADVISE_EXTENTS | code << 1;
    let mut header = [0u8; 8];
    header[4..6].copy_from_slice(&advise.to_le_bytes());
    if recsz >= 16 {
        header[..4].copy_from_slice(&(count as u32).to_le_bytes());
        header[6..8].copy_from_slice(&((count >> 32) as u16).to_le_bytes());
    } else {
        header[7] = clusterbits;
    }
    t.put(h, &header);
    let at = (h + 8).div_ceil(recsz) * recsz;
    t.put(at, records);
    (t, at)
}

fn rec4(plen: u32) -> Vec<u8> {
    plen.to_le_bytes().to_vec()
}

fn rec8(plen: u32, pa: u32) -> Vec<u8> {
    let mut v = plen.to_le_bytes().to_vec();
    v.extend(pa.to_le_bytes());
    v
}

fn rec16(plen: u32, pa: u64, la: u32) -> Vec<u8> {
    let mut v = plen.to_le_bytes().to_vec();
    v.extend(pa.to_le_bytes());
    v.extend(la.to_le_bytes());
    v
}

fn read_all(fs: &Erofs, nid: u64) -> foliofs_vfs::Result<Vec<u8>> {
    let inode = fs.inode(nid)?;
    fs.read_to_vec(&inode, 0, inode.size as usize)
}

fn corruption(e: &Error) -> Corrupt {
    e.corruption::<Corrupt>()
        .unwrap_or_else(|| panic!("not corruption: {e}"))
        .clone()
}

#[test]
fn four_byte_records_sum_their_lengths_from_a_byte_address() {
    let a = random(4096, 1);
    let c = text(4096);
    let c_lz4 = lz4_flex::block::compress(&c);
    let d = random(3996, 2);
    let base = DATA_BLK * BS + 7;
    let mut recs = base.to_le_bytes().to_vec();
    recs.extend(rec4(STORED | 4096));
    recs.extend(rec4(0));
    recs.extend(rec4(LZ4 | c_lz4.len() as u32));
    recs.extend(rec4(STORED | 3996));
    let size = 3 * 4096 + 3996;
    let (mut t, _) = image(0, size, 4, 0, 0, 0, &recs);
    t.put(base, &a);
    t.put(base + 4096, &c_lz4);
    t.put(base + 4096 + c_lz4.len() as u64, &d);
    let (_d, fs) = t.open();
    let mut want = a.clone();
    want.extend(vec![0u8; 4096]);
    want.extend(&c);
    want.extend(&d);
    assert_eq!(read_all(&fs, F).unwrap(), want);
    // A read from the middle, across the unmapped extent.
    let inode = fs.inode(F).unwrap();
    assert_eq!(
        fs.read_to_vec(&inode, 4000, 9000).unwrap(),
        want[4000..13000]
    );
    let ext = fs.extents(&inode).unwrap();
    let phys: Vec<_> = ext
        .iter()
        .map(|e| (e.logical, e.length, e.physical, e.compressed))
        .collect();
    assert_eq!(
        phys,
        [
            (0, 4096, Some((0, base)), false),
            (4096, 4096, None, false),
            (8192, 4096, Some((0, base + 4096)), true),
            (
                12288,
                3996,
                Some((0, base + 4096 + c_lz4.len() as u64)),
                false
            ),
        ]
    );
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().errors);
}

#[test]
fn sixteen_byte_records_map_from_their_own_starts() {
    let x = random(500, 3);
    let y = random(300, 4);
    let (px, py) = (DATA_BLK * BS + 1, DATA_BLK * BS + 3000);
    let mut recs = rec16(STORED | 500, px, 100);
    recs.extend(rec16(0, 0, 600));
    recs.extend(rec16(STORED | 300, py, 1000));
    let (mut t, _) = image(0, 1300, 16, 0, 0, 3, &recs);
    t.put(px, &x);
    t.put(py, &y);
    let (_d, fs) = t.open();
    let mut want = vec![0u8; 100];
    want.extend(&x);
    want.extend(vec![0u8; 400]);
    want.extend(&y);
    assert_eq!(read_all(&fs, F).unwrap(), want);
    let lengths: Vec<_> = fs
        .extents(&fs.inode(F).unwrap())
        .unwrap()
        .iter()
        .map(|e| (e.logical, e.length))
        .collect();
    assert_eq!(lengths, [(0, 100), (100, 500), (600, 400), (1000, 300)]);
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().errors);
}

#[test]
fn records_out_of_order_are_corrupt() {
    let mut recs = rec16(STORED | 500, DATA_BLK * BS, 100);
    recs.extend(rec16(STORED | 500, DATA_BLK * BS, 600));
    recs.extend(rec16(STORED | 100, DATA_BLK * BS, 50));
    let (t, at) = image(0, 1300, 16, 0, 0, 3, &recs);
    let (_d, fs) = t.open();
    let r = fs.fsck();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].error.offset(), Some(at + 32));
    assert_eq!(
        corruption(&r.errors[0].error),
        Corrupt::ExtentOrder {
            nid: F,
            index: 2,
            lstart: 50
        }
    );
}

#[test]
fn a_record_past_the_end_of_the_file_is_corrupt() {
    let mut recs = rec16(STORED | 500, DATA_BLK * BS, 0);
    recs.extend(rec16(STORED | 500, DATA_BLK * BS, 2000));
    let (t, at) = image(0, 1300, 16, 0, 0, 2, &recs);
    let (_d, fs) = t.open();
    let e = read_all(&fs, F).unwrap_err();
    assert_eq!(e.offset(), Some(at + 16));
    assert_eq!(
        corruption(&e),
        Corrupt::ExtentPastEnd {
            nid: F,
            lstart: 2000,
            size: 1300
        }
    );
}

#[test]
fn a_record_table_past_the_image_is_corrupt() {
    for (recsz, count) in [(16, (1 << 47) - 1), (32, 1 << 30), (8, 0), (4, 0)] {
        // (Bit 63 of the header would make it a whole-file fragment.)
        // Short records count one per cluster: a size that needs more
        // than the image holds.
        let size = if recsz <= 8 { u32::MAX } else { 100 };
        let (t, _) = image(0, size, recsz, 0, 0, count, &[]);
        let (_d, fs) = t.open();
        let e = read_all(&fs, F).unwrap_err();
        assert!(
            matches!(
                corruption(&e),
                Corrupt::ExtentRecordsOutOfImage { nid: F, .. }
            ),
            "{recsz}: {e}"
        );
        assert!(!fs.fsck().is_clean());
    }
}

#[test]
fn the_last_extent_is_the_fragment_tail() {
    let a = random(4096, 5);
    let p = random(1000, 6);
    let recs = [rec8(STORED | 4096, (DATA_BLK * BS) as u32), rec8(200, 0)].concat();
    let (mut t, at) = image(
        INCOMPAT_FRAGMENTS,
        4096 + 500,
        8,
        ADVISE_FRAGMENT_PCLUSTER,
        0,
        0,
        &recs,
    );
    t.put(DATA_BLK * BS, &a);
    t.inode(PACKED, FLAT_PLAIN, 0o100644, 1000, (DATA_BLK + 2) as u32);
    t.put((DATA_BLK + 2) * BS, &p);
    t.sb(0x60, &PACKED.to_le_bytes());
    let (_d, fs) = t.open();
    let mut want = a.clone();
    want.extend(&p[200..700]);
    assert_eq!(read_all(&fs, F).unwrap(), want);
    let ext = fs.extents(&fs.inode(F).unwrap()).unwrap();
    assert_eq!(ext[1].fragment, Some(200));
    assert!(fs.fsck().is_clean(), "{:?}", fs.fsck().errors);

    // The offset moved so the tail runs past the packed inode.
    t.put(at + 8, &800u32.to_le_bytes());
    let (_d, fs) = t.open();
    let e = read_all(&fs, F).unwrap_err();
    assert_eq!(
        corruption(&e),
        Corrupt::FragmentOutOfPacked {
            nid: F,
            offset: 800,
            len: 500,
            packed_size: 1000
        }
    );
    let r = fs.fsck();
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert_eq!(r.errors[0].path.as_deref(), Some("/f"));
}

#[test]
fn a_partial_record_keeps_a_prefix_of_its_stream() {
    let data = text(8000);
    let z = lz4_flex::block::compress(&data);
    let pa = DATA_BLK * BS + 5;
    let (mut t, at) = image(
        0,
        5000,
        16,
        0,
        0,
        1,
        &rec16(LZ4 | PLEN_PARTIAL | z.len() as u32, pa, 0),
    );
    t.put(pa, &z);
    let (_d, fs) = t.open();
    assert_eq!(read_all(&fs, F).unwrap(), data[..5000]);
    // Without the flag the stream must end with the extent.
    t.put(at, &(LZ4 | z.len() as u32).to_le_bytes());
    let (_d, fs) = t.open();
    assert!(matches!(
        corruption(&read_all(&fs, F).unwrap_err()),
        Corrupt::Decompress { la: 0, .. }
    ));
}

#[test]
fn interlaced_needs_whole_blocks() {
    let x = random(100, 7);
    let block = random(4096, 8);
    let (px, pb) = (DATA_BLK * BS + 9, (DATA_BLK + 1) * BS);
    let recs = [rec16(STORED | 100, px, 0), rec16(STORED | 4096, pb, 100)].concat();
    let (mut t, _) = image(0, 4196, 16, ADVISE_INTERLACED_PCLUSTER, 0, 2, &recs);
    t.put(px, &x);
    t.put(pb, &block);
    let (_d, fs) = t.open();
    // The block-aligned cluster is rotated by the extent's offset in its
    // block; the unaligned one is stored as is.
    let mut want = x.clone();
    want.extend(&block[100..]);
    want.extend(&block[..100]);
    assert_eq!(read_all(&fs, F).unwrap(), want);
}

#[test]
fn an_unlisted_or_unknown_algorithm_is_refused() {
    let pa = DATA_BLK * BS;
    // Zstd (format 4) is not listed without configuration records.
    let (t, _) = image(0, 100, 16, 0, 0, 1, &rec16(4 << PLEN_FMT_SHIFT | 50, pa, 0));
    let (_d, fs) = t.open();
    assert_eq!(
        corruption(&read_all(&fs, F).unwrap_err()),
        Corrupt::UnlistedAlgorithm {
            nid: F,
            algorithm: 3
        }
    );
    let (t, _) = image(0, 100, 16, 0, 0, 1, &rec16(9 << PLEN_FMT_SHIFT | 50, pa, 0));
    let (_d, fs) = t.open();
    let e = read_all(&fs, F).unwrap_err();
    assert!(e.incompatibility::<crate::Incompatible>().is_some(), "{e}");
}
