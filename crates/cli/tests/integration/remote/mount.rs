//! Remote images mount and read exactly as their local copies: romfs, LZ4
//! EROFS, and a chunked EROFS image whose blob is a second object; random
//! reads from eight threads; the inspection commands on URLs; the source
//! shown without its query string.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use super::{cache_dir, foliofs_with, mount_url, start_weed, Creds, Images, BUCKET, PUBLIC};
use crate::common::{self, Mount};
use crate::erofs::walk::{assert_same, walk_mounted};

/// Mounts `local` as a file and `url` from the server (`opts` added), and
/// asserts their walks are the same in every field, inode numbers,
/// xattrs and contents included.
fn same_as_local(local: &Path, local_opts: &str, url: &str, opts: &str) -> Mount {
    let want = {
        let m = Mount::new(local, None, local_opts).unwrap();
        walk_mounted(m.path())
    };
    let m =
        mount_url(None, &Creds::Env, url, opts, &[]).unwrap_or_else(|e| panic!("mount {url}: {e}"));
    let got = walk_mounted(m.path());
    assert!(want.len() > 300, "only {} entries", want.len());
    assert_same("remote mount", &want, &got);
    m
}

#[test]
fn romfs_from_s3_walks_like_its_local_copy() {
    require!("fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let img = images.romfs();
    weed.put_file(BUCKET, "images/tree.romfs", &img).unwrap();
    let url = format!("s3://{BUCKET}/images/tree.romfs");
    let cache = cache_dir(&images, "cache");
    let opts = format!(
        "{},cache={},chunk=256K",
        weed.mount_options(),
        cache.display()
    );
    let m = same_as_local(&img, "", &url, &opts);

    // The source is the URL, in the kernel's table and in `foliofs mounts`.
    let dir = m.path().canonicalize().unwrap();
    let table = foliofs_fuse::mount_table().unwrap();
    let line = table.iter().find(|l| l.mountpoint == dir).unwrap();
    assert_eq!(line.source, url);
    let mounts = String::from_utf8(common::foliofs_ok(["mounts"])).unwrap();
    let ours = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == dir.to_str())
        .unwrap_or_else(|| panic!("not listed:\n{mounts}"));
    assert!(
        ours.starts_with(&format!("{url} "))
            && ours.contains(" romfs ")
            && ours.contains("chunk=256K"),
        "{ours}"
    );
    m.unmount().unwrap();
    assert!(super::file_count(&cache) > 0, "nothing cached");
}

#[test]
fn erofs_lz4_from_s3_walks_like_its_local_copy() {
    require!("fuse", "weed", "mkfs.erofs");
    let weed = start_weed();
    let images = Images::new();
    let img = images.erofs_lz4();
    weed.put_file(BUCKET, "tree-lz4.erofs", &img).unwrap();
    let cache = cache_dir(&images, "cache");
    let opts = format!(
        "{},cache={},chunk=64K",
        weed.mount_options(),
        cache.display()
    );
    same_as_local(&img, "", &format!("s3://{BUCKET}/tree-lz4.erofs"), &opts)
        .unmount()
        .unwrap();
}

#[test]
fn chunked_erofs_with_its_blob_in_s3_walks_like_its_local_copy() {
    require!("fuse", "weed", "mkfs.erofs");
    let weed = start_weed();
    let images = Images::new();
    let (img, blob) = images.erofs_chunked();
    assert!(fs::metadata(&blob).unwrap().len() > 1 << 20, "no blob");
    weed.put_file(BUCKET, "chunked.erofs", &img).unwrap();
    weed.put_file(BUCKET, "chunked.blob", &blob).unwrap();
    let cache = cache_dir(&images, "cache");
    // The image from S3 and its blob from S3.
    let opts = format!(
        "{},cache={},device=s3://{BUCKET}/chunked.blob",
        weed.mount_options(),
        cache.display()
    );
    let local = format!("device={}", blob.display());
    same_as_local(&img, &local, &format!("s3://{BUCKET}/chunked.erofs"), &opts)
        .unmount()
        .unwrap();
    // A local image with its blob in S3: the remote keys apply to the blob.
    let want = {
        let m = Mount::new(&img, None, &local).unwrap();
        walk_mounted(m.path())
    };
    let m = mount_url(None, &Creds::Env, img.to_str().unwrap(), &opts, &[]).unwrap();
    assert_same("local image, remote blob", &want, &walk_mounted(m.path()));
}

#[test]
fn random_reads_from_eight_threads_return_the_source_bytes() {
    require!("fuse", "weed", "mkfs.erofs", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let want = Arc::new(fs::read(images.src.join("mixed")).unwrap());
    for (name, img) in [("romfs", images.romfs()), ("lz4", images.erofs_lz4())] {
        weed.put_file(BUCKET, name, &img).unwrap();
        let cache = cache_dir(&images, &format!("cache-{name}"));
        let opts = format!(
            "{},cache={},chunk=64K",
            weed.mount_options(),
            cache.display()
        );
        let m = mount_url(
            None,
            &Creds::Env,
            &format!("s3://{BUCKET}/{name}"),
            &opts,
            &[],
        )
        .unwrap();
        crate::erofs::mount::random_reads(&m.path().join("mixed"), want.clone());
        m.unmount().unwrap();
    }
}

#[test]
fn inspection_commands_take_urls() {
    require!("weed", "mkfs.erofs", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    weed.put_file(BUCKET, "tree.romfs", &images.romfs())
        .unwrap();
    weed.put_file(BUCKET, "tree.erofs", &images.erofs_lz4())
        .unwrap();
    let cache = cache_dir(&images, "cache");
    let opts = format!("{},cache={}", weed.mount_options(), cache.display());
    for (key, format) in [("tree.romfs", "romfs"), ("tree.erofs", "erofs")] {
        let url = format!("s3://{BUCKET}/{key}");
        let run = |args: &[&str]| {
            let mut all = vec![args[0], "-o", &opts];
            all.extend(&args[1..]);
            let (ok, out, err) = foliofs_with(&Creds::Env, &all);
            assert!(ok, "foliofs {all:?}: {err}");
            out
        };
        let info = run(&["info", &url]);
        assert!(
            info.contains(&format!("format:          {format}")),
            "{info}"
        );
        let size = fs::metadata(images.path(if format == "romfs" {
            "tree.romfs"
        } else {
            "tree-lz4.erofs"
        }))
        .unwrap()
        .len();
        assert!(
            info.contains(&format!("image size:      {size} bytes")),
            "{info}"
        );
        let ls = run(&["ls", &url, "/many"]);
        assert_eq!(ls.lines().count(), 300, "{ls}");
        let cat = run(&["cat", &url, "/deep/level0/level1/level2/level3/level4/level5/level6/level7/level8/level9/level10/level11/bottom.txt"]);
        assert_eq!(cat, "the bottom\n");
        run(&["fsck", &url]);
        let dest = images.path(&format!("extract-{format}"));
        run(&["extract", &url, dest.to_str().unwrap(), "/many"]);
        assert_eq!(
            fs::read(dest.join("f007")).unwrap(),
            fs::read(images.src.join("many/f007")).unwrap()
        );
    }
}

#[test]
fn a_plain_url_mounts_and_its_query_string_is_never_shown() {
    require!("fuse", "weed", "genromfs");
    let weed = start_weed();
    let images = Images::new();
    let img = images.romfs();
    weed.put_file(PUBLIC, "tree.romfs", &img).unwrap();
    // A query string stands for a presigned URL's signature; the server
    // ignores what it does not know.
    let secret = "sekrit-signature-0123456789";
    let url = format!(
        "{}?X-Amz-Signature={secret}",
        weed.url(PUBLIC, "tree.romfs")
    );
    let cache = cache_dir(&images, "cache");
    let plain = weed.url(PUBLIC, "tree.romfs");

    // http:// only with insecure_http, and then without credentials.
    let (ok, _, err) = foliofs_with(
        &Creds::Anonymous,
        &["ls", "-o", &format!("cache={}", cache.display()), &url],
    );
    assert!(!ok, "http:// without insecure_http");
    assert!(err.contains("insecure_http"), "{err}");
    assert!(!err.contains(secret), "{err}");

    let opts = format!("insecure_http,cache={}", cache.display());
    let m = same_as_local(&img, "", &url, &opts);
    let dir = m.path().canonicalize().unwrap();
    let table = foliofs_fuse::mount_table().unwrap();
    let line = table.iter().find(|l| l.mountpoint == dir).unwrap();
    assert!(!line.source.contains(secret), "{}", line.source);
    assert!(line.source.starts_with(&plain), "{}", line.source);
    let mounts = String::from_utf8(common::foliofs_ok(["mounts", "--stats"])).unwrap();
    assert!(!mounts.contains(secret), "{mounts}");
    assert!(mounts.contains(&plain), "{mounts}");
    // Nor on any process's command line, nor in the records.
    for p in fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = fs::read(p.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(secret),
                "{}: {}",
                p.path().display(),
                String::from_utf8_lossy(&cmdline)
            );
        }
    }
    let records = Path::new("/run/foliofs");
    assert!(!grep_dir(records, secret), "a record holds the secret");
    m.unmount().unwrap();
}

/// Whether a file under `dir` holds `needle`.
fn grep_dir(dir: &Path, needle: &str) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            grep_dir(&p, needle)
        } else {
            fs::read(&p).is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
        }
    })
}

#[test]
fn remote_options_are_refused_for_local_sources_and_directio_for_urls() {
    require!("fuse", "genromfs");
    let images = Images::new();
    let img = images.romfs();
    let mnt = tempfile::tempdir().unwrap();
    for (source, fstype, opts, want) in [
        (
            img.to_str().unwrap(),
            "auto",
            "chunk=1M",
            "mount option `chunk` is for images in object storage (s3://, https://), not a local image",
        ),
        (
            img.to_str().unwrap(),
            "auto",
            "ro,endpoint=http://127.0.0.1:1",
            "mount option `endpoint` is for images in object storage",
        ),
        (
            "none",
            "ramfs",
            "size=1M,timeout=5",
            "mount option `timeout` is for images in object storage; ramfs does not take it",
        ),
        (
            "s3://bucket/key",
            "auto",
            "directio",
            "s3://bucket/key: mount option `directio` is for local images: an image in object storage is read through its disk cache",
        ),
    ] {
        let out = common::foliofs(["mount", "-t", fstype, "-o", opts, source, mnt.path().to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{source} -o {opts}");
        assert!(err.contains(want), "{source} -o {opts}: {err}");
        assert_eq!(super::lines(&err).len(), 1, "{err}");
        assert!(!common::is_mounted(mnt.path()));
    }
    for cmd in ["ls", "info", "fsck"] {
        let out = common::foliofs([cmd, "-o", "cache=/tmp/x", img.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("mount option `cache` is for images in object storage"),
            "{cmd}: {err}"
        );
    }
}
