//! containerd's mkfs.erofs command lines, as its EROFS differ, its index
//! mode and its converter run them (the tar piped on standard input, the
//! image the only argument), through `foliofs mkfs erofs` and through a
//! `mkfs.erofs` link to foliofs: each image is mounted by the kernel (an
//! index image with its tar appended, as containerd mounts it) and walked
//! equal to the source tree and to mkfs.erofs 1.9.3's image of the same
//! command line, and carries the UUID given with -U. The plugin's probe,
//! `mkfs.erofs --help` mentioning `--tar=`, holds for both spellings, and
//! what foliofs does not implement is refused by name.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::super::walk::{assert_same, walk_mounted, KernelMount, Tree};
use super::{comparable, kernel_walk, kernel_walk_with, tar_of};
use crate::common;

const UUID: &str = "5a1e0c7d-9b3f-4e21-8c6a-0f4d2b7e9a13";

/// The UUID's bytes, as the superblock holds them.
fn uuid_bytes() -> [u8; 16] {
    let hex: String = UUID.chars().filter(|&c| c != '-').collect();
    std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
}

/// How mkfs.erofs is run: foliofs's own subcommand, a link to foliofs
/// named `mkfs.erofs`, or erofs-utils 1.9.3's mkfs.erofs.
#[derive(Clone, Copy, Debug)]
enum Spelling<'a> {
    Subcommand,
    Link(&'a Path),
    ErofsUtils(&'a Path),
}

impl Spelling<'_> {
    /// The program and the arguments that come before containerd's.
    fn argv(self) -> Vec<OsString> {
        match self {
            Spelling::Subcommand => vec![
                common::bin().into_os_string(),
                "mkfs".into(),
                "erofs".into(),
            ],
            Spelling::Link(p) | Spelling::ErofsUtils(p) => vec![p.as_os_str().to_owned()],
        }
    }
}

/// A `mkfs.erofs` in a directory of its own: a symbolic link to foliofs.
fn link_in(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let link = bin.join("mkfs.erofs");
    std::os::unix::fs::symlink(common::bin(), &link).unwrap();
    link
}

/// Runs `SPELLING ARGS` in `dir` with `tar` piped to its standard input,
/// as containerd feeds it a layer's stream.
fn piped(spelling: Spelling, args: &[&str], tar: &Path, dir: &Path) -> Output {
    common::run_timeout(
        Command::new("sh")
            .arg("-c")
            .arg(r#"tar=$1; shift; cat "$tar" | "$@""#)
            .arg("sh")
            .arg(tar)
            .args(spelling.argv())
            .args(args)
            .current_dir(dir),
        Duration::from_secs(600),
    )
}

/// As [`piped`], panicking with the error unless it succeeds and is
/// silent (every command line here has `--quiet`).
fn piped_ok(spelling: Spelling, args: &[&str], tar: &Path, dir: &Path) {
    let out = piped(spelling, args, tar, dir);
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "{spelling:?} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `(blkszbits, build time, UUID)` from an image's superblock.
fn superblock(img: &Path) -> (u8, u64, [u8; 16]) {
    let raw = fs::read(img).unwrap();
    let sb = &raw[1024..1024 + 128];
    (
        sb[0x0C],
        u64::from_le_bytes(sb[0x18..0x20].try_into().unwrap()),
        sb[0x30..0x40].try_into().unwrap(),
    )
}

/// The source tree for every command line: every entry type but sockets
/// (tar stores none), and its canonical tar.
fn layer(dir: &Path) -> (PathBuf, PathBuf) {
    let src = dir.join("src");
    common::every_type_tree(&src);
    fs::remove_file(src.join("dev/socket")).unwrap();
    let tar = dir.join("layer.tar");
    tar_of(&src, &tar);
    (src, tar)
}

/// The kernel's walk of the image `args` made in `dir`, checked as
/// [`kernel_walk`] does; an index image is walked as containerd mounts
/// it, with the tar appended, and also with the tar as its device.
fn walk(dir: &Path, index: bool, tar: &Path) -> Tree {
    let img = dir.join("layer.erofs");
    if !index {
        return kernel_walk(&img);
    }
    let with_device = kernel_walk_with(&img, Some(tar));
    let both = dir.join("both");
    let mut flat = fs::read(&img).unwrap();
    flat.extend(fs::read(tar).unwrap());
    fs::write(&both, flat).unwrap();
    let appended = walk_mounted(KernelMount::new(&both, "").path());
    assert_same(
        "[index][tar] (device= is 'kernel')",
        &with_device,
        &appended,
    );
    appended
}

/// Builds the image of `args` each way into its own directory under
/// `tmp` and checks it: the kernel walks it equal to `src` (all mtimes
/// `time` when -T sets them), its UUID is -U's and its blocks are
/// `blkszbits`; mkfs.erofs 1.9.3's image (where built) walks the same
/// and has the same UUID and block size. `bin` is erofs-utils 1.9.3's
/// bin directory, if built.
fn containerd_line(
    bin: Option<PathBuf>,
    tmp: &Path,
    src: &Path,
    tar: &Path,
    args: &[&str],
    blkszbits: u8,
) {
    let index = args.contains(&"--tar=i");
    let time = args
        .iter()
        .find_map(|a| a.strip_prefix("-T"))
        .map(|t| t.parse::<i64>().unwrap())
        .filter(|_| !args.contains(&"--mkfs-time"));
    let want = comparable(walk_mounted(src), time);
    let link_dir = tmp.join("link");
    let link = link_in(&link_dir);
    let mut ways = vec![
        ("foliofs mkfs erofs", Spelling::Subcommand),
        ("mkfs.erofs -> foliofs", Spelling::Link(&link)),
    ];
    let theirs = bin.as_ref().map(|b| b.join("mkfs.erofs"));
    if let Some(t) = &theirs {
        ways.push(("mkfs.erofs 1.9.3", Spelling::ErofsUtils(t)));
    }
    let mut walks = Vec::new();
    for (what, spelling) in ways {
        let dir = tmp.join(what.replace([' ', '>'], "_"));
        fs::create_dir_all(&dir).unwrap();
        piped_ok(spelling, args, tar, &dir);
        let img = dir.join("layer.erofs");
        let (bits, build_time, uuid) = superblock(&img);
        assert_eq!(uuid, uuid_bytes(), "{what} {args:?}: the UUID is not -U's");
        assert_eq!(bits, blkszbits, "{what} {args:?}: block size");
        if args.contains(&"-T0") {
            assert_eq!(build_time, 0, "{what} {args:?}: build time");
        }
        let got = match spelling {
            // Checked only as the kernel reads it: foliofs's library and
            // both fscks are for foliofs's images.
            Spelling::ErofsUtils(_) if index => {
                let both = dir.join("both");
                let mut flat = fs::read(&img).unwrap();
                flat.extend(fs::read(tar).unwrap());
                fs::write(&both, flat).unwrap();
                walk_mounted(KernelMount::new(&both, "").path())
            }
            Spelling::ErofsUtils(_) => walk_mounted(KernelMount::new(&img, "").path()),
            _ => walk(&dir, index, tar),
        };
        let mut got = comparable(got, None);
        let mut want = want.clone();
        if let Spelling::ErofsUtils(_) = spelling {
            // mkfs.erofs 1.9.3 writes an inode whose mtime has the build
            // time's seconds in the compact form, which has no
            // nanoseconds: it keeps a tar's sub-second mtimes only when
            // the seconds differ. foliofs keeps them always.
            for t in [&mut got, &mut want] {
                t.values_mut().for_each(|n| n.mtime.1 = 0);
            }
        }
        assert_same(
            &format!("{what} {args:?} against the source tree"),
            &want,
            &got,
        );
        walks.push((what, got));
    }
    // The images are held to each other as well, which also compares what
    // the source's walk cannot show: mkfs.erofs's against foliofs's, both
    // to the second.
    let (first, w0) = &walks[0];
    for (what, w) in &walks[1..] {
        let mut w0 = w0.clone();
        if what.starts_with("mkfs.erofs 1.9.3") {
            w0.values_mut().for_each(|n| n.mtime.1 = 0);
        }
        assert_same(&format!("{args:?}: {what} ({first} is 'kernel')"), &w0, w);
    }
}

#[test]
fn the_differs_command_line() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let (src, tar) = layer(tmp.path());
    let args = [
        "--tar=f",
        "--aufs",
        "--quiet",
        "-Enoinline_data",
        "-b4096",
        "-U",
        UUID,
        "layer.erofs",
    ];
    containerd_line(
        erofs_utils_193!(),
        &tmp.path().join("plain"),
        &src,
        &tar,
        &args,
        12,
    );
}

#[test]
fn the_differs_command_line_with_the_suggested_mkfs_options() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let (src, tar) = layer(tmp.path());
    let args = [
        "--tar=f",
        "--aufs",
        "--quiet",
        "-Enoinline_data",
        "-b4096",
        "-T0",
        "--mkfs-time",
        "--sort=none",
        "-U",
        UUID,
        "layer.erofs",
    ];
    // --mkfs-time: the build time is 0, every entry keeps its mtime.
    containerd_line(
        erofs_utils_193!(),
        &tmp.path().join("options"),
        &src,
        &tar,
        &args,
        12,
    );
}

#[test]
fn the_index_command_line_gives_512_byte_blocks_as_mkfs_erofs_does() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let (src, tar) = layer(tmp.path());
    let args = [
        "--tar=i",
        "--aufs",
        "--quiet",
        "-b4096",
        "-U",
        UUID,
        "layer.erofs",
    ];
    // -b4096 gives way to the tar's 512-byte blocks, in both tools.
    containerd_line(
        erofs_utils_193!(),
        &tmp.path().join("index"),
        &src,
        &tar,
        &args,
        9,
    );
}

#[test]
fn the_converters_command_line() {
    require!("root", "kernel-erofs", "tar");
    let tmp = tempfile::tempdir().unwrap();
    let (src, tar) = layer(tmp.path());
    let args = [
        "--tar=f",
        "--aufs",
        "--quiet",
        "-zlz4hc,12",
        "-C65536",
        "-U",
        UUID,
        "layer.erofs",
    ];
    containerd_line(
        erofs_utils_193!(),
        &tmp.path().join("lz4hc"),
        &src,
        &tar,
        &args,
        12,
    );
    // Compressed, well below the tar's size.
    let img = tmp.path().join("lz4hc/foliofs_mkfs_erofs/layer.erofs");
    assert!(fs::metadata(img).unwrap().len() < fs::metadata(&tar).unwrap().len());
}

/// The plugin's probe: `mkfs.erofs --help` mentions `--tar=`.
#[test]
fn help_mentions_tar_equals_both_ways() {
    let tmp = tempfile::tempdir().unwrap();
    let link = link_in(tmp.path());
    for (what, mut cmd) in [
        ("foliofs mkfs erofs --help", {
            let mut c = Command::new(common::bin());
            c.args(["mkfs", "erofs", "--help"]);
            c
        }),
        ("mkfs.erofs --help", {
            let mut c = Command::new(&link);
            c.arg("--help");
            c
        }),
    ] {
        let out = common::run_timeout(&mut cmd, Duration::from_secs(60));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{what}: {out:?}");
        assert!(text.contains("--tar="), "{what}:\n{text}");
    }
    let out = common::run_timeout(Command::new(&link).arg("--help"), Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("mkfs.erofs [OPTIONS] <IMAGE> [SOURCE]"),
        "{text}"
    );
}

/// Options of mkfs.erofs 1.9.3 that foliofs does not implement, and the
/// values of shared ones it cannot honour, are refused in one line that
/// names them, both ways, leaving no image; run as mkfs.erofs, two
/// positionals are mkfs.erofs's `IMAGE SOURCE`.
#[test]
fn what_foliofs_does_not_implement_is_refused_by_name() {
    require!("tar");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"data\n").unwrap();
    let tar = tmp.path().join("layer.tar");
    tar_of(&src, &tar);
    let link = link_in(tmp.path());
    let cases: &[(&[&str], &str)] = &[
        (&["--chunksize=4096"], "--chunksize"),
        (&["--exclude-path", "f"], "--exclude-path"),
        (&["-d0"], "-d"),
        (&["-x1"], "-x"),
        (&["--ovlfs-strip=1"], "--ovlfs-strip"),
        (&["--sort=path"], "--sort=path"),
        (&["--all-time"], "--all-time"),
        (&["-Eall-fragments"], "-E all-fragments"),
        (&["-zlzma"], "-z lzma"),
    ];
    for spelling in [Spelling::Subcommand, Spelling::Link(&link)] {
        for (extra, expect) in cases {
            let mut args = vec!["--tar=f", "--quiet"];
            args.extend_from_slice(extra);
            args.push("layer.erofs");
            let out = piped(spelling, &args, &tar, tmp.path());
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{spelling:?} {args:?} was accepted");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains(expect),
                "{args:?}: expected {expect:?} in {err}"
            );
            assert!(
                !tmp.path().join("layer.erofs").exists(),
                "{args:?} left an image"
            );
        }
    }
    // No --tar, no SOURCE: nothing to read from.
    let out = piped(
        Spelling::Link(&link),
        &["-q", "layer.erofs"],
        &tar,
        tmp.path(),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no SOURCE"));
    // mkfs.erofs's order, IMAGE SOURCE, under its name; foliofs's,
    // SOURCE IMAGE, under its own; the same image either way.
    let img = tmp.path().join("as-link.erofs");
    let out = common::run_timeout(
        Command::new(&link).args([OsStr::new("-q"), img.as_os_str(), src.as_os_str()]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{out:?}");
    let sub = tmp.path().join("as-subcommand.erofs");
    common::foliofs_ok([
        OsStr::new("mkfs"),
        OsStr::new("erofs"),
        OsStr::new("-q"),
        src.as_os_str(),
        sub.as_os_str(),
    ]);
    assert!(fs::read(&img).unwrap() == fs::read(&sub).unwrap());
}
