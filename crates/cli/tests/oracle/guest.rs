//! The walker inside the romfs oracle's VM: `walker DIR` prints the walk of
//! DIR (see `walk.rs`) to stdout. `romfs-vm.sh` builds it static with plain
//! `rustc`, so it can use nothing but the standard library; file content is
//! hashed by busybox's `sha256sum`, the one hasher the guest has.

mod walk;

use std::fs::File;
use std::io::{self, BufWriter, ErrorKind, Read, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

/// Feeds the file to `sha256sum` ourselves, so a read error is the file's
/// own errno rather than whatever the hasher makes of it.
fn sha256sum(file: &mut File) -> io::Result<String> {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut input = child.stdin.take().expect("piped stdin");
    let mut buf = vec![0u8; 1 << 16];
    let fed = loop {
        match file.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => {
                if let Err(e) = input.write_all(&buf[..n]) {
                    break Err(e);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    drop(input);
    let out = child.wait_with_output()?;
    fed?;
    let hex = out.stdout.split(|&b| b == b' ').next().unwrap_or(b"");
    if !out.status.success() || hex.len() != 64 {
        return Err(io::Error::other("sha256sum failed"));
    }
    Ok(String::from_utf8_lossy(hex).into_owned())
}

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    if args.len() != 2 {
        eprintln!("usage: walker DIR");
        return ExitCode::from(2);
    }
    let lines = walk::walk(Path::new(&args[1]), &mut sha256sum);
    let mut out = BufWriter::new(io::stdout().lock());
    for l in lines {
        if writeln!(out, "{l}").is_err() {
            return ExitCode::FAILURE;
        }
    }
    if out.flush().is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
