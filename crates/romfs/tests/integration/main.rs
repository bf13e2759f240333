//! The romfs library's integration tests, one binary.

use std::io::Write;

mod damage;
mod mutations;
mod smoke_walk;

/// Whether `program` is on PATH; when not, prints why `test` is skipped.
fn have(test: &str, program: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()));
    if !found {
        // Past the test harness's capture: a passing run says what it skipped.
        let _ = writeln!(
            std::io::stderr().lock(),
            "skip: {test}: needs {program} (`bash scripts/setup` installs it)"
        );
    }
    found
}
