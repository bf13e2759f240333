//! Progress of long commands (`mkfs`, `extract`, `fsck`), drawn on stderr
//! only when stderr is a terminal: indicatif's stderr target hides itself
//! otherwise, so scripts and logs see nothing but results.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// How often a spinner turns while the work reports nothing itself.
const TICK: Duration = Duration::from_millis(120);

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).expect("a valid template")
}

fn ticking(template: &str, msg: String) -> ProgressBar {
    // Cleared however it ends, so an error message starts on a clean line.
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
        .with_finish(ProgressFinish::AndClear)
        .with_style(style(template))
        .with_message(msg);
    if !bar.is_hidden() {
        bar.enable_steady_tick(TICK);
    }
    bar
}

/// A spinner saying what is being done, for work that reports nothing.
pub fn spinner(what: String) -> ProgressBar {
    ticking("{spinner} {msg} {elapsed}", what)
}

/// Turns `bar` into a bar filled by its position out of `total`, once the
/// work reports how far it has got; its message says how far in words.
pub fn show_bar(bar: &ProgressBar, total: u64) {
    bar.disable_steady_tick();
    bar.set_style(style("{wide_bar} {msg} {elapsed}/{duration}"));
    bar.set_length(total);
}

/// A count of bytes written (its position) and of what `msg` says, for
/// work whose size is not known in advance.
pub fn counter(msg: String) -> ProgressBar {
    ticking("{spinner} {msg}, {binary_bytes} written {elapsed}", msg)
}
