//! `foliofs bench all --quick` runs for real and reports every section with
//! the kernel's rows beside foliofs's; as a user, with foliofs's rows and
//! a skip line on each kernel row that needs root.

use crate::common;

use std::time::Duration;

#[test]
fn quick_bench_reports_every_section_with_kernel_rows() {
    require!("fuse");
    // The bench drops the machine's caches between its runs.
    let _alone = common::benching();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let plots = dir.path().join("plots");
    let out = common::run_timeout(
        std::process::Command::new(common::bin())
            .args(["bench", "all", "--quick", "--runs", "1", "--json"])
            .arg(&json)
            .arg("--plot")
            .arg(&plots),
        Duration::from_secs(600),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let sections = v["sections"].as_array().unwrap();
    let names: Vec<&str> = sections
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "seq",
            "tree",
            "ramfs",
            "startup",
            "unpack",
            "smallfiles",
            "realstart",
            "bigdir",
            "image",
            "image-lookups"
        ]
    );
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for s in sections {
        let rows = s["rows"].as_array().unwrap();
        let measured = |kind: &str| {
            rows.iter()
                .filter(|r| r["kind"] == kind && r["note"].is_null())
                .filter(|r| {
                    r["runs"]
                        .as_object()
                        .is_some_and(|m| m.values().all(|v| !v.as_array().unwrap().is_empty()))
                })
                .count()
        };
        assert!(
            measured("foliofs") > 0,
            "{}: no foliofs row measured\n{stdout}",
            s["name"]
        );
        // The unpack section's kernel-kind rows are mkfs.erofs's, which
        // need one that takes a tar (Debian's 1.5 does not).
        if root && (s["name"] != "unpack" || mkfs_erofs_takes_tar()) {
            assert!(
                measured("kernel") > 0,
                "{}: no kernel row measured\n{stdout}",
                s["name"]
            );
        }
        for r in rows {
            assert!(
                !r["failed"].as_bool().unwrap(),
                "{}: row failed: {r}",
                s["name"]
            );
        }
        // Every table names the section and its reference row.
        assert!(stdout.contains("(ref)"), "{stdout}");
    }
    // Each ramfs row says how its mount settled on polling, read from the
    // mount's record: the row that asks for none shows none.
    let smallfiles = sections.iter().find(|s| s["name"] == "smallfiles").unwrap();
    let polling = smallfiles["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .find(|n| n.starts_with("polling each mount settled on"))
        .unwrap_or_else(|| panic!("no polling line\n{stdout}"));
    assert!(
        polling.contains("foliofs ramfs, nospin: nospin;"),
        "{polling}"
    );
    assert!(
        polling.contains("foliofs ramfs: spin=1000") || polling.contains("foliofs ramfs: nospin"),
        "{polling}"
    );
    for chart in ["seq-dd.svg", "tree-find_ls.svg", "ramfs-write.svg"] {
        let text = std::fs::read_to_string(plots.join(chart)).unwrap();
        assert!(text.starts_with("<svg") || text.contains("<svg"), "{chart}");
    }
}

/// `foliofs bench remote --quick` starts its own SeaweedFS, measures the
/// local file and the S3 image with a cold and a warm cache, and says
/// what the cold runs fetched for what they read.
#[test]
fn quick_remote_bench_measures_cold_warm_and_local() {
    require!("fuse", "weed", "mkfs.erofs");
    // The bench drops the machine's caches before each run.
    let _alone = common::benching();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let out = common::run_timeout(
        std::process::Command::new(common::bin())
            .args(["bench", "remote", "--quick", "--runs", "1", "--json"])
            .arg(&json),
        Duration::from_secs(600),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let s = &v["sections"][0];
    assert_eq!(s["name"], "remote");
    let rows = s["rows"].as_array().unwrap();
    // local, cold, cold with -o digest, warm
    assert_eq!(rows.len(), 4, "{stdout}");
    for r in rows {
        assert!(r["note"].is_null(), "{r}");
        for key in ["seq", "startup", "find_ls"] {
            assert_eq!(
                r["runs"][key].as_array().map(Vec::len),
                Some(1),
                "{key}: {r}"
            );
        }
    }
    assert!(stdout.contains("bytes fetched / bytes read"), "{stdout}");
}

/// `foliofs bench registry --quick` starts its own docker-registry, pushes
/// its image with skopeo, and pulls it to a root file system each way:
/// foliofs as root and as a user, skopeo with umoci, and (with a
/// mkfs.erofs that reads tars) skopeo with mkfs.erofs under overlayfs.
#[test]
fn quick_registry_bench_pulls_every_way() {
    require!(
        "root",
        "fuse",
        "user-fuse",
        "docker-registry",
        "skopeo",
        "umoci"
    );
    let _alone = common::benching();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let mut cmd = std::process::Command::new(common::bin());
    cmd.args(["bench", "registry", "--quick", "--runs", "1", "--json"])
        .arg(&json);
    let mkfs = crate::erofs::erofs_utils_193_bin();
    if let Some(bin) = &mkfs {
        cmd.arg("--mkfs-erofs").arg(bin.join("mkfs.erofs"));
    }
    let out = common::run_timeout(&mut cmd, Duration::from_secs(600));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let s = &v["sections"][0];
    assert_eq!(s["name"], "registry");
    let rows = s["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{stdout}");
    for (i, r) in rows.iter().enumerate() {
        // The mkfs.erofs row needs one that reads tars.
        if i == 2 && mkfs.is_none() {
            assert!(r["note"].as_str().unwrap().contains("--tar"), "{r}");
            continue;
        }
        assert!(r["note"].is_null(), "{r}");
        for key in ["pull", "byte", "first", "next", "total"] {
            assert_eq!(
                r["runs"][key].as_array().map(Vec::len),
                Some(1),
                "{key}: {r}"
            );
        }
    }
    // The lazy rows say what they fetched for what they read: about the
    // files' bytes, the metadata and the trees beside them.
    let notes = s["notes"].to_string();
    let ratio: f64 = notes
        .split("lazy, root: ")
        .nth(1)
        .and_then(|r| r.split("1st run ").nth(1))
        .and_then(|r| r.split(' ').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no lazy traffic in {notes}"));
    assert!(
        (0.9..1.5).contains(&ratio),
        "fetched / read {ratio}: {notes}"
    );
    // Nothing of the run stays mounted.
    let left: Vec<_> = common::mount_points()
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("foliofs-bench."))
        .collect();
    assert!(left.is_empty(), "left mounted: {left:?}");
}

/// `foliofs bench all --quick` as the user `tests`: every section measures
/// foliofs, each kernel row a user cannot mount says why in its skip line,
/// cold runs say how they were made cold, and nothing stays mounted.
#[test]
fn quick_bench_as_a_user_measures_foliofs_and_says_what_needs_root() {
    require!("user-fuse", "mkfs.erofs");
    let user = common::TEST_USER;
    let (uid, _) = common::user_ids(user).unwrap();
    let work = common::user_tempdir(user);
    let json = work.path().join("bench.json");
    let run = common::try_run_timeout(
        common::user_command(user, common::bin())
            .args(["bench", "all", "--quick", "--runs", "1", "--workdir"])
            .arg(work.path())
            .arg("--json")
            .arg(&json),
        Duration::from_secs(600),
    );
    // Whatever happened, nothing of the run may stay mounted.
    let left: Vec<_> = common::mount_points()
        .into_iter()
        .filter(|p| p.starts_with(work.path()))
        .collect();
    for p in &left {
        common::force_unmount(p);
    }
    let out = run.unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench as {user} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(left.is_empty(), "left mounted: {left:?}");
    let kept: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        kept,
        ["bench.json"],
        "the work directory was not cleaned up"
    );
    for e in std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let mine = std::os::unix::fs::MetadataExt::uid(&e.metadata().unwrap()) == uid;
        assert!(
            !(mine && name.starts_with("foliofs-bench.")),
            "/dev/shm/{name} left behind"
        );
    }

    // Said once at the start: what needs root, and why.
    for why in [
        "mounting the kernel's erofs, squashfs, ramfs and tmpfs, and loop devices, need root",
        "/proc/sys/vm/drop_caches",
        "/sys/class/bdi",
    ] {
        assert!(stderr.contains(why), "no {why:?} in:\n{stderr}");
    }
    // And on each row that needs it.
    for skip in [
        "skipped: needs root: mounting the kernel's erofs (mount(2) of the image file)",
        "skipped: needs root: a loop device to mount the kernel's squashfs on",
        "skipped: needs root: mounting a new kernel ramfs",
        "skipped: needs root: mounting a new kernel tmpfs",
    ] {
        assert!(stdout.contains(skip), "no {skip:?} in:\n{stdout}");
    }
    // Cold is never warm in disguise: the notes say how runs were made cold.
    assert!(
        stdout.contains("posix_fadvise(POSIX_FADV_DONTNEED)"),
        "{stdout}"
    );
    assert!(!stdout.contains("drops the page cache first"), "{stdout}");

    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let sections = v["sections"].as_array().unwrap();
    for name in ["seq", "tree", "ramfs", "startup"] {
        let s = sections
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} section\n{stdout}"));
        let rows = s["rows"].as_array().unwrap();
        let measured = |r: &&serde_json::Value| {
            r["note"].is_null()
                && r["runs"].as_object().is_some_and(|m| {
                    !m.is_empty() && m.values().all(|v| !v.as_array().unwrap().is_empty())
                })
        };
        assert!(
            rows.iter()
                .filter(|r| r["kind"] == "foliofs")
                .any(|r| measured(&r)),
            "{name}: no foliofs row measured\n{stdout}"
        );
        for r in rows {
            assert!(!r["failed"].as_bool().unwrap(), "{name}: row failed: {r}");
            // A kernel row either ran without root or says it needs root.
            if r["kind"] == "kernel" && !measured(&r) {
                let note = r["note"].as_str().unwrap_or_default();
                assert!(
                    note.starts_with("needs root: ") || r["label"] == "kernel tmpfs at /dev/shm",
                    "{name}: {r}"
                );
            }
        }
    }
}

/// Whether the `mkfs.erofs` on PATH builds from a tar (`--tar`, 1.6 on).
fn mkfs_erofs_takes_tar() -> bool {
    std::process::Command::new("mkfs.erofs")
        .arg("--help")
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout).contains("--tar")
                || String::from_utf8_lossy(&o.stderr).contains("--tar")
        })
}
