//! Running the binary and other commands, every wait bounded.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `foliofs` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_foliofs"))
}

/// The workspace's top directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Runs `cmd` to completion, killing it after `timeout`; panics if it
/// cannot start or does not finish in time.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    try_run_timeout(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// Like [`run_timeout`], but says why in an `Err` instead of panicking, for
/// callers that turn a failure into a skip or clean up first.
pub fn try_run_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {desc}: {e}"))?;
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .map_err(|e| format!("waiting for {desc}: {e}"))?
        {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{desc} did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    })
}

/// Runs `foliofs ARGS` with a 120 s bound.
pub fn foliofs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_timeout(Command::new(bin()).args(args), Duration::from_secs(120))
}

/// Like [`foliofs`], but panics with its stderr unless it exits 0; returns stdout.
pub fn foliofs_ok<I, S>(args: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let out = foliofs(&args);
    assert!(
        out.status.success(),
        "foliofs {:?} failed ({}): {}",
        args,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Waits until `cond` holds, up to `timeout`; returns whether it did.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Runs `sh -ec SCRIPT` in `dir` (bounded by 300 s), panicking with its
/// output unless it succeeds.
pub fn sh_in(dir: &Path, script: &str) {
    let out = run_timeout(
        Command::new("sh").arg("-ec").arg(script).current_dir(dir),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `cmd`'s process run under `bytes` of address space
/// (`RLIMIT_AS`), so a test sees an allocation it could not back fail
/// rather than the machine's memory fill.
pub fn limit_address_space(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and touches only this child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
