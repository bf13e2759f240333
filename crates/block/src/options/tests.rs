use std::path::PathBuf;

use super::*;

/// `s` as a command line's `-o` gives it.
fn items(s: &str) -> Vec<(String, Option<String>)> {
    foliofs_vfs::options::items(s)
        .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
        .collect()
}

fn parse(s: &str) -> Result<ImageOptions, OptionError> {
    ImageOptions::from_mount_options(&items(s))
}

#[test]
fn defaults() {
    let o = parse("").unwrap();
    assert_eq!(o, ImageOptions::default());
    assert_eq!(o.open, OpenOptions::default());
    assert_eq!(o.open.io_mode, IoMode::Buffered);
    assert_eq!(o.open.block_size, BlockSizeChoice::Default);
}

#[test]
fn reading_options() {
    let o = parse("directio,blocksize=64K,device=/a,device=/b").unwrap();
    assert_eq!(o.open.io_mode, IoMode::Direct);
    assert_eq!(o.open.block_size, BlockSizeChoice::Fixed(65536));
    assert_eq!(o.open.cache_bytes, OpenOptions::default().cache_bytes);
    assert_eq!(o.devices, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    assert_eq!(
        OpenOptions::from_mount_options(&items("largeblocks")).unwrap(),
        OpenOptions {
            block_size: BlockSizeChoice::LargeBlocks,
            ..OpenOptions::default()
        }
    );
}

#[test]
fn later_options_win() {
    let o = parse("directio,nodirectio,blocksize=2M,largeblocks").unwrap();
    assert_eq!(o.open.io_mode, IoMode::Buffered);
    assert_eq!(o.open.block_size, BlockSizeChoice::LargeBlocks);
    let o = parse("largeblocks,blocksize=1m").unwrap();
    assert_eq!(o.open.block_size, BlockSizeChoice::Fixed(1 << 20));
}

#[test]
fn malformed_values_name_the_option() {
    for (s, key) in [
        ("blocksize=3K", "blocksize"),
        ("blocksize=512", "blocksize"),
        ("blocksize=4M", "blocksize"),
        ("blocksize=", "blocksize"),
        ("blocksize=x", "blocksize"),
        ("blocksize", "blocksize"),
        ("largeblocks=yes", "largeblocks"),
        ("directio=1", "directio"),
        ("nodirectio=", "nodirectio"),
        ("device=", "device"),
        ("device", "device"),
    ] {
        let e = parse(s).unwrap_err();
        assert!(
            matches!(&e, OptionError::BadValue { key: k, .. } if k == key),
            "{s}: {e}"
        );
        assert!(e.to_string().contains(key));
    }
}

#[test]
fn blocksize_errors_name_the_value_and_the_rule() {
    for (s, why) in [
        ("blocksize=16E", "too large"),
        ("blocksize=4Q", "suffix `Q`"),
        ("blocksize=0", "power of two"),
        ("blocksize=1T", "power of two"),
    ] {
        let e = parse(s).unwrap_err().to_string();
        assert!(e.contains(why) && e.contains("blocksize"), "{s}: {e}");
    }
}

#[test]
fn keys_of_other_layers_are_left_alone_or_refused_by_name() {
    let mut o = ImageOptions::default();
    for (k, v) in [
        ("ro", None),
        ("uid", Some("5")),
        ("size", Some("1M")),
        ("prefetch", Some("/p")),
        ("bogus", None),
        ("", None),
    ] {
        assert_eq!(o.set(k, v), Ok(false), "{k}");
    }
    assert_eq!(o, ImageOptions::default());
    assert_eq!(
        parse("directio,uid=5").unwrap_err(),
        OptionError::Unknown("uid=5".into())
    );
    assert_eq!(
        parse("prefetch=/p").unwrap_err(),
        OptionError::Unknown("prefetch=/p".into())
    );
}

#[test]
fn reading_keys_are_exactly_what_open_options_and_devices_hold() {
    let default = ImageOptions::default();
    for s in [
        "directio",
        "blocksize=64K",
        "largeblocks",
        "device=/d",
        "chunk=4M",
        "cache=/c",
        "cache_size=1G",
        "prefetch=all",
        "endpoint=https://e",
        "region=r",
        "path_style",
        "insecure_http",
        "timeout=5",
        "digest",
        "digest=s3://b/k.digest",
    ] {
        let o = parse(s).unwrap();
        let key = s.split('=').next().unwrap();
        assert!(ImageOptions::is_key(key), "{s}");
        assert_ne!(o, default, "{s}");
    }
    // `nodirectio` is the default, but undoes an earlier `directio`.
    assert_eq!(parse("directio,nodirectio").unwrap(), default);
    for k in ImageOptions::KEYS {
        // Every key takes no value or needs one: an error for one of the
        // two proves `set` treats the key as its own.
        let mut o = ImageOptions::default();
        assert!(
            o.set(k, None).is_err() || o.set(k, Some("x")).is_err(),
            "{k}"
        );
    }
    // The lists are made of their parts, each key once.
    assert_eq!(ImageOptions::KEYS.len(), 15);
    for k in RemoteOptions::KEYS {
        assert!(OpenOptions::is_key(k), "{k}");
    }
    for k in OpenOptions::KEYS {
        assert!(ImageOptions::is_key(k), "{k}");
    }
    let mut sorted = ImageOptions::KEYS.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ImageOptions::KEYS.len());
}
