//! PAX extended headers: a body of records `"%d %s=%s\n"`, where the
//! decimal length counts the whole record, its own digits and the newline
//! included. Records are walked by that length, never split at newlines:
//! a value may hold any byte (binary xattrs such as
//! `security.capability` hold `\n`), and a reader that split at newlines
//! would see records inside values that every other reader sees as data,
//! so one tar would give two trees. The rules here are Go's
//! `archive/tar`'s, which container runtimes unpack layers with.

/// A PAX body's records, in order (a later record of the same key
/// replaces an earlier one when they are applied).
pub type Records = Vec<(Vec<u8>, Vec<u8>)>;

/// Splits a PAX body into its records. GNU sparse 0.0's repeated
/// `GNU.sparse.offset` / `GNU.sparse.numbytes` pairs are gathered into
/// one `GNU.sparse.map` record, as format 0.1 spells it.
pub fn parse(mut body: &[u8]) -> Result<Records, String> {
    let mut out: Records = Vec::new();
    let mut sparse: Vec<u8> = Vec::new();
    let mut pairs = 0usize;
    let mut at = 0usize;
    while !body.is_empty() {
        let (k, v, rest) = record(body).map_err(|why| format!("record at byte {at}: {why}"))?;
        at += body.len() - rest.len();
        body = rest;
        match k {
            b"GNU.sparse.offset" | b"GNU.sparse.numbytes" => {
                let want: &[u8] = if pairs.is_multiple_of(2) {
                    b"GNU.sparse.offset"
                } else {
                    b"GNU.sparse.numbytes"
                };
                if k != want || v.contains(&b',') {
                    return Err(format!(
                        "GNU sparse 0.0 records out of order: {} where {} was due",
                        String::from_utf8_lossy(k),
                        String::from_utf8_lossy(want)
                    ));
                }
                if pairs > 0 {
                    sparse.push(b',');
                }
                sparse.extend_from_slice(v);
                pairs += 1;
            }
            _ => out.push((k.to_vec(), v.to_vec())),
        }
    }
    if pairs > 0 {
        out.push((b"GNU.sparse.map".to_vec(), sparse));
    }
    Ok(out)
}

/// A record's key and value, and the bytes after it.
type Record<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// One record at the start of `s`: its key, its value and what follows.
fn record(s: &[u8]) -> Result<Record<'_>, String> {
    let sp = s
        .iter()
        .position(|&c| c == b' ')
        .ok_or("no space after the length")?;
    let digits = &s[..sp];
    // Go parses the length with strconv.ParseInt, which takes a sign;
    // a negative one fails the bound below all the same.
    let unsigned = digits.strip_prefix(b"+").unwrap_or(digits);
    if unsigned.is_empty() || unsigned.len() > 18 || !unsigned.iter().all(u8::is_ascii_digit) {
        return Err(format!(
            "length {:?} is not a decimal number",
            String::from_utf8_lossy(&digits[..digits.len().min(24)])
        ));
    }
    let n: usize = std::str::from_utf8(unsigned)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or("the length does not fit")?;
    if n < 5 || n > s.len() || n <= sp + 1 {
        return Err(format!(
            "length {n} does not fit the {} bytes left",
            s.len()
        ));
    }
    let (rec, rest) = s.split_at(n);
    let rec = &rec[sp + 1..];
    let (&nl, rec) = rec.split_last().expect("n > sp + 1");
    if nl != b'\n' {
        return Err(format!("length {n} does not end at a newline"));
    }
    let eq = rec
        .iter()
        .position(|&c| c == b'=')
        .ok_or("no '=' in the record")?;
    let (k, v) = (&rec[..eq], &rec[eq + 1..]);
    if k.is_empty() {
        return Err("an empty key".into());
    }
    // A NUL would end the string where C and the kernel read it: in a
    // name or link it would make two readers disagree, so Go refuses it
    // there, and in any key.
    let nul_refused = matches!(k, b"path" | b"linkpath" | b"uname" | b"gname");
    if k.contains(&0) || (nul_refused && v.contains(&0)) {
        return Err(format!("a NUL byte in {}", String::from_utf8_lossy(k)));
    }
    Ok((k, v, rest))
}

/// The value of the last `key` record, if any.
pub fn get<'a>(r: &'a Records, key: &[u8]) -> Option<&'a [u8]> {
    r.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_slice())
}

/// A decimal integer as Go's `strconv.ParseInt` reads one (an optional
/// sign, then digits).
pub fn int(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?;
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.strip_prefix('+').unwrap_or(s).parse().ok()
}

/// A PAX time, `[-]SECONDS[.FRACTION]`, as seconds and nanoseconds
/// (digits past the ninth are dropped, as Go drops them).
pub fn time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let sec: i64 = int.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: u32 = digits.parse().ok()?;
    Some(match (neg, nsec) {
        (false, n) => (sec, n),
        (true, 0) => (-sec, 0),
        (true, n) => (-sec - 1, 1_000_000_000 - n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(k: &str, v: &[u8]) -> Vec<u8> {
        super::super::tests::rec(k.as_bytes(), v)
    }

    #[test]
    fn values_hold_any_byte() {
        let cap = b"\x01\x00\x00\x02\n\x20\x00\x00\n22 linkpath=/etc/evil\n";
        let body = [
            rec("SCHILY.xattr.security.capability", cap),
            rec("path", b"a/b"),
        ]
        .concat();
        let r = parse(&body).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(get(&r, b"SCHILY.xattr.security.capability"), Some(&cap[..]));
        assert_eq!(get(&r, b"path"), Some(&b"a/b"[..]));
        assert_eq!(get(&r, b"linkpath"), None);
    }

    #[test]
    fn lying_lengths_are_refused() {
        for bad in [
            &b"30 path=a\n"[..],
            b"9 path=a\n9 x",
            b"x path=a\n",
            b"10 patha\n\n",
            b"8 =abc\n\n",
            b"11 path=a\0\n",
            b"-11 path=ab\n",
            b"99999999999999999999999 a=b\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse(b"6 a=b\n").is_ok());
        assert_eq!(parse(b"+9 path=\n").unwrap()[0].1, b"");
    }

    #[test]
    fn sparse_0_0_pairs_become_a_map() {
        let body = [
            rec("GNU.sparse.size", b"100"),
            rec("GNU.sparse.offset", b"0"),
            rec("GNU.sparse.numbytes", b"5"),
            rec("GNU.sparse.offset", b"50"),
            rec("GNU.sparse.numbytes", b"7"),
        ]
        .concat();
        let r = parse(&body).unwrap();
        assert_eq!(get(&r, b"GNU.sparse.map"), Some(&b"0,5,50,7"[..]));
        let bad = [rec("GNU.sparse.numbytes", b"5")].concat();
        assert!(parse(&bad).is_err());
    }

    #[test]
    fn times() {
        assert_eq!(time(b"1.5"), Some((1, 500_000_000)));
        assert_eq!(time(b"-1.25"), Some((-2, 750_000_000)));
        assert_eq!(time(b"-86400"), Some((-86400, 0)));
        assert_eq!(time(b"4102444800.0000000019"), Some((4102444800, 1)));
        assert_eq!(time(b"x"), None);
        assert_eq!(int(b"+12"), Some(12));
        assert_eq!(int(b"-"), None);
    }
}
