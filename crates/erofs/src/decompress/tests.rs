//! Decoding real physical clusters cut from mkfs.erofs 1.9.3 images
//! (`tests/data/pclusters/*.bin`: records of `<u32 plen><u32 llen>`, the
//! cluster as stored, then the bytes it decodes to), and garbage; reading
//! and checking the configuration records.

use super::*;
use zerocopy::IntoBytes;

use crate::format::{erofs_super_block, INCOMPAT_COMPR_CFGS, MAGIC, SUPER_SIZE};

/// The configuration records of the images the clusters come from
/// (mkfs.erofs defaults at 4 KiB clusters).
fn configs() -> CompressionConfigs {
    CompressionConfigs {
        lz4: Some(Lz4Config {
            max_distance: 0xffff,
            max_pclusterblks: 1,
        }),
        lzma: Some(LzmaConfig { dict_size: 0x8000 }),
        deflate: Some(DeflateConfig { windowbits: 15 }),
        zstd: Some(ZstdConfig { windowlog: 5 }),
    }
}

fn codec() -> Codec {
    Codec {
        configs: configs(),
        lz4_zero_padding: true,
        block_size: 4096,
    }
}

struct Record {
    cluster: Vec<u8>,
    plain: Vec<u8>,
}

fn records(name: &str) -> Vec<Record> {
    let path = format!(
        "{}/tests/data/pclusters/{name}-4k.bin",
        env!("CARGO_MANIFEST_DIR")
    );
    let d = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    let mut p = 0;
    while p < d.len() {
        let word = |at: usize| u32::from_le_bytes(d[at..at + 4].try_into().unwrap()) as usize;
        let (plen, llen) = (word(p), word(p + 4));
        p += 8;
        out.push(Record {
            cluster: d[p..p + plen].to_vec(),
            plain: d[p + plen..p + plen + llen].to_vec(),
        });
        p += plen + llen;
    }
    assert!(!out.is_empty());
    out
}

fn extent(alg: Algorithm, plen: usize, llen: usize) -> ZExtent {
    ZExtent {
        la: 0,
        llen: llen as u64,
        pa: 8192,
        plen: plen as u64,
        inline: false,
        format: ZFormat::Compressed(alg),
        partial: false,
    }
}

fn decode_record(alg: Algorithm, cluster: &[u8], llen: usize, partial: bool) -> Result<Vec<u8>> {
    let mut out = vec![0u8; llen];
    decompress_into(
        &extent(alg, cluster.len(), llen),
        cluster,
        &codec(),
        &mut out,
        partial,
    )?;
    Ok(out)
}

fn decode_kind(e: &Error) -> Decode {
    match e.corruption::<Corrupt>() {
        Some(Corrupt::Decompress { problem, .. }) => problem.clone(),
        other => panic!("not a decode error: {other:?} ({e})"),
    }
}

/// Every record decodes in full, and its first 60 % decodes as a partial
/// extent (what deduplication points at).
fn real_clusters_decode(alg: Algorithm, name: &str) {
    for r in records(name) {
        let full = decode_record(alg, &r.cluster, r.plain.len(), false).unwrap();
        assert!(full == r.plain, "{alg}: full decode differs");
        let prefix = r.plain.len() * 6 / 10;
        let part = decode_record(alg, &r.cluster, prefix, true).unwrap();
        assert!(part == r.plain[..prefix], "{alg}: partial decode differs");
    }
}

/// Damage never panics: cut streams, flipped bytes and noise either fail
/// with a decode error at the cluster or (noise can be valid) produce
/// output of the extent's length.
fn garbage_is_refused(alg: Algorithm, name: &str) {
    let r = &records(name)[0];
    let llen = r.plain.len();
    let skip = r.cluster.iter().position(|&b| b != 0).unwrap();
    // A stream cut short cannot produce the whole extent.
    for cut in [1, 2, 17, (r.cluster.len() - skip) / 2] {
        let cut_cluster = &r.cluster[..r.cluster.len() - cut];
        let e = decode_record(alg, cut_cluster, llen, false).unwrap_err();
        assert_eq!(e.offset(), Some(8192), "{alg}: {e}");
        decode_kind(&e);
    }
    // A declared extent longer than the stream is refused, full or partial.
    let e = decode_record(alg, &r.cluster, llen + 100, false).unwrap_err();
    decode_kind(&e);
    let e = decode_record(alg, &r.cluster, llen + 100, true).unwrap_err();
    decode_kind(&e);
    // All zeros up to the end of the first block.
    let e = decode_record(alg, &[0u8; 4096], llen, false).unwrap_err();
    assert_eq!(decode_kind(&e), Decode::ZeroBlock { algorithm: alg });
    // Flipped bytes and noise: no panic, and an error names the extent.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..300 {
        let mut c = r.cluster.clone();
        if round % 3 == 0 {
            for b in c.iter_mut().skip(skip) {
                *b = next() as u8;
            }
        } else {
            for _ in 0..1 + round % 8 {
                let at = skip + (next() as usize) % (c.len() - skip);
                c[at] ^= 1 << (next() % 8);
            }
        }
        for partial in [false, true] {
            if let Err(e) = decode_record(alg, &c, llen, partial) {
                assert_eq!(e.offset(), Some(8192));
                decode_kind(&e);
            }
        }
    }
}

#[test]
fn lz4_clusters_decode_full_and_partial() {
    real_clusters_decode(Algorithm::Lz4, "lz4");
}

#[test]
fn lz4_garbage_is_refused() {
    garbage_is_refused(Algorithm::Lz4, "lz4");
}

#[test]
fn micro_lzma_clusters_decode_full_and_partial() {
    real_clusters_decode(Algorithm::MicroLzma, "lzma");
}

#[test]
fn micro_lzma_garbage_is_refused() {
    garbage_is_refused(Algorithm::MicroLzma, "lzma");
}

#[test]
fn micro_lzma_full_decode_must_end_with_the_extent() {
    let r = &records("lzma")[0];
    // The stream goes on past a shorter extent: only a partial decode
    // may stop there.
    let short = r.plain.len() - 1000;
    let e = decode_record(Algorithm::MicroLzma, &r.cluster, short, false).unwrap_err();
    assert!(matches!(
        decode_kind(&e),
        Decode::Invalid {
            algorithm: Algorithm::MicroLzma,
            ..
        }
    ));
    assert!(decode_record(Algorithm::MicroLzma, &r.cluster, short, true).is_ok());
    // A properties byte no LZMA stream has.
    let mut c = r.cluster.clone();
    let skip = c.iter().position(|&b| b != 0).unwrap();
    c[skip] = !230;
    let e = decode_record(Algorithm::MicroLzma, &c, r.plain.len(), false).unwrap_err();
    assert!(
        e.to_string().contains("MicroLZMA data does not decode"),
        "{e}"
    );
}

#[test]
fn deflate_clusters_decode_full_and_partial() {
    real_clusters_decode(Algorithm::Deflate, "deflate");
}

#[test]
fn deflate_garbage_is_refused() {
    garbage_is_refused(Algorithm::Deflate, "deflate");
}

#[test]
fn deflate_full_decode_must_end_with_the_extent() {
    let r = &records("deflate")[0];
    let short = r.plain.len() - 1000;
    let e = decode_record(Algorithm::Deflate, &r.cluster, short, false).unwrap_err();
    assert!(
        e.to_string().contains("DEFLATE data does not decode"),
        "{e}"
    );
    let part = decode_record(Algorithm::Deflate, &r.cluster, short, true).unwrap();
    assert!(part == r.plain[..short]);
}

#[test]
fn zstd_clusters_decode_full_and_partial() {
    real_clusters_decode(Algorithm::Zstd, "zstd");
}

#[test]
fn zstd_garbage_is_refused() {
    garbage_is_refused(Algorithm::Zstd, "zstd");
}

#[test]
fn zstd_window_above_the_configuration_is_refused() {
    let r = &records("zstd")[0];
    let skip = r.cluster.iter().position(|&b| b != 0).unwrap();
    let mut small = configs();
    small.zstd = Some(ZstdConfig { windowlog: 0 });
    let mut out = vec![0u8; r.plain.len()];
    let e = decode(Algorithm::Zstd, &small, &r.cluster[skip..], &mut out, false).unwrap_err();
    assert!(
        matches!(
            e,
            Decode::Invalid {
                algorithm: Algorithm::Zstd,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn lz4_token_walk_counts_literals_and_matches() {
    // 5 literals "abcde", a match of 4 + 2 at distance 5, then 3 literals.
    let stream = [
        0x52, b'a', b'b', b'c', b'd', b'e', 5, 0, 0x30, b'x', b'y', b'z',
    ];
    assert_eq!(lz4::decoded_len(&stream), Some(5 + 6 + 3));
    // Literal lengths of 15 and more continue in following bytes.
    let mut long = vec![0xF0, 3];
    long.extend(std::iter::repeat_n(b'q', 18));
    assert_eq!(lz4::decoded_len(&long), Some(18));
    // Tokens that promise more than the stream holds.
    assert_eq!(lz4::decoded_len(&[0x50, b'a']), None);
    assert_eq!(lz4::decoded_len(&[0xF0, 255]), None);
    let mut out = [0u8; 8];
    decode(Algorithm::Lz4, &configs(), &stream, &mut out, true).unwrap();
    assert_eq!(&out, b"abcdeabc");
}

#[test]
fn an_algorithm_without_configuration_is_refused() {
    let r = &records("lzma")[0];
    let mut c = codec();
    c.configs.lzma = None;
    let mut out = vec![0u8; r.plain.len()];
    let ext = extent(Algorithm::MicroLzma, r.cluster.len(), r.plain.len());
    let e = decompress_into(&ext, &r.cluster, &c, &mut out, false).unwrap_err();
    assert_eq!(
        decode_kind(&e),
        Decode::NoConfig {
            algorithm: Algorithm::MicroLzma
        }
    );
}

#[test]
fn zstd_frame_windows_from_the_header() {
    let magic = [0x28, 0xb5, 0x2f, 0xfd];
    // A window descriptor of exponent 7, mantissa 2: 2^17 + 2 * 2^14.
    let mut f = magic.to_vec();
    f.extend([0x00, 7 << 3 | 2]);
    assert_eq!(self::zstd::frame_window(&f), Ok((1 << 17) + 2 * (1 << 14)));
    // Single segment, no dictionary, a 2-byte content size (from 256).
    let mut f = magic.to_vec();
    f.extend([0x60, 0x00, 0x10]);
    assert_eq!(self::zstd::frame_window(&f), Ok(0x1000 + 256));
    assert!(self::zstd::frame_window(&magic).is_err());
    assert!(self::zstd::frame_window(b"not a frame").is_err());
}

// ---- the configuration records after the superblock

/// The fixed superblock of a 4 KiB-block image, features to be added.
fn minimal() -> Vec<u8> {
    fixed(&erofs_super_block {
        magic: MAGIC.into(),
        blkszbits: 12,
        ..Default::default()
    })
}

/// The fixed 128 bytes of `d`.
fn fixed(d: &erofs_super_block) -> Vec<u8> {
    d.as_bytes()[..SUPER_SIZE].to_vec()
}

/// A superblock with COMPR_CFGS listing `algs`, followed by `records`
/// (each as its payload; lengths and alignment are added here).
fn with_configs(algs: u16, records: &[&[u8]]) -> (Superblock, Vec<u8>) {
    let raw = fixed(&erofs_super_block {
        magic: MAGIC.into(),
        blkszbits: 12,
        feature_incompat: INCOMPAT_COMPR_CFGS.into(),
        u1: algs.into(),
        ..Default::default()
    });
    let sb = Superblock::parse(&raw).unwrap();
    let mut image = vec![0u8; SUPER_OFFSET as usize];
    image.extend_from_slice(&raw);
    for rec in records {
        while image.len() & 3 != 0 {
            image.push(0);
        }
        image.extend_from_slice(&(rec.len() as u16).to_le_bytes());
        image.extend_from_slice(rec);
    }
    (sb, image)
}

fn load(algs: u16, records: &[&[u8]]) -> Result<CompressionConfigs> {
    let (sb, image) = with_configs(algs, records);
    CompressionConfigs::load(&sb, |pos, buf| {
        let pos = pos as usize;
        match image.get(pos..pos + buf.len()) {
            Some(b) => {
                buf.copy_from_slice(b);
                Ok(())
            }
            None => Err(Error::corrupt(pos as u64, Corrupt::SuperblockTruncated)),
        }
    })
}

fn config_problem(e: &Error) -> (u8, ConfigProblem) {
    match e.corruption::<Corrupt>() {
        Some(Corrupt::CompressionConfig { algorithm, problem }) => (*algorithm, problem.clone()),
        other => panic!("not a config problem: {other:?} ({e})"),
    }
}

const LZ4: [u8; 14] = [0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const LZMA: [u8; 14] = [0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const DEFLATE: [u8; 6] = [15, 0, 0, 0, 0, 0];
const ZSTD: [u8; 6] = [0, 5, 0, 0, 0, 0];

#[test]
fn every_config_record_is_read() {
    let c = load(0xF, &[&LZ4, &LZMA, &DEFLATE, &ZSTD]).unwrap();
    assert_eq!(
        c.lz4,
        Some(Lz4Config {
            max_distance: 0xffff,
            max_pclusterblks: 1
        })
    );
    assert_eq!(c.lzma, Some(LzmaConfig { dict_size: 0x8000 }));
    assert_eq!(c.deflate, Some(DeflateConfig { windowbits: 15 }));
    assert_eq!(c.zstd, Some(ZstdConfig { windowlog: 5 }));
    assert_eq!(c.zstd.unwrap().window_size(), 32 << 10);
    assert_eq!(c.algorithms(), vec![0, 1, 2, 3]);
    let only_zstd = load(1 << Algorithm::Zstd.number(), &[&ZSTD]).unwrap();
    assert_eq!(only_zstd.algorithms(), vec![Algorithm::Zstd.number()]);
}

#[test]
fn config_records_are_validated_like_the_kernel() {
    let mut lzma = LZMA;
    lzma[..4].copy_from_slice(&(16u32 << 20).to_le_bytes());
    let e = load(2, &[&lzma]).unwrap_err();
    assert_eq!(e.offset(), Some(SUPER_OFFSET + SUPER_SIZE as u64));
    assert_eq!(
        config_problem(&e),
        (
            Algorithm::MicroLzma.number(),
            ConfigProblem::LzmaDictSize {
                dict_size: 16 << 20
            }
        )
    );
    assert!(
        e.to_string().contains("MicroLZMA configuration record"),
        "{e}"
    );
    lzma[..4].copy_from_slice(&2048u32.to_le_bytes());
    let e = load(2, &[&lzma]).unwrap_err();
    assert_eq!(
        config_problem(&e).1,
        ConfigProblem::LzmaDictSize { dict_size: 2048 }
    );
    let mut lzma = LZMA;
    lzma[4] = 1;
    let e = load(2, &[&lzma]).unwrap_err();
    assert_eq!(
        config_problem(&e).1,
        ConfigProblem::LzmaFormat { format: 1 }
    );
    let e = load(2, &[&LZMA[..12]]).unwrap_err();
    assert_eq!(
        config_problem(&e).1,
        ConfigProblem::Size {
            len: 12,
            expected: 14
        }
    );
    let e = load(4, &[&[16, 0, 0, 0, 0, 0]]).unwrap_err();
    assert_eq!(
        config_problem(&e),
        (
            Algorithm::Deflate.number(),
            ConfigProblem::DeflateWindowBits { windowbits: 16 }
        )
    );
    let e = load(8, &[&[0, 11, 0, 0, 0, 0]]).unwrap_err();
    assert_eq!(
        config_problem(&e),
        (
            Algorithm::Zstd.number(),
            ConfigProblem::ZstdWindowLog { windowlog: 11 }
        )
    );
    let e = load(8, &[&[1, 5, 0, 0, 0, 0]]).unwrap_err();
    assert_eq!(
        config_problem(&e).1,
        ConfigProblem::ZstdFormat { format: 1 }
    );
    let e = load(1, &[&LZ4[..10]]).unwrap_err();
    assert_eq!(
        config_problem(&e),
        (
            Algorithm::Lz4.number(),
            ConfigProblem::Size {
                len: 10,
                expected: 14
            }
        )
    );
    // The second record is found past the first's alignment.
    let e = load(0b101, &[&LZ4, &[16, 0, 0, 0, 0, 0]]).unwrap_err();
    assert_eq!(e.offset(), Some(SUPER_OFFSET + SUPER_SIZE as u64 + 16));
}

#[test]
fn an_unknown_algorithm_is_refused_by_name() {
    let e = load(1 | 1 << 4, &[&LZ4]).unwrap_err();
    assert_eq!(
        e.incompatibility::<Incompatible>(),
        Some(&Incompatible::Algorithm { algorithm: 4 })
    );
    assert!(
        e.to_string().contains("unknown algorithm 4 compression"),
        "{e}"
    );
}

#[test]
fn without_records_only_lz4_exists() {
    let sb = Superblock::parse(&minimal()).unwrap();
    let c = CompressionConfigs::load(&sb, |_, _| panic!("no records to read")).unwrap();
    assert_eq!(c.algorithms(), vec![Algorithm::Lz4.number()]);
}
