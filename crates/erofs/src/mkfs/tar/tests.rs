//! The reader on tars written byte by byte here, so each field and each
//! hostile case is exactly what the test says.

use super::*;

/// A header block with the fields given, the checksum filled in.
pub(crate) fn block(name: &[u8], typ: u8, size: u64, magic: &[u8; 8]) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0001750\0");
    b[116..124].copy_from_slice(b"0001750\0");
    b[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    b[136..148].copy_from_slice(b"14500000000\0");
    b[156] = typ;
    b[257..265].copy_from_slice(magic);
    checksum(&mut b);
    b
}

pub(crate) const USTAR: &[u8; 8] = b"ustar\x0000";
pub(crate) const GNU: &[u8; 8] = b"ustar  \0";

pub(crate) fn checksum(b: &mut [u8; 512]) {
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// One PAX record.
pub(crate) fn rec(k: &[u8], v: &[u8]) -> Vec<u8> {
    let body = [k, b"=", v, b"\n"].concat();
    let mut n = body.len() + 2;
    loop {
        let total = n.to_string().len() + 1 + body.len();
        if total == n {
            break;
        }
        n = total;
    }
    [n.to_string().as_bytes(), b" ", &body].concat()
}

/// A tar of entries (header, data), data padded, two zero blocks after.
pub(crate) fn tar(entries: &[(&[u8; 512], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (h, d) in entries {
        out.extend_from_slice(&h[..]);
        out.extend_from_slice(d);
        out.resize(out.len().next_multiple_of(512), 0);
    }
    out.extend_from_slice(&[0; 1024]);
    out
}

fn all(t: &[u8]) -> Result<Vec<(Entry, Vec<u8>)>, TarError> {
    let mut r = Reader::new(t);
    let mut out = Vec::new();
    while let Some(e) = r.next_entry()? {
        let mut d = Vec::new();
        r.data().read_to_end(&mut d).unwrap();
        out.push((e, d));
    }
    Ok(out)
}

#[test]
fn pax_values_with_newlines_and_no_smuggled_records() {
    let cap = b"\x01\x00\x00\x02\x0a\x20\x00\x00\x0a22 linkpath=/etc/evil\n";
    let body = [
        rec(b"SCHILY.xattr.security.capability", cap),
        rec(b"path", b"bin/ping"),
        rec(b"mtime", b"-86400.25"),
        rec(b"uid", b"4294967294"),
        rec(b"SCHILY.fflags", b"uchg"),
    ]
    .concat();
    let x = block(b"PaxHeaders/x", b'x', body.len() as u64, USTAR);
    let f = block(b"short", b'0', 3, USTAR);
    let got = all(&tar(&[(&x, &body), (&f, b"abc")])).unwrap();
    assert_eq!(got.len(), 1);
    let (e, d) = &got[0];
    assert_eq!(e.path, b"bin/ping");
    assert!(e.link.is_empty());
    assert_eq!(e.xattrs[&b"security.capability"[..]], cap);
    assert_eq!((e.mtime, e.nsec), (-86401, 750_000_000));
    assert_eq!(e.uid, 4294967294);
    assert_eq!(d, b"abc");
}

#[test]
fn pax_applies_to_the_file_after_a_gnu_long_name() {
    let body = rec(b"size", b"5");
    let x = block(b"x", b'x', body.len() as u64, USTAR);
    let name = [b"n".repeat(300), vec![0]].concat();
    let l = block(b"././@LongLink", b'L', name.len() as u64, GNU);
    let f = block(b"trunc", b'0', 0, GNU);
    let got = all(&tar(&[(&x, &body), (&l, &name), (&f, b"hello")])).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.path, b"n".repeat(300));
    assert_eq!(got[0].1, b"hello");
}

#[test]
fn global_headers_are_read_and_skipped() {
    let body = rec(b"comment", b"made here");
    let g = block(b"pax_global_header", b'g', body.len() as u64, USTAR);
    let f = block(b"a", b'0', 0, USTAR);
    let got = all(&tar(&[(&g, &body), (&f, b"")])).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0.path, b"a");
}

#[test]
fn hostile_headers_are_refused() {
    // A bad checksum.
    let mut f = block(b"a", b'0', 0, USTAR);
    f[0] = b'b';
    assert!(all(&tar(&[(&f, b"")]))
        .unwrap_err()
        .why
        .contains("checksum"));
    // A PAX header of a gigabyte, whose data is not even there.
    let x = block(b"x", b'x', 1 << 30, USTAR);
    let e = all(&tar(&[(&x, b"")])).unwrap_err();
    assert!(e.why.contains("at most 1048576"), "{}", e.why);
    // Lengths that lie.
    let body = b"99 path=a\n".to_vec();
    let x = block(b"x", b'x', body.len() as u64, USTAR);
    let f = block(b"a", b'0', 0, USTAR);
    assert!(all(&tar(&[(&x, &body), (&f, b"")]))
        .unwrap_err()
        .why
        .contains("PAX header"));
    // A size past the end of the stream.
    let f = block(b"a", b'0', 4096, USTAR);
    let mut t = f.to_vec();
    t.extend_from_slice(&[7; 100]);
    assert!(all(&t).unwrap_err().why.contains("ends inside"));
    // A NUL inside a long name.
    let name = b"a\0b\0".to_vec();
    let l = block(b"././@LongLink", b'L', name.len() as u64, GNU);
    let f = block(b"x", b'0', 0, GNU);
    assert!(all(&tar(&[(&l, &name), (&f, b"")]))
        .unwrap_err()
        .why
        .contains("NUL"));
    // A zero block, then garbage.
    let mut t = vec![0u8; 512];
    t.extend_from_slice(&block(b"a", b'0', 0, USTAR));
    assert!(all(&t).is_err());
    // A meta header with no entry after it.
    let body = rec(b"path", b"a");
    let x = block(b"x", b'x', body.len() as u64, USTAR);
    assert!(all(&tar(&[(&x, &body)])).is_err());
    // A truncated header.
    assert!(all(&[1u8; 100])
        .unwrap_err()
        .why
        .contains("inside a header"));
}

#[test]
fn base_256_sizes_past_8_gib_and_ids() {
    let mut f = block(b"big", b'0', 0, GNU);
    f[124..136].fill(0);
    f[124] = 0x80;
    f[131] = 0x03; // 3 << 32 = 12 GiB
    f[108..116].copy_from_slice(&[0x80, 0, 0, 0, 0, 0x20, 0, 0]);
    checksum(&mut f);
    let mut r = Reader::new(&f[..]);
    let e = r.next_entry().unwrap().unwrap();
    assert_eq!(e.size, 3 << 32);
    assert_eq!(e.uid, 0x20_0000);
}

#[test]
fn old_gnu_sparse_with_an_extension_block() {
    let mut h = block(b"sp", b'S', 4, GNU);
    let put = |b: &mut [u8], v: u64| b.copy_from_slice(format!("{v:011o}\0").as_bytes());
    // Four fragments in the header, one in an extension block.
    for i in 0..4 {
        let at = 386 + i * 24;
        put(&mut h[at..at + 12], i as u64 * 1000);
        put(&mut h[at + 12..at + 24], if i < 3 { 1 } else { 0 });
    }
    h[482] = 1;
    put(&mut h[483..495], 10_000);
    checksum(&mut h);
    let mut ext = [0u8; 512];
    put(&mut ext[..12], 9_999);
    put(&mut ext[12..24], 1);
    let mut t = h.to_vec();
    t.extend_from_slice(&ext);
    t.extend_from_slice(b"abcd");
    t.resize(t.len().next_multiple_of(512) + 1024, 0);
    let got = all(&t).unwrap();
    let (e, d) = &got[0];
    assert_eq!(e.size, 10_000);
    assert_eq!(
        e.sparse.as_deref(),
        Some(&[(0, 1), (1000, 1), (2000, 1), (3000, 0), (9999, 1)][..])
    );
    assert_eq!(d, b"abcd");
}

#[test]
fn pax_sparse_1_0_reads_the_map_from_the_data() {
    let body = [
        rec(b"GNU.sparse.major", b"1"),
        rec(b"GNU.sparse.minor", b"0"),
        rec(b"GNU.sparse.name", b"dir/file"),
        rec(b"GNU.sparse.realsize", b"8192"),
    ]
    .concat();
    let mut data = b"2\n0\n3\n8190\n2\n".to_vec();
    data.resize(512, 0);
    data.extend_from_slice(b"xyzuv");
    let x = block(b"x", b'x', body.len() as u64, USTAR);
    let f = block(b"./GNUSparseFile.1/file", b'0', data.len() as u64, USTAR);
    let got = all(&tar(&[(&x, &body), (&f, &data)])).unwrap();
    let (e, d) = &got[0];
    assert_eq!(e.path, b"dir/file");
    assert_eq!(e.size, 8192);
    assert_eq!(e.stored, 5);
    assert_eq!(e.sparse.as_deref(), Some(&[(0, 3), (8190, 2)][..]));
    assert_eq!(d, b"xyzuv");
    // A map that claims more data than the entry stores.
    let mut bad = b"1\n0\n99\n".to_vec();
    bad.resize(512, 0);
    bad.extend_from_slice(b"xyzuv");
    let f = block(b"./GNUSparseFile.1/file", b'0', bad.len() as u64, USTAR);
    assert!(all(&tar(&[(&x, &body), (&f, &bad)])).is_err());
}

#[test]
fn pax_sparse_0_1_and_acls() {
    let body = [
        rec(b"GNU.sparse.size", b"100"),
        rec(b"GNU.sparse.numblocks", b"2"),
        rec(b"GNU.sparse.map", b"10,2,98,2"),
        rec(
            b"SCHILY.acl.access",
            b"user::rw-,user:1234:r--,group::r--,mask::r--,other::r--",
        ),
    ]
    .concat();
    let x = block(b"x", b'x', body.len() as u64, USTAR);
    let f = block(b"f", b'0', 4, USTAR);
    let got = all(&tar(&[(&x, &body), (&f, b"abcd")])).unwrap();
    let (e, _) = &got[0];
    assert_eq!(e.size, 100);
    assert_eq!(e.sparse.as_deref(), Some(&[(10, 2), (98, 2)][..]));
    let acl = &e.xattrs[&b"system.posix_acl_access"[..]];
    assert_eq!(acl.len(), 4 + 5 * 8);
}

#[test]
fn v7_and_star_headers() {
    let mut v7 = block(b"old/", 0, 0, &[0; 8]);
    checksum(&mut v7);
    let got = all(&tar(&[(&v7, b"")])).unwrap();
    assert_eq!(got[0].0.kind, Kind::Dir);
    let mut star = block(b"name", b'0', 0, USTAR);
    star[345..351].copy_from_slice(b"prefix");
    star[508..512].copy_from_slice(b"tar\0");
    checksum(&mut star);
    let got = all(&tar(&[(&star, b"")])).unwrap();
    assert_eq!(got[0].0.path, b"prefix/name");
}
