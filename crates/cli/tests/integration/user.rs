//! Mounting as a user: the user `tests` mounts, reads and unmounts romfs,
//! EROFS and ramfs through fusermount3 (and with mount(2) inside a user
//! namespace of its own), lists and unmounts its mounts, and is refused in
//! one line what only root may have; `auto_unmount` outlives a killed
//! server; root's `dev` and `suid`.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{is_mounted, listing, server_pid, sh_as_user, FuseConf, Mount, TEST_USER};

/// How long a killed server's mount may take to go away.
const GONE: Duration = Duration::from_secs(15);

/// A tree of every entry type, and its romfs image, where a user can
/// read both.
struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    romfs: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    common::open_to_all(tmp.path());
    let src = tmp.path().join("src");
    common::every_type_tree(&src);
    let romfs = tmp.path().join("tree.romfs");
    common::build_romfs(&src, &romfs);
    Fixture {
        _tmp: tmp,
        src,
        romfs,
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Panics with the command's output unless it exited 0; returns stdout.
fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `foliofs ARGS` as the test user.
fn foliofs_as_user<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    common::as_user(TEST_USER, common::bin(), args, Duration::from_secs(60))
}

/// The lines of two listings that differ, for a readable failure.
fn diff(want: &str, got: &str) -> String {
    let w: std::collections::BTreeSet<&str> = want.lines().collect();
    let g: std::collections::BTreeSet<&str> = got.lines().collect();
    let mut out: Vec<String> = w.difference(&g).map(|l| format!("- {l}")).collect();
    out.extend(g.difference(&w).map(|l| format!("+ {l}")));
    out.join("\n")
}

fn assert_same_listing(want: &str, got: &str, what: &str) {
    assert!(
        want == got,
        "{what} differs from the source:\n{}",
        diff(want, got)
    );
}

/// `uid:gid` of `path` as `user` sees it.
fn owner_as(user: &str, path: &Path) -> String {
    ok(
        "stat",
        common::as_user(
            user,
            "stat",
            [
                std::ffi::OsStr::new("-c"),
                std::ffi::OsStr::new("%u:%g"),
                path.as_os_str(),
            ],
            Duration::from_secs(30),
        ),
    )
    .trim()
    .to_owned()
}

fn test_user_ids() -> String {
    let (u, g) = common::user_ids(TEST_USER).unwrap();
    format!("{u}:{g}")
}

/// The mount's line in `/proc/self/mountinfo`.
fn mount_line(dir: &Path) -> foliofs_fuse::MountInfo {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    foliofs_fuse::find_mount(&dir)
        .unwrap()
        .unwrap_or_else(|| panic!("{} is not mounted", dir.display()))
}

/// Whether `pid` runs (a zombie does not).
fn process_alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
}

fn sigkill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[test]
fn user_mounts_romfs_at_1k_largeblocks_and_directio() {
    require!("user-fuse");
    let fx = fixture();
    let want = listing(None, &fx.src);
    for opts in ["", "largeblocks", "directio"] {
        let m = Mount::as_user(TEST_USER, &fx.romfs, Some("romfs"), opts)
            .unwrap_or_else(|e| panic!("-o {opts:?}: {e}"));
        let info = mount_line(m.path());
        assert_eq!(info.user_id(), common::user_ids(TEST_USER).map(|i| i.0));
        for flag in ["ro", "nosuid", "nodev"] {
            assert!(
                info.mount_options.split(',').any(|o| o == flag),
                "-o {opts:?}: {flag} missing: {info:?}"
            );
        }
        let got = listing(Some(TEST_USER), m.path());
        assert_same_listing(&want, &got, &format!("romfs -o {opts:?}"));
        // romfs stores no owners: its files are the mounting user's.
        assert_eq!(
            owner_as(TEST_USER, &m.path().join("k1024")),
            test_user_ids()
        );
        m.unmount().unwrap();
    }
}

#[test]
fn romfs_uid_and_gid_override_the_mounting_user() {
    require!("user-fuse");
    let fx = fixture();
    let m = Mount::as_user(TEST_USER, &fx.romfs, None, "uid=123,gid=456").unwrap();
    assert_eq!(owner_as(TEST_USER, &m.path().join("k1024")), "123:456");
    m.unmount().unwrap();
}

#[test]
fn user_mounts_erofs() {
    require!("user-fuse", "mkfs.erofs");
    let fx = fixture();
    let img = fx.romfs.with_extension("erofs");
    common::mkfs_erofs::<&str>(&[], &img, &fx.src);
    let want = listing(None, &fx.src);
    for opts in ["", "directio"] {
        let m = Mount::as_user(TEST_USER, &img, Some("erofs"), opts)
            .unwrap_or_else(|e| panic!("-o {opts:?}: {e}"));
        let got = listing(Some(TEST_USER), m.path());
        assert_same_listing(&want, &got, &format!("EROFS -o {opts:?}"));
        // EROFS keeps the image's owners (root's here).
        assert_eq!(owner_as(TEST_USER, &m.path().join("k1024")), "0:0");
        m.unmount().unwrap();
    }
}

#[test]
fn user_ramfs_holds_a_copied_tree_and_writes_reads_and_removes() {
    require!("user-fuse");
    let tmp = tempfile::tempdir().unwrap();
    common::open_to_all(tmp.path());
    let src = tmp.path().join("src");
    let mut rng = common::rng(7);
    for (name, size) in [
        ("a", 0usize),
        ("b", 4095),
        ("c/d", 70_000),
        ("c/e/f", 1 << 20),
    ] {
        let p = src.join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, common::random_bytes(&mut rng, size)).unwrap();
    }
    std::os::unix::fs::symlink("c/d", src.join("link")).unwrap();

    let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "").unwrap();
    // The root is the mounting user's.
    assert_eq!(owner_as(TEST_USER, m.path()), test_user_ids());
    let copy = m.path().join("copy");
    ok(
        "cp -R",
        sh_as_user(TEST_USER, r#"cp -R "$1" "$2""#, &[&src, &copy]),
    );
    assert_same_listing(
        &listing(None, &src),
        &listing(Some(TEST_USER), &copy),
        "the copy in ramfs",
    );
    let script = r#"set -e
cd "$1"
head -c 3000000 /dev/urandom > f
cp f g
cmp f g
echo more >> g
[ "$(stat -c %s g)" = 3000005 ]
rm f g
rm -r copy
[ -z "$(ls -A)" ]
echo done"#;
    let out = ok(
        "write, read, remove",
        sh_as_user(TEST_USER, script, &[m.path()]),
    );
    assert_eq!(out.trim(), "done");
    m.unmount().unwrap();
}

/// A user's ramfs keeps its files in the server: the kernel takes backing
/// files only from a server with CAP_SYS_ADMIN of the machine, so asking
/// for passthrough by name is refused with that reason, and the mount
/// says which path its data takes.
#[test]
fn a_users_ramfs_serves_its_data_and_refuses_passthrough_by_name() {
    require!("user-fuse");
    let err = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "passthrough")
        .err()
        .expect("a user's ramfs mounted with passthrough");
    assert!(
        err.contains("passthrough") && err.contains("CAP_SYS_ADMIN"),
        "unclear refusal: {err}"
    );
    let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "").unwrap();
    let out = common::as_user(
        TEST_USER,
        common::bin(),
        ["mounts", "--stats"],
        std::time::Duration::from_secs(30),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(m.path().to_str().unwrap()))
        .unwrap_or_else(|| panic!("the mount is missing from `foliofs mounts`:\n{text}"));
    assert!(line.contains("data=server"), "{line}");
    m.unmount().unwrap();
}

#[test]
fn foliofs_mounts_lists_a_users_own_mounts() {
    require!("user-fuse");
    let theirs = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "").unwrap();
    let roots = Mount::new(Path::new("none"), Some("ramfs"), "").unwrap();
    let list = ok("foliofs mounts", foliofs_as_user(&["mounts"]));
    let dir = theirs.path().to_str().unwrap();
    let line = list
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(dir))
        .unwrap_or_else(|| panic!("{dir} is missing:\n{list}"));
    assert!(line.contains(" ramfs ") && line.contains("pid="), "{line}");
    assert!(
        !list.contains(roots.path().to_str().unwrap()),
        "root's mount is listed to the user:\n{list}"
    );
    // Root sees both, with what the user's server recorded.
    let all = text(&common::foliofs_ok(["mounts"]));
    let line = all
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(dir))
        .unwrap_or_else(|| panic!("{dir} is missing for root:\n{all}"));
    assert!(line.contains(" ramfs ") && line.contains("pid="), "{line}");
    theirs.unmount().unwrap();
    roots.unmount().unwrap();
}

#[test]
fn a_killed_users_server_leaves_no_mount_with_auto_unmount() {
    require!("user-fuse");
    // Unsupervised: its server's death is the mount's.
    let m = Mount::as_user(
        TEST_USER,
        Path::new("none"),
        Some("ramfs"),
        "auto_unmount,nosupervise",
    )
    .unwrap();
    sigkill(server_pid(Some(TEST_USER), m.path()));
    assert!(
        common::wait_until(GONE, || !is_mounted(m.path())),
        "{} is still mounted {GONE:?} after its server was killed",
        m.path().display()
    );
}

#[test]
fn a_killed_users_server_is_cleared_by_foliofs_umount() {
    require!("user-fuse");
    let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "nosupervise").unwrap();
    let pid = server_pid(Some(TEST_USER), m.path());
    sigkill(pid);
    assert!(common::wait_until(GONE, || !process_alive(pid)));
    assert!(is_mounted(m.path()), "gone without auto_unmount");
    // Mounting there again says what to run first.
    let dead = m.path().parent().unwrap().canonicalize().unwrap();
    let dead = dead.join(m.path().file_name().unwrap());
    let again = foliofs_as_user(&[
        std::ffi::OsStr::new("mount"),
        "-t".as_ref(),
        "ramfs".as_ref(),
        "none".as_ref(),
        m.path().as_os_str(),
    ]);
    let err = text(&again.stderr);
    assert!(
        !again.status.success()
            && err.contains(&format!("run `foliofs umount {}` first", dead.display())),
        "{err}"
    );
    ok(
        "foliofs umount",
        foliofs_as_user(&[std::ffi::OsStr::new("umount"), m.path().as_os_str()]),
    );
    assert!(!is_mounted(m.path()));
}

#[test]
fn a_killed_roots_server_leaves_no_mount_with_auto_unmount() {
    require!("fuse", "fusermount3");
    let m = Mount::new(Path::new("none"), Some("ramfs"), "auto_unmount,nosupervise").unwrap();
    sigkill(server_pid(None, m.path()));
    assert!(
        common::wait_until(GONE, || !is_mounted(m.path())),
        "{} is still mounted {GONE:?} after its server was killed",
        m.path().display()
    );
}

#[test]
fn a_users_mount_is_theirs_alone_without_allow_other() {
    require!("user-fuse");
    let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "mode=0755").unwrap();
    ok(
        "write",
        sh_as_user(TEST_USER, r#"echo hi > "$1/f""#, &[m.path()]),
    );
    let out = sh_as_user("nobody", r#"cat "$1/f""#, &[m.path()]);
    assert!(!out.status.success(), "nobody read the user's mount");
    assert!(
        text(&out.stderr).contains("Permission denied"),
        "{}",
        text(&out.stderr)
    );
    // Someone else's mount: not theirs to unmount.
    let out = common::as_user(
        "nobody",
        common::bin(),
        [std::ffi::OsStr::new("umount"), m.path().as_os_str()],
        Duration::from_secs(30),
    );
    let err = text(&out.stderr);
    assert!(!out.status.success() && is_mounted(m.path()));
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("mounted by tests (uid "), "{err}");
    m.unmount().unwrap();
}

#[test]
fn allow_other_needs_user_allow_other() {
    require!("user-fuse");
    {
        let _conf = FuseConf::set("#user_allow_other\n");
        let dir = common::user_tempdir(TEST_USER);
        let err = Mount::at_as(
            Some(TEST_USER),
            Path::new("none"),
            dir.path(),
            Some("ramfs"),
            "allow_other",
        )
        .err()
        .expect("allow_other mounted without user_allow_other");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("`allow_other` needs `user_allow_other` in /etc/fuse.conf"),
            "{err}"
        );
        assert!(!is_mounted(dir.path()));
    }
    let _conf = FuseConf::set("user_allow_other\n");
    let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "allow_other").unwrap();
    ok(
        "write",
        sh_as_user(TEST_USER, r#"echo hi > "$1/f""#, &[m.path()]),
    );
    let out = ok("read", sh_as_user("nobody", r#"cat "$1/f""#, &[m.path()]));
    assert_eq!(out, "hi\n");
    m.unmount().unwrap();
}

#[test]
fn what_a_user_may_not_have_is_refused_in_one_line() {
    require!("user-fuse");
    // A directory the user cannot write.
    let roots = tempfile::tempdir().unwrap();
    common::open_to_all(roots.path());
    let fx = fixture();
    let cases: [(&Path, &Path, &str, &str); 4] = [
        (
            Path::new("none"),
            roots.path(),
            "",
            "cannot write this directory",
        ),
        (&fx.romfs, roots.path(), "", "cannot write this directory"),
        (Path::new("none"), Path::new(""), "dev", "`dev` needs root"),
        (&fx.romfs, Path::new(""), "suid", "`suid` needs root"),
    ];
    for (source, dir, opts, why) in cases {
        let own = common::user_tempdir(TEST_USER);
        let dir = if dir.as_os_str().is_empty() {
            own.path()
        } else {
            dir
        };
        let fstype = if source == Path::new("none") {
            Some("ramfs")
        } else {
            None
        };
        let err = Mount::at_as(Some(TEST_USER), source, dir, fstype, opts)
            .err()
            .unwrap_or_else(|| panic!("{} -o {opts:?} mounted", dir.display()));
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.starts_with("foliofs: ") && err.contains(why), "{err}");
        assert!(!is_mounted(dir));
    }
}

/// `path` opened for writing; `Err` is the errno.
fn open_for_write(path: &Path) -> Result<(), i32> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

#[test]
fn root_dev_opens_device_nodes_in_images_and_ramfs() {
    require!("fuse");
    let fx = fixture();
    for (opts, want) in [("dev", Ok(())), ("", Err(libc::EACCES))] {
        let m = Mount::new(&fx.romfs, None, opts).unwrap();
        let info = mount_line(m.path());
        assert_eq!(
            info.mount_options.split(',').any(|o| o == "nodev"),
            want.is_err(),
            "{info:?}"
        );
        assert_eq!(
            open_for_write(&m.path().join("dev/null")),
            want,
            "romfs -o {opts:?}"
        );
        m.unmount().unwrap();

        let m = Mount::new(Path::new("none"), Some("ramfs"), opts).unwrap();
        common::mknod(&m.path().join("null"), libc::S_IFCHR | 0o666, 1, 3).unwrap();
        assert_eq!(
            open_for_write(&m.path().join("null")),
            want,
            "ramfs -o {opts:?}"
        );
        m.unmount().unwrap();
    }
}

#[test]
fn root_suid_keeps_set_user_id() {
    require!("user-fuse");
    let id = common::find_program("id").unwrap();
    let want_uid = common::user_ids(TEST_USER).unwrap().0.to_string();
    for (opts, euid) in [
        ("suid,allow_other", "0"),
        ("allow_other", want_uid.as_str()),
    ] {
        let m = Mount::new(Path::new("none"), Some("ramfs"), opts).unwrap();
        let prog = m.path().join("id");
        fs::copy(&id, &prog).unwrap();
        fs::set_permissions(&prog, fs::Permissions::from_mode(0o4755)).unwrap();
        let out = ok(
            "id -u",
            common::as_user(TEST_USER, &prog, ["-u"], Duration::from_secs(30)),
        );
        assert_eq!(out.trim(), euid, "-o {opts}");
        m.unmount().unwrap();
    }
}

#[test]
fn user_mounts_with_mount_2_in_a_user_namespace() {
    require!("user-fuse", "unshare");
    let probe = sh_as_user(TEST_USER, "unshare -Urm true", &[] as &[&str]);
    if !probe.status.success() {
        eprintln!(
            "skip: user::user_mounts_with_mount_2_in_a_user_namespace: needs unprivileged user namespaces ({})",
            text(&probe.stderr).trim()
        );
        return;
    }
    let dir = common::user_tempdir(TEST_USER);
    // Everything happens inside the namespace, whose mounts nobody outside
    // sees; the trap unmounts whatever way the script ends.
    let script = r#"exec unshare -Urm sh -c '
set -e
foliofs=$1 dir=$2
"$foliofs" mount -t ramfs none "$dir"
trap "\"$foliofs\" umount \"$dir\"" EXIT
echo hello > "$dir/f"
cat "$dir/f"
grep " $dir " /proc/self/mountinfo | grep -q " - fuse.foliofs " && echo mounted
"$foliofs" mounts | grep -q "^none $dir ramfs " && echo listed
' sh "$1" "$2""#;
    let out = ok(
        "a mount in unshare -Urm",
        sh_as_user(TEST_USER, script, &[common::bin().as_path(), dir.path()]),
    );
    assert_eq!(out, "hello\nmounted\nlisted\n");
    assert!(!is_mounted(dir.path()));
}
