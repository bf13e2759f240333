use super::*;

#[test]
fn defaults() {
    let o = MountOptions::parse("").unwrap();
    assert_eq!(o, MountOptions::default());
    assert!(o.flags.nosuid && o.flags.nodev);
    assert_eq!(
        (o.read_only, o.push, o.threads, o.spin),
        (None, None, None, None)
    );
}

#[test]
fn generic_options() {
    let o =
        MountOptions::parse("ro,allow_other,uid=1000,gid=100,umask=027,fsname=img,debug,noexec")
            .unwrap();
    assert_eq!(o.read_only, Some(true));
    assert!(o.allow_other && o.debug && o.flags.noexec);
    assert_eq!((o.uid, o.gid, o.umask), (Some(1000), Some(100), Some(0o27)));
    assert_eq!(o.fsname.as_deref(), Some("img"));
}

#[test]
fn later_options_win() {
    let o = MountOptions::parse("suid,dev,ro,rw,writeback,nowriteback").unwrap();
    assert!(!o.flags.nosuid && !o.flags.nodev);
    assert_eq!(o.read_only, Some(false));
    assert!(!o.writeback);
    let o = MountOptions::parse("suid,dev,nosuid,nodev").unwrap();
    assert!(o.flags.nosuid && o.flags.nodev);
}

#[test]
fn mount_fuse3_defaults_come_off() {
    for (given, meant) in [
        ("ro,dev,suid", "ro"),
        ("ro,nodev,suid", "ro,nodev"),
        ("ro,nosuid,dev", "ro,nosuid"),
        ("ro,nodev,nosuid", "ro,nodev,nosuid"),
        // fstab said `dev`; mount.fuse3 added both again.
        ("dev,dev,suid", "dev"),
        ("suid,dev,suid", "suid"),
        ("dev,suid", ""),
    ] {
        assert_eq!(strip_helper_defaults(given), meant, "{given}");
    }
}

#[test]
fn push_and_profile_options() {
    let o = MountOptions::parse("push=64M,record=/tmp/p,prefetch=/tmp/q").unwrap();
    assert_eq!(o.push, Some(64 << 20));
    assert_eq!(o.record, Some(PathBuf::from("/tmp/p")));
    assert_eq!(o.prefetch, Some(PathBuf::from("/tmp/q")));
    assert_eq!(MountOptions::parse("push=1M,nopush").unwrap().push, Some(0));
    assert_eq!(MountOptions::parse("").unwrap().push, None);
    for s in [
        "push=",
        "push=x",
        "nopush=1",
        "record=",
        "prefetch=",
        "prefetch",
    ] {
        assert!(MountOptions::parse(s).is_err(), "{s}");
    }
}

#[test]
fn spin_is_microseconds_and_nospin_is_zero() {
    let spin = |s: &str| MountOptions::parse(s).unwrap().spin;
    assert_eq!(spin(""), None);
    assert_eq!(spin("spin=150"), Some(Duration::from_micros(150)));
    assert_eq!(spin("spin=0"), Some(Duration::ZERO));
    assert_eq!(spin("spin=10000"), Some(Duration::from_millis(10)));
    assert_eq!(spin("spin=40,nospin"), Some(Duration::ZERO));
}

#[test]
fn auto_unmount_is_an_option() {
    assert!(MountOptions::parse("auto_unmount").unwrap().auto_unmount);
    assert!(!MountOptions::parse("").unwrap().auto_unmount);
}

#[test]
fn passthrough_options_are_accepted() {
    let o = MountOptions::parse(
        "rw,dev,suid,exec,atime,noatime,defaults,_netdev,nofail,x-systemd.automount,subtype=foliofs,,default_permissions,comment=x",
    )
    .unwrap();
    assert_eq!(o.read_only, Some(false));
    for k in ["defaults", "x-systemd.automount", "comment", "subtype"] {
        assert!(MountOptions::is_key(k), "{k}");
    }
}

#[test]
fn unknown_keys_are_left_to_others_or_refused_by_name() {
    let mut o = MountOptions::default();
    for k in ["size", "mode", "bogus", ""] {
        assert_eq!(o.set(k, Some("1")), Ok(false), "{k}");
        assert!(!MountOptions::is_key(k), "{k}");
    }
    assert_eq!(o, MountOptions::default());
    assert_eq!(
        MountOptions::parse("ro,size=1M,mode=0700,bogus")
            .unwrap_err()
            .to_string(),
        "unknown mount option `size=1M`"
    );
    let items = [("bogus".to_owned(), None)];
    assert_eq!(
        MountOptions::from_mount_options(&items),
        Err(OptionError::Unknown("bogus".into()))
    );
}

#[test]
fn keys_are_exactly_what_set_takes() {
    for k in MountOptions::KEYS {
        assert!(MountOptions::is_key(k));
        // A key that takes no value refuses one, a key that needs one
        // refuses none; `subtype` takes anything. None answers "not ours".
        let mut o = MountOptions::default();
        let none = o.set(k, None);
        let some = o.set(k, Some("x"));
        assert!(none != Ok(false) && some != Ok(false), "{k}");
        assert!(none.is_err() || some.is_err() || *k == "subtype", "{k}");
    }
    for k in IGNORED {
        assert_eq!(MountOptions::default().set(k, None), Ok(true), "{k}");
    }
}

#[test]
fn malformed_values_name_the_option() {
    for (s, key) in [
        ("uid=abc", "uid"),
        ("uid", "uid"),
        ("umask=9", "umask"),
        ("umask=10000", "umask"),
        ("umask=+22", "umask"),
        ("umask=", "umask"),
        ("ro=1", "ro"),
        ("fsname=", "fsname"),
        ("threads=0", "threads"),
        ("threads=65", "threads"),
        ("threads=many", "threads"),
        ("spin=x", "spin"),
        ("spin=10001", "spin"),
        ("spin=-1", "spin"),
        ("spin=", "spin"),
        ("nospin=1", "nospin"),
        ("push=1Q", "push"),
    ] {
        let e = MountOptions::parse(s).unwrap_err();
        assert!(
            matches!(&e, OptionError::BadValue { key: k, .. } if k == key),
            "{s}: {e}"
        );
        assert!(e.to_string().contains(key));
    }
}

#[test]
fn sizes() {
    assert_eq!(parse_size("1024").unwrap(), 1024);
    assert_eq!(parse_size("1k").unwrap(), 1024);
    assert_eq!(parse_size("2M").unwrap(), 2 << 20);
    assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    assert!(parse_size("K").is_err());
    assert!(parse_size("-1").is_err());
    assert!(parse_size("99999999999999999999G").is_err());
    for n in [1024, 65536, 3 << 20, 1536, 1 << 30] {
        assert_eq!(parse_size(&format_size(n)).unwrap(), n);
    }
}

#[test]
fn ids_refuse_minus_one_by_name() {
    let o = MountOptions::parse("uid=4294967294,gid=0").unwrap();
    assert_eq!((o.uid, o.gid), (Some(u32::MAX - 1), Some(0)));
    for s in ["uid=4294967295", "gid=4294967295", "uid=-1"] {
        let e = MountOptions::parse(s).unwrap_err().to_string();
        assert!(e.contains("no change"), "{s}: {e}");
    }
    for s in ["uid=4294967296", "gid=-5", "uid=+1", "gid=1k"] {
        let e = MountOptions::parse(s).unwrap_err().to_string();
        assert!(e.contains("not a numeric id"), "{s}: {e}");
    }
}
