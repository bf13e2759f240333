//! `foliofs mounts`: the live foliofs mounts with their effective options:
//! all of them for root, a user's own for a user.

use std::io::Write;

use foliofs_fuse::records::{process_alive, MountState};

/// List live foliofs mounts.
#[derive(clap::Args, Debug)]
pub struct MountsArgs {
    /// Also show each mount's FUSE requests so far, by opcode, and for an
    /// image in object storage the bytes read and fetched, cache hits and
    /// misses, fetch errors and retries.
    #[arg(long)]
    pub stats: bool,
}

/// Escapes as `/proc/mounts` does, so every line splits on spaces.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

pub fn run(args: MountsArgs) -> anyhow::Result<i32> {
    let table = foliofs_fuse::mount_table()?;
    let all: Vec<_> = table
        .into_iter()
        .filter(|m| m.fs_type == foliofs_fuse::FS_TYPE)
        .collect();
    let live: Vec<u64> = all.iter().map(|m| m.mount_id).collect();
    MountState::prune(&live);
    foliofs_fuse::records::published::prune(&live);
    let uid = nix::unistd::getuid().as_raw();
    let everyone = foliofs_fuse::mount::privilege::has_cap_sys_admin();
    let ours: Vec<_> = all
        .into_iter()
        .filter(|m| everyone || m.user_id() == Some(uid))
        .collect();
    let mut out = std::io::stdout().lock();
    for m in &ours {
        // Per-mount flags from the kernel, then what the server resolved.
        let mut opts = m.mount_options.clone();
        let format = match MountState::find(m) {
            Some(s) => {
                if !s.options.is_empty() {
                    opts.push(',');
                    opts.push_str(&s.options);
                }
                if process_alive(s.pid) {
                    opts.push_str(&format!(",pid={}", s.pid));
                    // Under a supervisor (`pid`), the server now and how
                    // many came after the first.
                    if let Some(server) = s.server {
                        if process_alive(server) {
                            opts.push_str(&format!(",server={server}"));
                        } else {
                            opts.push_str(",server=restarting");
                        }
                        opts.push_str(&format!(",restarts={}", s.restarts));
                    }
                } else {
                    opts.push_str(",server=dead");
                }
                s.format
            }
            None => "unknown".to_owned(),
        };
        writeln!(
            out,
            "{} {} {} {}",
            escape(&m.source),
            escape(&m.mountpoint.to_string_lossy()),
            format,
            opts
        )?;
        if args.stats {
            let published = foliofs_fuse::records::published::read_all(m);
            let counts = published
                .as_ref()
                .map(|(c, _)| match foliofs_fuse::records::published::line(c) {
                    l if l.is_empty() => "none".to_owned(),
                    l => l,
                })
                .unwrap_or_else(|| "not published".to_owned());
            writeln!(out, "  requests: {counts}")?;
            // Every figure, zeros too: a miss count of 0 is the news.
            for (group, figures) in published.iter().flat_map(|(_, g)| g) {
                let line: Vec<String> = figures.iter().map(|(k, n)| format!("{k}={n}")).collect();
                writeln!(out, "  {group}: {}", line.join(" "))?;
            }
        }
    }
    Ok(0)
}
