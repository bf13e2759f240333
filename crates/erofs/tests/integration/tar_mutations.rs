//! A deterministic, stable-toolchain cousin of the `tar_read` fuzz target:
//! thousands of damaged variants of tars in every layout (bits flipped,
//! bytes and fields set to what parsers trip on, PAX lengths changed,
//! names made hostile, blocks duplicated, swapped, dropped or cut), each
//! read entry by entry and built into an image. None may panic or run
//! long, and every image that gets built must pass the full checker.
//! Inputs `scripts/fuzz-tar` finds go in `REGRESSIONS` below.
//!
//! `FOLIOFS_TAR_MUTATIONS=N` runs N variants instead of the default.

use std::io::{self, Read};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use foliofs_block::OpenOptions;
use foliofs_erofs::mkfs::tar::{header, Reader};
use foliofs_erofs::mkfs::{Builder, Options};
use foliofs_erofs::Erofs;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Inputs that panicked or ran long, found by `scripts/fuzz-tar` or by
/// reading the code, minimised, as (name, bytes); each is read and built
/// with every combination of options, in bounded time.
const REGRESSIONS: &[(&str, &[u8])] = &[
    // A regular file whose path is empty, so names the root: the builder
    // took that for its own bug and panicked (`Tree::insert`).
    (
        "file-at-root",
        include_bytes!("../data/tar-fuzz/file-at-root.tar"),
    ),
    // The same through a PAX path of ".".
    (
        "file-at-root-pax",
        include_bytes!("../data/tar-fuzz/file-at-root-pax.tar"),
    ),
    // A PAX 0.1 sparse file of 2^50 bytes holding 5: its holes were
    // read as zeros, minutes of memset for one tar block (`Expand::skip`
    // passes them now).
    (
        "sparse-hole-2p50",
        include_bytes!("../data/tar-fuzz/sparse-hole-2p50.tar"),
    ),
];

/// Variants run by default: about 5 s in a release build on two idle
/// cores, 20 s on two busy ones.
const DEFAULT_CASES: usize = 50_000;

/// Longest a variant may take (read and build), in any build profile.
const BOUND: Duration = Duration::from_secs(10);

const USTAR: &[u8; 8] = b"ustar\x0000";
const GNU: &[u8; 8] = b"ustar  \0";
const V7: &[u8; 8] = &[0; 8];

fn checksum(b: &mut [u8]) {
    b[148..156].fill(b' ');
    let sum: u32 = b[..512].iter().map(|&c| u32::from(c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

fn octal(b: &mut [u8], r: std::ops::Range<usize>, v: u64) {
    let w = r.len() - 1;
    b[r.clone()].copy_from_slice(format!("{v:0w$o}\0").as_bytes());
}

/// A header block; `f` sets whatever else it needs before the checksum.
fn hdr(
    name: &[u8],
    typ: u8,
    size: u64,
    magic: &[u8; 8],
    f: impl FnOnce(&mut [u8; 512]),
) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0001750\0");
    b[116..124].copy_from_slice(b"0001750\0");
    octal(&mut b, header::SIZE, size);
    b[136..148].copy_from_slice(b"14500000000\0");
    b[156] = typ;
    b[257..265].copy_from_slice(magic);
    f(&mut b);
    checksum(&mut b);
    b
}

/// One PAX record, its length counting itself.
fn rec(k: &str, v: &[u8]) -> Vec<u8> {
    let body = [k.as_bytes(), b"=", v, b"\n"].concat();
    let mut n = body.len() + 2;
    while n.to_string().len() + 1 + body.len() != n {
        n = n.to_string().len() + 1 + body.len();
    }
    [n.to_string().as_bytes(), b" ", &body].concat()
}

/// A tar being written: headers and padded data.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn put(&mut self, h: [u8; 512], data: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&h);
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().next_multiple_of(512), 0);
        self
    }

    fn file(&mut self, name: &str, data: &[u8], magic: &[u8; 8]) -> &mut Self {
        self.put(
            hdr(name.as_bytes(), b'0', data.len() as u64, magic, |_| {}),
            data,
        )
    }

    fn pax(&mut self, typ: u8, records: &[Vec<u8>]) -> &mut Self {
        let body = records.concat();
        self.put(
            hdr(b"PaxHeaders/x", typ, body.len() as u64, USTAR, |_| {}),
            &body,
        )
    }

    fn end(&mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0; 1024]);
        std::mem::take(&mut self.0)
    }
}

fn link(name: &str, typ: u8, target: &str, magic: &[u8; 8]) -> [u8; 512] {
    hdr(name.as_bytes(), typ, 0, magic, |b| {
        b[header::LINKNAME][..target.len()].copy_from_slice(target.as_bytes());
    })
}

/// Seeds written here byte by byte, one per layout, together holding every
/// kind of entry and meta header the reader knows.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();

    let mut t = Tar::default();
    t.put(hdr(b"d/", b'5', 0, USTAR, |_| {}), b"");
    t.file("d/f", &[b'x'; 700], USTAR);
    t.put(link("d/s", b'2', "f", USTAR), b"");
    t.put(link("d/h", b'1', "d/f", USTAR), b"");
    t.put(
        hdr(b"c", b'3', 0, USTAR, |b| {
            octal(b, header::DEVMAJOR, 1);
            octal(b, header::DEVMINOR, 3);
        }),
        b"",
    );
    t.put(hdr(b"p", b'6', 0, USTAR, |_| {}), b"");
    t.put(
        hdr(b"n", b'0', 3, USTAR, |b| {
            b[header::PREFIX][..7].copy_from_slice(b"pre/fix");
        }),
        b"abc",
    );
    t.file("d/.wh.gone", b"", USTAR);
    t.file("d/sub/.wh..wh..opq", b"", USTAR);
    out.push(("ustar", t.end()));

    let long = "long/".repeat(30) + "name";
    let mut t = Tar::default();
    t.pax(b'g', &[rec("comment", b"global")]);
    t.pax(
        b'x',
        &[
            rec("path", long.as_bytes()),
            rec("mtime", b"1700000000.123456789"),
            rec("uid", b"4294967294"),
            rec("SCHILY.xattr.user.cap", b"\x01\x00\n20 path=smuggled\n"),
            rec("LIBARCHIVE.xattr.user.b64", b"aGVsbG8="),
            rec(
                "SCHILY.acl.access",
                b"user::rw-,user:1000:r--,group::r--,mask::r--,other::r--",
            ),
        ],
    );
    t.file("short", b"pax data", USTAR);
    t.pax(b'x', &[rec("linkpath", long.as_bytes())]);
    t.put(link("sym", b'2', "", USTAR), b"");
    t.pax(b'x', &[rec("size", b"5")]);
    t.file("sized", b"12345", USTAR);
    out.push(("pax", t.end()));

    let mut t = Tar::default();
    let name = format!("{long}\0");
    t.put(
        hdr(b"././@LongLink", b'L', name.len() as u64, GNU, |_| {}),
        name.as_bytes(),
    );
    t.file("cut", b"gnu long name", GNU);
    t.put(
        hdr(b"././@LongLink", b'K', name.len() as u64, GNU, |_| {}),
        name.as_bytes(),
    );
    t.put(link("gsym", b'2', "cut", GNU), b"");
    // Old GNU sparse: four fragments in the header, one in an extension.
    let frags = [(0u64, 5u64), (1000, 5), (2000, 5), (3000, 5), (4000, 5)];
    t.0.extend_from_slice(&hdr(b"osparse", b'S', 25, GNU, |b| {
        for (i, &(off, len)) in frags[..4].iter().enumerate() {
            let at = header::GNU_SPARSE.start + i * 24;
            octal(b, at..at + 12, off);
            octal(b, at + 12..at + 24, len);
        }
        b[header::GNU_IS_EXTENDED] = 1;
        octal(b, header::GNU_REALSIZE, 5000);
    }));
    let mut ext = [0u8; 512];
    octal(&mut ext, 0..12, frags[4].0);
    octal(&mut ext, 12..24, frags[4].1);
    t.0.extend_from_slice(&ext);
    t.0.extend_from_slice(&[b's'; 25]);
    t.0.resize(t.0.len().next_multiple_of(512), 0);
    // Base-256 size and uid.
    t.put(
        hdr(b"b256", b'0', 0, GNU, |b| {
            b[header::SIZE].fill(0);
            b[header::SIZE.start] = 0x80;
            b[header::SIZE.end - 1] = 4;
            b[header::UID].copy_from_slice(&[0x80, 0, 0, 0, 0, 0x01, 0x11, 0x70]);
        }),
        b"b256",
    );
    out.push(("gnu", t.end()));

    let mut t = Tar::default();
    t.pax(
        b'x',
        &[
            rec("GNU.sparse.major", b"1"),
            rec("GNU.sparse.minor", b"0"),
            rec("GNU.sparse.name", b"sp10"),
            rec("GNU.sparse.realsize", b"9000"),
        ],
    );
    let mut map = b"3\n0\n5\n2000\n5\n8995\n5\n".to_vec();
    map.resize(512, 0);
    map.extend_from_slice(&[b'1'; 15]);
    t.put(
        hdr(
            b"GNUSparseFile.0/sp10",
            b'0',
            map.len() as u64,
            USTAR,
            |_| {},
        ),
        &map,
    );
    t.pax(
        b'x',
        &[
            rec("GNU.sparse.major", b"0"),
            rec("GNU.sparse.minor", b"1"),
            rec("GNU.sparse.name", b"sp01"),
            rec("GNU.sparse.size", b"5000"),
            rec("GNU.sparse.numblocks", b"2"),
            rec("GNU.sparse.map", b"0,5,4000,5"),
        ],
    );
    t.file("GNUSparseFile.0/sp01", b"0123456789", USTAR);
    t.pax(
        b'x',
        &[
            rec("GNU.sparse.size", b"100"),
            rec("GNU.sparse.numblocks", b"2"),
            rec("GNU.sparse.offset", b"0"),
            rec("GNU.sparse.numbytes", b"5"),
            rec("GNU.sparse.offset", b"50"),
            rec("GNU.sparse.numbytes", b"7"),
        ],
    );
    t.file("sp00", b"abcdefghijkl", USTAR);
    out.push(("pax-sparse", t.end()));

    let mut t = Tar::default();
    t.file("v7/file", b"seventh edition", V7);
    t.put(hdr(b"v7/dir/", 0, 0, V7, |_| {}), b"");
    t.put(link("v7/ln", b'1', "v7/file", V7), b"");
    out.push(("v7", t.end()));
    out
}

/// Tars GNU tar writes of a small tree, when it is installed (its mtimes
/// and owners fixed, so that the variants are the same every run).
fn gnu_tar_seeds(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    if Command::new("tar").arg("--version").output().is_err() {
        eprintln!("skip: GNU tar seeds: needs tar");
        return Vec::new();
    }
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("a"), b"hello\n").unwrap();
    std::fs::write(src.join("d").join("n".repeat(120)), b"long\n").unwrap();
    std::fs::hard_link(src.join("a"), src.join("d/hl")).unwrap();
    std::os::unix::fs::symlink("../a", src.join("d/sym")).unwrap();
    let f = std::fs::File::create(src.join("sparse")).unwrap();
    f.set_len(40960).unwrap();
    use std::os::unix::fs::FileExt;
    for i in [0u64, 2, 4, 6, 8] {
        f.write_all_at(b"frag", i * 4096).unwrap();
    }
    drop(f);
    let mut out = Vec::new();
    let pax = "--pax-option=delete=atime,delete=ctime";
    for (name, args) in [
        ("tar-gnu", &["--format=gnu", "--sparse"][..]),
        (
            "tar-posix-0.1",
            &["--format=posix", "--sparse", "--sparse-version=0.1", pax],
        ),
        (
            "tar-posix-1.0",
            &["--format=posix", "--sparse", "--sparse-version=1.0", pax],
        ),
    ] {
        let o = Command::new("tar")
            .args(args)
            .args(["-b1", "--sort=name", "--mtime=@1700000000", "--owner=0"])
            .args(["--group=0", "--numeric-owner"])
            .arg("-cf")
            .arg("-")
            .arg("-C")
            .arg(&src)
            .arg(".")
            .output()
            .unwrap();
        if o.status.success() {
            out.push((name, o.stdout));
        } else {
            eprintln!("skip: {name}: {}", String::from_utf8_lossy(&o.stderr));
        }
    }
    out
}

/// Where a seed's headers and PAX record lengths are, for mutations that
/// aim at them.
struct Seed {
    name: &'static str,
    bytes: Vec<u8>,
    headers: Vec<usize>,
    lengths: Vec<std::ops::Range<usize>>,
}

impl Seed {
    fn new(name: &'static str, bytes: Vec<u8>) -> Seed {
        let mut headers = Vec::new();
        let mut lengths = Vec::new();
        let mut at = 0;
        while at + 512 <= bytes.len() {
            let b: &[u8; 512] = bytes[at..at + 512].try_into().unwrap();
            let Some(_) = header::format(b) else {
                at += 512;
                continue;
            };
            headers.push(at);
            let size = header::number(&b[header::SIZE]).unwrap_or(0).max(0) as usize;
            let body = at + 512;
            if matches!(b[header::TYPEFLAG], b'x' | b'g') {
                let mut r = body;
                while r < body + size {
                    let sp = bytes[r..].iter().position(|&c| c == b' ').unwrap();
                    lengths.push(r..r + sp);
                    let n: usize = std::str::from_utf8(&bytes[r..r + sp])
                        .unwrap()
                        .parse()
                        .unwrap();
                    r += n;
                }
            }
            // Data blocks are skipped (headers are not looked for inside
            // them); an old GNU sparse header's extension blocks read as
            // data here, which does no harm.
            at = body + size.next_multiple_of(512);
        }
        Seed {
            name,
            bytes,
            headers,
            lengths,
        }
    }
}

/// Values parsers trip on, for a single byte.
const BYTES: &[u8] = b"\x80\xff\n 0123456789\0/.-+=x";

/// Values for a numeric field (cut or NUL-padded to the field's width).
const NUMBERS: &[&[u8]] = &[
    b"",
    b"0",
    b"7",
    b"77777777777777777777",
    b"-1",
    b" 12 ",
    b"8",
    b"\x80\0\0\0\0\0\0\0\0\0\x10\0",
    b"\x80\0\0\0\0\0\0\0\0\0\0\0\x7f",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\xbf\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    b"0000010000",
    b"0100000000000",
];

const NAMES: &[&[u8]] = &[
    b"",
    b".",
    b"./",
    b"..",
    b"../x",
    b"/abs",
    b"a/../../b",
    b"a//b/./c",
    b"d",
    b"d/f/x",
    b"d/s/x",
    b"sym/x",
    b"a\xffb",
    b"d/.wh.f",
    b".wh.",
    b".wh..wh..opq",
];

const TYPES: &[u8] = b"0125634xgLKSDV7\0A";

/// The numeric fields of a header, by range.
const FIELDS: &[std::ops::Range<usize>] = &[
    header::MODE,
    header::UID,
    header::GID,
    header::SIZE,
    header::MTIME,
    header::DEVMAJOR,
    header::DEVMINOR,
    header::GNU_REALSIZE,
    386..398,
    398..410,
    410..422,
];

fn set_field(b: &mut [u8], r: std::ops::Range<usize>, v: &[u8]) {
    let n = v.len().min(r.len());
    b[r.clone()].fill(0);
    b[r.start..r.start + n].copy_from_slice(&v[..n]);
}

/// One damaged variant of `s`.
fn mutate(rng: &mut StdRng, s: &Seed) -> Vec<u8> {
    let mut b = s.bytes.clone();
    for _ in 0..rng.gen_range(1..=3) {
        if b.is_empty() {
            break;
        }
        let blocks = b.len() / 512;
        let hdr_at = s.headers[rng.gen_range(0..s.headers.len())];
        let in_hdr = hdr_at + 512 <= b.len();
        match rng.gen_range(0..13) {
            0 => {
                let at = rng.gen_range(0..b.len());
                b[at] ^= 1 << rng.gen_range(0..8);
            }
            1 => {
                let at = rng.gen_range(0..b.len());
                b[at] = BYTES[rng.gen_range(0..BYTES.len())];
            }
            2 if in_hdr => {
                let at = hdr_at + rng.gen_range(0..512);
                b[at] = BYTES[rng.gen_range(0..BYTES.len())];
            }
            3 if in_hdr => {
                let f = FIELDS[rng.gen_range(0..FIELDS.len())].clone();
                let v = NUMBERS[rng.gen_range(0..NUMBERS.len())];
                set_field(&mut b[hdr_at..], f, v);
            }
            4 if !s.lengths.is_empty() => {
                let r = s.lengths[rng.gen_range(0..s.lengths.len())].clone();
                if r.end > b.len() {
                    continue;
                }
                let old: usize = std::str::from_utf8(&b[r.clone()])
                    .ok()
                    .and_then(|d| d.parse().ok())
                    .unwrap_or(0);
                let new = match rng.gen_range(0..6) {
                    0 => (old + 1).to_string(),
                    1 => old.saturating_sub(1).to_string(),
                    2 => (old + rng.gen_range(2..600)).to_string(),
                    3 => "-5".into(),
                    4 => "x9".into(),
                    _ => rng.gen_range(0..100).to_string(),
                };
                // Same width where it fits, so that the rest stays put;
                // otherwise the body shifts, as a lying writer's would.
                let new = format!("{new:0>w$}", w = r.len());
                b.splice(r, new.bytes());
            }
            5 => b.truncate(rng.gen_range(0..b.len())),
            6 if blocks > 0 => b.truncate(rng.gen_range(0..blocks) * 512),
            7 if blocks > 0 => {
                let (i, j) = (rng.gen_range(0..blocks), rng.gen_range(0..=blocks));
                let copy = b[i * 512..i * 512 + 512].to_vec();
                b.splice(j * 512..j * 512, copy);
            }
            8 if blocks > 1 => {
                let (i, j) = (rng.gen_range(0..blocks), rng.gen_range(0..blocks));
                for k in 0..512 {
                    b.swap(i * 512 + k, j * 512 + k);
                }
            }
            9 if blocks > 0 => {
                let i = rng.gen_range(0..blocks);
                b.drain(i * 512..i * 512 + 512);
            }
            10 if in_hdr => b[hdr_at + header::TYPEFLAG] = TYPES[rng.gen_range(0..TYPES.len())],
            11 if in_hdr => {
                let n = NAMES[rng.gen_range(0..NAMES.len())];
                let field = if rng.gen() {
                    header::NAME
                } else {
                    header::LINKNAME
                };
                set_field(&mut b[hdr_at..], field, n);
            }
            _ if in_hdr => {
                // A name over 255 bytes in a component, or one of 100
                // filling the field with no NUL.
                let n = if rng.gen() {
                    vec![b'n'; 100]
                } else {
                    [b"d/".as_slice(), &[b'z'; 98]].concat()
                };
                set_field(&mut b[hdr_at..], header::NAME, &n);
            }
            _ => {}
        }
    }
    // Most header damage would end at the checksum: make it right again
    // most of the time, so that the damage reaches what lies past it.
    if rng.gen_range(0..4) != 0 {
        for (i, blk) in b.chunks_exact_mut(512).enumerate() {
            if s.headers.contains(&(i * 512)) || &blk[257..262] == b"ustar" {
                checksum(blk);
            }
        }
    }
    b
}

/// The reader over every entry; returns how many it read.
fn read_all(t: &[u8]) -> usize {
    let mut r = Reader::new(t);
    let mut n = 0;
    while n < 10_000 {
        match r.next_entry() {
            Ok(Some(e)) => {
                n += 1;
                if let Ok(got) = io::copy(&mut r.data(), &mut io::sink()) {
                    assert!(
                        got <= e.stored,
                        "{got} bytes read of {} stored: {e:?}",
                        e.stored
                    );
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    n
}

/// Builds `t` with options picked by `mode` (bit 0: AUFS whiteouts, bit
/// 1: an index image); an image built is checked clean, and a build that
/// fails must leave none.
fn build(dir: &Path, t: &[u8], mode: usize, what: &str) -> Result<(), String> {
    let image = dir.join("image");
    let tar_path = dir.join("tar");
    let opts = Options {
        aufs: mode & 1 != 0,
        tar_index: mode & 2 != 0,
        blkszbits: if mode & 2 != 0 { 9 } else { 12 },
        workers: 1,
        ..Options::default()
    };
    let devices = if opts.tar_index {
        std::fs::write(&tar_path, t).unwrap();
        vec![tar_path]
    } else {
        Vec::new()
    };
    let src: Box<dyn Read> = Box::new(io::Cursor::new(t.to_vec()));
    if let Err(e) = Builder::build_tar(src, &image, opts) {
        assert!(!image.exists(), "{what}: a failed build left an image");
        return Err(e.to_string());
    }
    let fs = Erofs::open(&image, &OpenOptions::default(), &devices)
        .unwrap_or_else(|e| panic!("{what}: the image built does not open: {e}"));
    let report = fs.fsck();
    assert!(
        report.is_clean(),
        "{what}: the image built is not clean: {report:?}"
    );
    drop(fs);
    std::fs::remove_file(&image).unwrap();
    Ok(())
}

fn scratch() -> tempfile::TempDir {
    // Thousands of images: tmpfs when there is one.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

#[test]
fn damaged_tars_never_panic_hang_or_build_a_corrupt_image() {
    let work = scratch();
    let mut all: Vec<Seed> = seeds()
        .into_iter()
        .chain(gnu_tar_seeds(work.path()))
        .map(|(n, b)| Seed::new(n, b))
        .collect();
    all.retain(|s| !s.headers.is_empty());
    for s in &all {
        // Undamaged, each seed reads whole and builds (an index image
        // refuses sparse files, so only a full one is asked for).
        assert!(read_all(&s.bytes) > 0, "{}", s.name);
        for mode in [0, 1] {
            if let Err(e) = build(work.path(), &s.bytes, mode, s.name) {
                panic!("seed {} does not build: {e}", s.name);
            }
        }
    }
    let cases = std::env::var("FOLIOFS_TAR_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let mut rng = StdRng::seed_from_u64(0x7a12_f00d_5eed_0001);
    let started = Instant::now();
    let (mut built, mut entries, mut slowest) = (0usize, 0usize, Duration::ZERO);
    for i in 0..cases {
        let s = &all[i % all.len()];
        let t = mutate(&mut rng, s);
        let what = format!("variant {i} of {}", s.name);
        let t0 = Instant::now();
        entries += read_all(&t);
        built += usize::from(build(work.path(), &t, (i / all.len()) % 4, &what).is_ok());
        let took = t0.elapsed();
        assert!(took < BOUND, "{what} took {took:?}");
        slowest = slowest.max(took);
    }
    eprintln!(
        "{cases} variants in {:?}: {built} built, {entries} entries read, slowest {slowest:?}",
        started.elapsed()
    );
    // Most damage leaves a tar that still builds, so the builder really runs.
    assert!(built * 4 > cases, "only {built} of {cases} variants built");
    for (name, bytes) in REGRESSIONS {
        for mode in 0..4 {
            let t0 = Instant::now();
            read_all(bytes);
            let _ = build(work.path(), bytes, mode, name);
            assert!(t0.elapsed() < BOUND, "{name} took {:?}", t0.elapsed());
        }
    }
}
