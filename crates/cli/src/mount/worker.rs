//! A server under a supervisor (`supervise.rs`): it serves the open files
//! of a connection the supervisor holds, handed over by description
//! (`--handoff`), and neither mounts nor unmounts.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;

use anyhow::Context;

use super::serve::{config, gauges, push_option, spin_option};
use super::source::Opened;
use super::MountArgs;
use crate::options::MountOpts;

/// Serves the handed-over connection until the mount is gone; reports
/// readiness on `ready` (the supervisor's pipe).
pub(super) fn serve(
    args: &MountArgs,
    source: &Path,
    opts: &MountOpts,
    opened: Opened,
    handoff: &str,
    ready: Option<File>,
) -> anyhow::Result<i32> {
    let handoff = match foliofs_fuse::supervise::held::Handoff::parse(handoff) {
        Ok(h) => h,
        Err(e) => return super::report_failure(ready, e.into()),
    };
    let mut cfg = config(args, source, opts, &opened);
    cfg.server.io_uring = false;
    if args.restarted {
        // What the first server pushed is in the kernel's cache, or was
        // dropped from it for memory: either way not pushed again. A
        // profile recorded from here on would miss the start.
        cfg.server.push_budget = 0;
        if cfg.server.record.take().is_some() {
            log::warn!("record=: a restarted server records no profile");
        }
        cfg.server.profile = None;
    }
    let mount_id = handoff.mount_id();
    let mounted = match foliofs_fuse::supervise::held::resume(opened.fs.clone(), &cfg, handoff) {
        Ok(m) => m,
        Err(e) => return super::report_failure(ready, e.into()),
    };
    let stats = foliofs_fuse::records::published::publish(
        mount_id,
        cfg.server.requests.clone(),
        gauges(source, opts, opened.gauge),
    );
    if let Some(mut r) = ready {
        let mut shown = opened.shown.clone();
        push_option(&mut shown, &spin_option(cfg.spin));
        if opened.format == "ramfs" {
            let passed = opened.passthrough.as_ref().is_some_and(|(p, _)| p.active());
            push_option(
                &mut shown,
                if passed {
                    "data=passthrough"
                } else {
                    "data=server"
                },
            );
        }
        // What a restart keeps: everything, where the kernel resends
        // what the dead server was answering; else the mount ends with it.
        push_option(
            &mut shown,
            if mounted.can_resend() {
                "survives=all"
            } else {
                "survives=nothing"
            },
        );
        let _ = r.write_all(
            mounted
                .ready_report(&super::supervise::report(opened.format, &shown))
                .as_bytes(),
        );
    }
    let res = mounted.serve();
    stats.finish();
    res.context("serving the mount failed")?;
    Ok(0)
}
