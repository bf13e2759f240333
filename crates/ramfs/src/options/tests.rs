use super::*;

fn bs(v: &str) -> Result<u32, String> {
    let mut o = Options::default();
    o.set("blocksize", Some(v))?;
    Ok(o.block_size)
}

#[test]
fn blocksize_follows_the_kernel_rule() {
    assert!(bs("0").unwrap_err().contains("zero"));
    assert_eq!(bs("1").unwrap(), 4096);
    assert_eq!(bs("4096").unwrap(), 4096);
    assert_eq!(bs("8191").unwrap(), 4096);
    assert_eq!(bs("8192").unwrap(), 8192);
    assert_eq!(bs("64K").unwrap(), 65536);
    assert_eq!(bs("100k").unwrap(), 65536);
    assert_eq!(bs("2M").unwrap(), 2 << 20);
    assert_eq!(bs("3M").unwrap(), 2 << 20);
    assert_eq!(bs("1G").unwrap(), 2 << 20);
    assert!(bs("x").is_err());
    assert!(bs("4Q").is_err());
    let mut o = Options::default();
    assert!(o.set("blocksize", None).is_err());
}

#[test]
fn huge_takes_always_or_never_and_needs_2m_blocks() {
    let mut o = Options::default();
    assert_eq!(o.set("huge", Some("always")), Ok(true));
    assert!(o.huge);
    assert!(o.check().unwrap_err().contains("needs blocksize="));
    assert!(o.set("huge", Some("within_size")).is_err());
    assert!(o.set("huge", None).is_err());
    assert_eq!(o.set("huge", Some("never")), Ok(true));
    assert_eq!(o.check(), Ok(()));
    assert_eq!(o.show(), "");
    o.set("huge", Some("always")).unwrap();
    o.set("blocksize", Some("2M")).unwrap();
    assert_eq!(o.show(), "blocksize=2097152,huge=always");
    // Whether 2M blocks may be huge depends on this machine's kernel;
    // where they may not, the reason names the setting.
    if let Err(e) = o.check() {
        assert!(
            e.contains("transparent huge pages") || e.contains("blocksize="),
            "{e}"
        );
    }
}

#[test]
fn other_keys() {
    let mut o = Options::default();
    assert_eq!(o.set("mode", Some("1777")), Ok(true));
    assert_eq!(o.mode, 0o1777);
    assert!(o.set("mode", Some("8")).is_err());
    assert!(o.set("mode", Some("17777")).is_err());
    // The shared octal rules, with the blanks ramfs always allowed.
    assert_eq!(o.set("mode", Some(" 0700 ")), Ok(true));
    assert_eq!(o.mode, 0o700);
    let e = o.set("mode", Some("17777")).unwrap_err();
    assert!(e.contains("mode=17777") && e.contains("7777"), "{e}");
    let e = o.set("mode", Some("0x1ff")).unwrap_err();
    assert!(e.contains("mode=0x1ff") && e.contains("octal"), "{e}");
    assert!(o.set("mode", Some("")).is_err());
    assert!(o.set("mode", Some("+700")).is_err());
    assert_eq!(o.mode, 0o700);
    assert_eq!(o.set("uid", Some("1000")), Ok(true));
    assert_eq!(o.set("gid", Some("100")), Ok(true));
    assert_eq!(o.set("size", Some("10M")), Ok(true));
    assert_eq!(o.size_limit(1 << 34), Some(10 << 20));
    assert_eq!(o.set("size", Some("25%")), Ok(true));
    assert_eq!(o.size_limit(400), Some(100));
    assert!(o.set("size", Some("0%")).is_err());
    assert!(o.set("size", Some("101%")).is_err());
    assert_eq!(o.set("size", Some("0")), Ok(true));
    assert_eq!(o.size_limit(400), None);
    assert_eq!(o.set("nr_inodes", Some("1k")), Ok(true));
    assert_eq!(o.inode_limit(1 << 30), Some(1024));
    assert_eq!(o.set("allow_other", None), Ok(false));
    assert_eq!(o.set("ro", None), Ok(false));
    assert_eq!(Options::default().size_limit(1000), Some(500));
}

#[test]
fn show_lists_only_non_defaults() {
    let mut o = Options::default();
    assert_eq!(o.show(), "");
    o.set("blocksize", Some("4096")).unwrap();
    assert_eq!(o.show(), "");
    o.set("blocksize", Some("65536")).unwrap();
    assert_eq!(o.show(), "blocksize=65536");
    o.set("mode", Some("700")).unwrap();
    o.set("size", Some("50%")).unwrap();
    assert_eq!(o.show(), "mode=700,size=50%,blocksize=65536");
}

#[test]
fn keys_are_exactly_what_set_takes() {
    for k in Options::KEYS {
        assert!(Options::is_key(k));
        // Every key but the flags needs a value, and the flags take none,
        // so `set` answering an error proves it treats the key as its own.
        let wrong = if k.ends_with("passthrough") {
            Some("1")
        } else {
            None
        };
        assert!(Options::default().set(k, wrong).is_err(), "{k}");
    }
    let mut o = Options::default();
    assert_eq!(o.set("passthrough", None), Ok(true));
    assert_eq!(o.passthrough, Some(true));
    assert_eq!(o.set("nopassthrough", None), Ok(true));
    assert_eq!(o.passthrough, Some(false));
    for k in [
        "ro",
        "allow_other",
        "writeback",
        "directio",
        "umask",
        "bogus",
        "",
    ] {
        assert!(!Options::is_key(k));
        assert_eq!(Options::default().set(k, Some("1")), Ok(false), "{k}");
    }
}

#[test]
fn ids_and_sizes_follow_the_shared_rules() {
    let mut o = Options::default();
    assert_eq!(o.set("uid", Some("4294967294")), Ok(true));
    assert_eq!(o.uid, u32::MAX - 1);
    for v in ["4294967295", "-1"] {
        let e = o.set("uid", Some(v)).unwrap_err();
        assert!(e.contains("uid=") && e.contains("no change"), "{e}");
    }
    assert!(o.set("gid", Some("4294967296")).is_err());
    assert!(o.set("gid", Some("12k")).is_err());
    // Blanks around a value were always allowed here.
    assert_eq!(o.set("gid", Some(" 7 ")), Ok(true));
    assert_eq!(o.gid, 7);
    assert_eq!(o.set("size", Some("1T")), Ok(true));
    assert_eq!(o.size, Some(SizeLimit::Bytes(1 << 40)));
    assert_eq!(o.set("size", Some("15E")), Ok(true));
    let e = o.set("size", Some("16E")).unwrap_err();
    assert!(e.contains("size=16E") && e.contains("too large"), "{e}");
    let e = o.set("size", Some("12Q")).unwrap_err();
    assert!(e.contains("size=12Q") && e.contains("suffix"), "{e}");
    assert!(o.set("size", Some("")).is_err());
    assert!(o.set("size", Some("-1")).is_err());
    assert!(o.set("nr_inodes", Some("1.5k")).is_err());
    assert_eq!(o.set("nr_inodes", Some("0")), Ok(true));
    assert_eq!(o.inode_limit(1 << 30), None);
}

fn items(s: &str) -> Vec<(String, Option<String>)> {
    s.split(',')
        .map(|i| match i.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (i.to_owned(), None),
        })
        .collect()
}

#[test]
fn from_mount_options_refuses_by_name() {
    let o = Options::from_mount_options(&items("blocksize=64K,mode=700,uid=5,size=10%")).unwrap();
    assert_eq!((o.block_size, o.mode, o.uid), (65536, 0o700, 5));
    assert_eq!(o.size, Some(SizeLimit::Percent(10)));
    assert_eq!(Options::from_mount_options(&[]), Ok(Options::default()));
    assert_eq!(
        Options::from_mount_options(&items("mode=1,bogus=2")),
        Err(OptionError::Unknown("bogus=2".into()))
    );
    assert_eq!(
        Options::from_mount_options(&items("directio")),
        Err(OptionError::Unknown("directio".into()))
    );
    let e = Options::from_mount_options(&items("huge=sometimes")).unwrap_err();
    assert!(
        matches!(&e, OptionError::BadValue { key, .. } if key == "huge"),
        "{e}"
    );
    assert!(e.to_string().contains("huge=sometimes"), "{e}");
    let e = Options::from_mount_options(&items("blocksize=64K,huge=always")).unwrap_err();
    assert!(matches!(e, OptionError::Conflict(_)), "{e}");
    assert!(
        e.to_string().contains("huge=always needs blocksize="),
        "{e}"
    );
}
