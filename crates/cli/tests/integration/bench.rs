//! `foliofs bench all --quick` runs for real and reports every section with
//! the kernel's rows beside foliofs's.

use crate::common;

use std::time::Duration;

#[test]
fn quick_bench_reports_all_four_sections_with_kernel_rows() {
    require!("fuse");
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
    assert_eq!(names, ["seq", "tree", "ramfs", "startup"]);
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
        if root {
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
    for chart in ["seq-dd.svg", "tree-find_ls.svg", "ramfs-write.svg"] {
        let text = std::fs::read_to_string(plots.join(chart)).unwrap();
        assert!(text.starts_with("<svg") || text.contains("<svg"), "{chart}");
    }
}
