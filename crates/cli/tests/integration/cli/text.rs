//! What the binary says besides file contents: shell completions and
//! manual pages generated from its command definitions, and error messages.

use std::process::{Command, Output};

fn foliofs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_foliofs"))
        .args(args)
        .output()
        .expect("run foliofs")
}

fn stdout_ok(args: &[&str]) -> String {
    let out = foliofs(args);
    assert!(
        out.status.success(),
        "foliofs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The subcommand names `foliofs --help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let help = stdout_ok(&["--help"]);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_owned)
        .collect();
    for known in ["mount", "mkfs", "extract", "completions", "man"] {
        assert!(names.iter().any(|n| n == known), "{known} in {names:?}");
    }
    names
}

#[test]
fn completion_scripts_know_every_subcommand() {
    let names = subcommands();
    for shell in ["bash", "zsh", "fish"] {
        let script = stdout_ok(&["completions", shell]);
        for n in &names {
            assert!(
                script
                    .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                    .any(|w| w == n),
                "{shell} completion does not mention {n}"
            );
        }
    }
    let bash = stdout_ok(&["completions", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("foliofs.bash");
    std::fs::write(&file, bash).unwrap();
    if let Ok(check) = Command::new("bash").arg("-n").arg(&file).output() {
        assert!(
            check.status.success(),
            "bash -n: {}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
}

#[test]
fn man_page_is_roff_naming_every_subcommand() {
    let names = subcommands();
    let page = stdout_ok(&["man"]);
    assert!(page.contains(".TH foliofs 1"), "{page}");
    assert!(page.contains(".SH NAME") && page.contains(".SH SUBCOMMANDS"));
    for n in &names {
        // roff spells a hyphen `\-`.
        let entry = format!("foliofs\\-{n}(1)");
        assert!(page.contains(&entry), "man page lacks {entry}");
        let sub = stdout_ok(&["man", n]);
        assert!(sub.contains(&format!(".TH foliofs-{n} 1")), "{sub}");
    }
    let nested = stdout_ok(&["man", "mkfs", "romfs"]);
    assert!(nested.contains(".TH foliofs-mkfs-romfs 1"));
    assert!(!foliofs(&["man", "no-such-command"]).status.success());

    // Rendered by man(1) without a warning, where it is installed.
    if Command::new("man").arg("--version").output().is_err() {
        eprintln!("man(1) is not installed; not rendering the page");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("foliofs.1");
    std::fs::write(&file, &page).unwrap();
    let shown = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(&file)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "man -l failed: {shown:?}");
    assert!(
        shown.stderr.is_empty(),
        "man warns: {}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(text.contains("SUBCOMMANDS") && text.contains("foliofs-extract(1)"));
}

fn assert_cause_once(out: &Output, cause: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {err}");
    assert_eq!(
        err.matches(cause).count(),
        1,
        "{cause:?} not once in: {err}"
    );
}

#[test]
fn errors_name_each_cause_once() {
    let t = tempfile::tempdir().unwrap();
    let path = |name: &str| t.path().join(name).to_str().unwrap().to_owned();
    let missing = path("missing");
    assert_cause_once(&foliofs(&["info", &missing]), "No such file or directory");

    // A mount onto a missing directory fails before mount(2); that error
    // carries its cause in its own message and as its source, and travels
    // from the background server to the command as text.
    std::fs::create_dir(path("src")).unwrap();
    std::fs::write(path("src") + "/f", b"x").unwrap();
    stdout_ok(&["mkfs", "romfs", "-q", &path("src"), &path("img")]);
    let img = path("img");
    for args in [
        vec!["mount", &img, &missing],
        vec!["mount", "-f", &img, &missing],
    ] {
        assert_cause_once(&foliofs(&args), "No such file or directory");
    }
}

#[test]
fn inspection_refuses_options_that_only_a_mount_honours() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("f"), b"x").unwrap();
    let img = t.path().join("img").to_str().unwrap().to_owned();
    stdout_ok(&["mkfs", "romfs", "-q", src.to_str().unwrap(), &img]);

    for cmd in ["info", "ls"] {
        let out = foliofs(&[cmd, "-o", "uid=5", &img]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd} -o uid=5 succeeded");
        assert_eq!(
            err,
            "foliofs: mount option `uid` only applies to `foliofs mount`: it does not change how an image is read\n"
        );
    }
    // `device=` is for EROFS: romfs has nowhere to take it.
    let out = foliofs(&["info", "-o", "device=/dev/null", &img]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("only for EROFS"));
    // Options that change how the image is read are taken.
    assert!(stdout_ok(&["info", "-o", "directio", &img]).contains("romfs"));
    let ls = stdout_ok(&["ls", "-o", "blocksize=1K,nodirectio", &img]);
    assert!(ls.lines().any(|l| l == "f"), "{ls}");
}
