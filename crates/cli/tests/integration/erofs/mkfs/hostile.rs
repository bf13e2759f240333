//! A hostile tar corpus made here, byte by byte: truncations, paths out of
//! the root, long names, huge sizes, lying PAX records, NULs in names,
//! sparse maps that claim the earth, symlink loops, garbage, dangling
//! links, deep nesting. Every bad tar fails with one line naming the entry
//! and leaves no image (nor a temporary file) behind, within bounded time
//! and memory; the deep one builds and walks.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use super::super::walk::walk_mounted;
use super::{comparable, kernel_walk, mkfs};
use crate::common;

/// A ustar header for `name` of type `kind` with a 12-byte size field.
fn header(name: &[u8], kind: u8, size: [u8; 12], link: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(&size);
    h[136..148].copy_from_slice(b"00000001750\0");
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn octal(n: u64) -> [u8; 12] {
    let mut f = [0u8; 12];
    f[..11].copy_from_slice(format!("{n:011o}").as_bytes());
    f
}

/// A whole entry: header and data padded to 512.
fn entry(name: &[u8], kind: u8, data: &[u8]) -> Vec<u8> {
    let mut e = header(name, kind, octal(data.len() as u64), b"");
    e.extend_from_slice(data);
    e.resize(e.len().next_multiple_of(512), 0);
    e
}

fn file(name: &[u8], data: &[u8]) -> Vec<u8> {
    entry(name, b'0', data)
}

fn pax(records: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, v) in records {
        let rest = k.len() + v.len() + 3;
        let mut len = rest + 1;
        while format!("{len}").len() + rest != len {
            len += 1;
        }
        body.extend_from_slice(format!("{len} {k}=").as_bytes());
        body.extend_from_slice(v);
        body.push(b'\n');
    }
    entry(b"PaxHeaders/x", b'x', &body)
}

fn end(mut t: Vec<u8>) -> Vec<u8> {
    t.extend_from_slice(&[0; 1024]);
    t
}

fn checksum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h[..512].iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// A device header with the major and minor fields given as they are
/// stored (octal text).
fn device(name: &[u8], major: &[u8; 8], minor: &[u8; 8]) -> Vec<u8> {
    let mut h = header(name, b'3', octal(0), b"");
    h[329..337].copy_from_slice(major);
    h[337..345].copy_from_slice(minor);
    checksum(&mut h);
    h
}

/// A GNU base-256 number in a 12-byte field.
fn base256(n: u64) -> [u8; 12] {
    let mut f = [0u8; 12];
    f[4..].copy_from_slice(&n.to_be_bytes());
    f[0] = 0x80;
    f
}

/// An old GNU sparse entry: the header holds `frags[0]`, and each further
/// fragment gets an extension block of its own; `data` is what is stored.
fn old_gnu_sparse(name: &[u8], real: u64, frags: &[(u64, u64)], data: &[u8]) -> Vec<u8> {
    let mut h = header(name, b'S', octal(data.len() as u64), b"");
    h[257..265].copy_from_slice(b"ustar  \0");
    h[386..398].copy_from_slice(&base256(frags[0].0));
    h[398..410].copy_from_slice(&base256(frags[0].1));
    h[482] = u8::from(frags.len() > 1);
    h[483..495].copy_from_slice(&base256(real));
    checksum(&mut h);
    for (i, &(off, len)) in frags.iter().enumerate().skip(1) {
        let mut ext = vec![0u8; 512];
        ext[..12].copy_from_slice(&base256(off));
        ext[12..24].copy_from_slice(&base256(len));
        ext[504] = u8::from(i + 1 < frags.len());
        h.extend_from_slice(&ext);
    }
    h.extend_from_slice(data);
    h.resize(h.len().next_multiple_of(512), 0);
    h
}

/// A PAX 1.0 sparse map's text in the whole block it takes.
fn sparse_map(text: &[u8]) -> Vec<u8> {
    let mut v = text.to_vec();
    v.resize(512, 0);
    v
}

/// A PAX header whose body is given raw, lies and all.
fn pax_raw(body: &[u8]) -> Vec<u8> {
    entry(b"PaxHeaders/x", b'x', body)
}

/// The address space a build may map: a tar that made it hold what
/// it claims (a GiB of data, 10^12 sparse fragments) fails under this.
const MEMORY_LIMIT: u64 = 512 << 20;

/// `foliofs mkfs erofs -q ARGS` under [`MEMORY_LIMIT`] of address space,
/// killed (and the test failed) past a minute.
fn mkfs_bounded(args: &[&OsStr]) -> Output {
    let mut cmd = Command::new(common::bin());
    cmd.args(["mkfs", "erofs", "-q"]).args(args);
    common::limit_address_space(&mut cmd, MEMORY_LIMIT);
    common::run_timeout(&mut cmd, Duration::from_secs(60))
}

/// Bad tars and what each error must contain (besides "foliofs: "): the
/// entry's name, and for the newer cases why.
fn corpus() -> Vec<(&'static str, Vec<u8>, &'static [&'static str])> {
    let two = end([file(b"first", b"1"), file(b"second", &[2; 3000])].concat());
    let mut huge256 = [0u8; 12];
    huge256[0] = 0x80;
    huge256[4] = 0x40;
    let mut link = header(b"hard", b'1', octal(0), b"nowhere");
    link.extend_from_slice(&[0; 1024]);
    vec![
        (
            "cut in a header",
            two[..512 + 512 + 100].to_vec(),
            &["first"],
        ),
        (
            "cut in the data",
            two[..512 * 3 + 1000].to_vec(),
            &["second"],
        ),
        ("cut before the end", two[..512 * 3].to_vec(), &["second"]),
        ("dot-dot", end(file(b"../escape", b"x")), &["../escape"]),
        (
            "absolute dot-dot",
            end(file(b"/a/../../x", b"x")),
            &["absolute"],
        ),
        (
            "relative dot-dot",
            end(file(b"a/../../x", b"x")),
            &["climbs out"],
        ),
        (
            "GNU long name",
            end([
                entry(b"././@LongLink", b'L', &[&[b'n'; 300][..], b"\0"].concat()),
                file(b"short", b"x"),
            ]
            .concat()),
            &["300 bytes"],
        ),
        (
            "PAX long name",
            end([
                pax(&[("path", format!("d/{}", "p".repeat(256)).as_bytes())]),
                file(b"short", b"x"),
            ]
            .concat()),
            &["256 bytes"],
        ),
        (
            "huge octal size",
            end(header(b"huge", b'0', octal(0o77777777777), b"")),
            &["huge"],
        ),
        (
            "huge base-256 size",
            end(header(b"huger", b'0', huge256, b"")),
            &["huger"],
        ),
        (
            "PAX size past the stream",
            end([
                pax(&[("size", b"1152921504606846976")]),
                file(b"paxhuge", b"x"),
            ]
            .concat()),
            &["paxhuge"],
        ),
        ("garbage", end(vec![0x5a; 512]), &["the first header"]),
        ("dangling hard link", link, &["nowhere"]),
        (
            "xattr with no prefix",
            end([
                pax(&[("SCHILY.xattr.system.odd", b"v")]),
                file(b"odd", b"x"),
            ]
            .concat()),
            &["system.odd"],
        ),
        (
            "file as a parent",
            end([file(b"a", b"x"), file(b"a/b", b"y")].concat()),
            &["a/b"],
        ),
        ("unknown type", end(entry(b"what", b'Q', b"")), &["what"]),
        (
            "PAX size of 1 GiB, 4 MiB there",
            [
                pax(&[("size", b"1073741824")]),
                header(b"gig", b'0', octal(0), b""),
                vec![7; 4 << 20],
            ]
            .concat(),
            &["gig", "1073741824 bytes of data expected"],
        ),
        (
            "PAX length too long",
            end([file(b"before", b"1"), pax_raw(b"99 path=a\n")].concat()),
            &["after entry \"before\"", "length 99 does not fit"],
        ),
        (
            "PAX length too short",
            end([file(b"before", b"1"), pax_raw(b"5 path=abc\n")].concat()),
            &["after entry \"before\"", "does not end at a newline"],
        ),
        (
            "PAX length not digits",
            end([file(b"before", b"1"), pax_raw(b"1x path=a\n")].concat()),
            &["after entry \"before\"", "not a decimal number"],
        ),
        (
            "PAX length negative",
            end([file(b"before", b"1"), pax_raw(b"-10 path=a\n")].concat()),
            &["after entry \"before\"", "not a decimal number"],
        ),
        (
            "PAX path with a NUL",
            end([
                file(b"before", b"1"),
                pax(&[("path", b"a\0b")]),
                file(b"nul", b"x"),
            ]
            .concat()),
            &["after entry \"before\"", "a NUL byte in path"],
        ),
        (
            "GNU long name with a NUL",
            end([
                entry(b"././@LongLink", b'L', b"abc\0def\0"),
                file(b"short", b"x"),
            ]
            .concat()),
            &["\"abc\"", "a NUL byte inside a GNU long name"],
        ),
        (
            "bad checksum after a good entry",
            {
                let mut bad = header(b"bad", b'0', octal(1), b"");
                bad[148] ^= 1;
                end([file(b"good", b"1"), bad].concat())
            },
            &["after entry \"good\"", "checksum"],
        ),
        (
            "component over 255 bytes",
            end([
                pax(&[("path", format!("a/{}/b", "c".repeat(300)).as_bytes())]),
                file(b"short", b"x"),
            ]
            .concat()),
            &["a/ccc", "a name of 300 bytes"],
        ),
        (
            "absolute path",
            end(file(b"/etc/passwd", b"x")),
            &["/etc/passwd", "absolute"],
        ),
        (
            "hard link out of the root",
            end(header(b"hl", b'1', octal(0), b"../../etc/shadow")),
            &["\"hl\"", "hard link target", "climbs out"],
        ),
        (
            "path over 4095 bytes",
            end([
                pax(&[("path", format!("{}f", "d/".repeat(2100)).as_bytes())]),
                file(b"short", b"x"),
            ]
            .concat()),
            &["d/d/d/", "a path of 4201 bytes"],
        ),
        (
            "symlink loop among the parents",
            end([
                header(b"a", b'2', octal(0), b"b"),
                header(b"b", b'2', octal(0), b"a"),
                file(b"a/x", b"x"),
            ]
            .concat()),
            &["\"a/x\"", "symlinks followed", "loop"],
        ),
        (
            "old GNU sparse fragments past the real size",
            end(old_gnu_sparse(
                b"osparse",
                5000,
                &[(0, 5), (1 << 40, 5), (1 << 62, 5)],
                &[b's'; 15],
            )),
            &["\"osparse\"", "past the file's size 5000"],
        ),
        (
            "PAX 1.0 sparse map of 10^12 fragments",
            end([
                pax(&[
                    ("GNU.sparse.major", b"1"),
                    ("GNU.sparse.minor", b"0"),
                    ("GNU.sparse.name", b"sp"),
                    ("GNU.sparse.realsize", b"100"),
                ]),
                // The map takes whole blocks of the data.
                entry(b"GNUSparseFile.0/sp", b'0', &sparse_map(b"1000000000000\n")),
            ]
            .concat()),
            &["\"sp\"", "1000000000000 fragments"],
        ),
        (
            "PAX 1.0 sparse map at the limit, not there",
            end([
                pax(&[
                    ("GNU.sparse.major", b"1"),
                    ("GNU.sparse.minor", b"0"),
                    ("GNU.sparse.name", b"sp"),
                    ("GNU.sparse.realsize", b"100"),
                ]),
                // A block of the map, then the data ends: the map's
                // room (64 MiB at the limit) is the most it may take.
                entry(
                    b"GNUSparseFile.0/sp",
                    b'0',
                    &[&b"4194304\n"[..], &b"0\n1\n".repeat(126)].concat(),
                ),
            ]
            .concat()),
            &["\"sp\"", "runs past the entry's data"],
        ),
        (
            "hard link to a directory",
            end([entry(b"d/", b'5', b""), header(b"h", b'1', octal(0), b"d")].concat()),
            &["\"h\"", "may not name a directory"],
        ),
        (
            "device major past 12 bits",
            end(device(b"cmaj", b"0010000\0", b"0000000\0")),
            &["\"cmaj\"", "device 4096:0"],
        ),
        (
            "device minor past 20 bits",
            end(device(b"cmin", b"0000001\0", b"4000000\0")),
            &["\"cmin\"", "device 1:1048576"],
        ),
        (
            "a file naming the root",
            end(file(b"./", b"x")),
            &["\"./\"", "the root must be a directory"],
        ),
    ]
}

#[test]
fn hostile_tars_fail_in_one_line_naming_the_entry_and_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    for (what, tar, expect) in corpus() {
        let dir = tmp.path().join(what.replace([' ', '/'], "-"));
        fs::create_dir(&dir).unwrap();
        let t = dir.join("t.tar");
        fs::write(&t, &tar).unwrap();
        let img = dir.join("img");
        let out = mkfs_bounded(&[t.as_os_str(), img.as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: built an image");
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
        assert!(
            err.starts_with("foliofs: ") && expect.iter().all(|e| err.contains(e)),
            "{what}: expected {expect:?} in: {err}"
        );
        if std::env::var_os("FOLIOFS_SHOW_HOSTILE").is_some() {
            eprintln!("{what}: {}", err.trim_end());
        }
        let left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "t.tar")
            .collect();
        assert!(left.is_empty(), "{what}: left {left:?} behind");
    }
}

/// 400 directories deep, with a file at the bottom and PAX names: builds,
/// and the kernel walks it as the same tree extracted by tar.
#[test]
fn deep_nesting_builds_and_walks() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let deep = "d/".repeat(400);
    let tar = end([
        pax(&[("path", format!("{deep}bottom").as_bytes())]),
        file(b"bottom", b"at the bottom\n"),
    ]
    .concat());
    let t = tmp.path().join("t.tar");
    fs::write(&t, &tar).unwrap();
    let img = tmp.path().join("img");
    let out = mkfs(&["-T0".as_ref(), t.as_os_str(), img.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let x = tmp.path().join("x");
    fs::create_dir(&x).unwrap();
    let r = common::run_timeout(
        std::process::Command::new("tar")
            .arg("-C")
            .arg(&x)
            .arg("-xf")
            .arg(&t),
        std::time::Duration::from_secs(60),
    );
    assert!(
        r.status.success(),
        "tar x: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    // Parents no entry declared are 0755 root:root.
    fs::set_permissions(&x, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut want = comparable(walk_mounted(&x), Some(0));
    for (p, n) in want.iter_mut() {
        if n.kind == "dir" {
            n.mode = 0o040755;
            n.xattrs.clear();
        }
        let _ = p;
    }
    let got = comparable(kernel_walk(&img), None);
    super::super::walk::assert_same("the kernel's walk", &want, &got);
    assert!(got.contains_key(Path::new(&format!("{deep}bottom"))));
}

/// Options foliofs does not build are refused in one line, not ignored.
#[test]
fn options_not_built_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"x").unwrap();
    let img = tmp.path().join("img");
    for (args, expect) in [
        (&["-z", "lzma"][..], "-z lzma"),
        (&["-z", "lz4:zstd"][..], "-z lz4:zstd"),
        (&["-z", "zstd,level=23"][..], "-z zstd,level=23"),
        (&["-z", "zstd,dictsize=3000"][..], "-z zstd,dictsize=3000"),
        (
            &["-z", "zstd,dictsize=2097152"][..],
            "-z zstd,dictsize=2097152",
        ),
        (&["-z", "lz4hc,dictsize=4096"][..], "-z lz4hc,dictsize=4096"),
        (&["-z", "zstd,window=9"][..], "-z zstd,window=9"),
        (&["-z", "lz4,3"][..], "-z lz4,3"),
        (&["-z", "lz4hc,13"][..], "-z lz4hc,13"),
        (&["-z", "lz4", "-C", "6000"][..], "-C 6000"),
        (&["-C", "8192"][..], "-C 8192"),
        (&["--tar=i"][..], "--tar=i"),
        (&["-b", "8192"][..], "-b 8192"),
        (&["-E", "fragments"][..], "-E fragments"),
        (&["-U", "nonsense"][..], "-U \"nonsense\""),
        (&["-L", "a label far too long"][..], "label"),
        (&["--aufs"][..], "--aufs"),
    ] {
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        all.push(src.as_os_str());
        super::refused(&all, &img, expect);
    }
}

/// `-U clear` writes zeros, `-U UUID` that UUID, `-U random` a new
/// version 4 UUID each time, and nothing else of the image changes.
#[test]
fn uuids_are_clear_given_or_random() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"x").unwrap();
    let uuid_of = |arg: &str, name: &str| {
        let img = tmp.path().join(name);
        super::build(&["-T0", "-U", arg], &src, &img);
        let bytes = fs::read(&img).unwrap();
        let u: [u8; 16] = bytes[1024 + 0x30..1024 + 0x40].try_into().unwrap();
        (u, bytes)
    };
    let (clear, a) = uuid_of("clear", "a");
    assert_eq!(clear, [0; 16]);
    let (given, _) = uuid_of("01234567-89ab-cdef-0123-456789abcdef", "b");
    assert_eq!(given[..4], [0x01, 0x23, 0x45, 0x67]);
    let (r1, c) = uuid_of("random", "c");
    let (r2, _) = uuid_of("random", "d");
    assert_ne!(r1, r2);
    for r in [r1, r2] {
        assert_eq!(r[6] >> 4, 4, "version 4");
        assert_eq!(r[8] >> 6, 0b10, "RFC 9562 variant");
    }
    // Only the UUID and the superblock's checksum differ.
    let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != c[i]).collect();
    assert!(
        differ
            .iter()
            .all(|&i| (1024 + 4..1024 + 8).contains(&i) || (1024 + 0x30..1024 + 0x40).contains(&i)),
        "{differ:?}"
    );
}
