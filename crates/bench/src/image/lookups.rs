//! A lookup-heavy start on the image's root file system: every name
//! listed (`find`), every path's attributes (`find -printf`, an lstat
//! each), and Python importing modules, each on a fresh mount of an image
//! already in the page cache. overlayfs looks a name up in each layer
//! that has its directory, so the stack pays per layer; the merged image
//! answers from one directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{device_opts, layout, overlay, store_layers, Stack, Who, LAYERS};
use crate::env::{run, BenchEnv};
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::rows::progress;
use crate::timing::time_cmd;
use crate::Config;

#[derive(Clone, Copy, PartialEq)]
enum Mount {
    /// The kernel's EROFS, merged image with its layers as devices.
    KernelMerged,
    /// The kernel's overlayfs over its EROFS mounts of the layers.
    Overlay,
    /// foliofs, `mount oci:` (built already: the mount builds nothing).
    Foliofs,
    /// The kernel's EROFS, one image of the flattened tree.
    KernelFlat,
}

struct Plan {
    mount: Mount,
    who: Who,
    /// The user's own store (a user cannot read root's).
    store: PathBuf,
    row: Row,
}

/// The images every row mounts, built once.
struct Built {
    store: PathBuf,
    merged: PathBuf,
    flat: PathBuf,
}

pub(super) fn lookups(
    env: &BenchEnv,
    cfg: &Config,
    made: &layout::Made,
    user: &Result<Who, String>,
) -> Result<Section> {
    let mut columns = vec![
        Column {
            key: "find",
            label: "find",
            unit: Unit::Seconds,
        },
        Column {
            key: "stat",
            label: "stat all",
            unit: Unit::Seconds,
        },
    ];
    if made.python.is_some() {
        columns.push(Column {
            key: "python",
            label: "python imports",
            unit: Unit::Seconds,
        });
    }
    columns.push(Column {
        key: "start",
        label: "all in turn",
        unit: Unit::Seconds,
    });
    progress(cfg, "[image lookups] building the merged and flat images");
    let base = env.subdir("image-lookups")?;
    let built = Built {
        store: base.join("store"),
        merged: base.join("merged.erofs"),
        flat: base.join("flat.erofs"),
    };
    run(Command::new(&env.exe)
        .env("FOLIOFS_STORE", &built.store)
        .args(["mkfs", "erofs", "-q", "--merge", &made.reference])
        .arg(&built.merged))?;
    layout::build_flat(env, made, &built.flat)?;
    let mut plans = plans(env, user, &base, &built)?;
    // foliofs's rows mount from a store that has everything: built here,
    // by a first mount, outside the measure.
    for plan in plans.iter_mut() {
        if plan.mount == Mount::Foliofs && plan.row.note.is_none() {
            if let Err(e) = mount(env, made, &built, plan) {
                plan.row.note = Some(format!("failed: {e:#}"));
                plan.row.failed = true;
            }
        }
    }
    let modules = if cfg.quick {
        crate::realstart::QUICK_MODULES
    } else {
        crate::realstart::MODULES
    };
    let script = crate::realstart::script(modules);
    for round in 0..cfg.runs {
        for plan in plans.iter_mut() {
            if plan.row.note.is_some() {
                continue;
            }
            progress(
                cfg,
                &format!(
                    "[image lookups] round {}/{}: {}",
                    round + 1,
                    cfg.runs,
                    plan.row.label
                ),
            );
            for c in &columns {
                let res = mount(env, made, &built, plan)
                    .and_then(|(stack, dir)| {
                        let secs = time_cmd(&mut step(&plan.who, c.key, &dir, made, &script))?;
                        drop(stack);
                        Ok(secs)
                    })
                    .with_context(|| c.label);
                match res {
                    Ok(s) => plan.row.runs.entry(c.key).or_default().push(s),
                    Err(e) => {
                        plan.row.note = Some(format!("failed: {e:#}"));
                        plan.row.failed = true;
                        break;
                    }
                }
            }
        }
    }
    let rows: Vec<Row> = plans.into_iter().map(|p| p.row).collect();
    let reference = if rows[1].note.is_none() { 1 } else { 2 };
    let pairs = [(0, 1), (2, 1), (0, 3)]
        .into_iter()
        .filter(|&(a, b)| a != b && rows[a].note.is_none() && rows[b].note.is_none())
        .collect();
    std::fs::remove_dir_all(&base)?;
    Ok(Section {
        name: "image-lookups",
        title: format!(
            "image lookups: a lookup-heavy start on the {LAYERS}-layer image, each step on a fresh mount"
        ),
        columns,
        rows,
        reference,
        pairs,
        notes: vec![format!(
            "find = `find ROOT` (names only), stat all = `find ROOT -printf` of inode, links, mode, size and mtime (an lstat of every path), python imports = {} -I -S importing {} modules from the image, all in turn = the three one after another on one mount; each step on a fresh mount (for the overlay row, fresh mounts of every layer too) of images already in the page cache; the layers under the overlay are the ones the merged image points into (foliofs's store's), so the rows differ only in how the tree is put together; {} rounds; ratios are to the overlay row",
            made.python.as_ref().map_or("(no Python here)".into(), |p| p.display().to_string()),
            modules.len(),
            cfg.runs
        )],
    })
}

fn plans(
    env: &BenchEnv,
    user: &Result<Who, String>,
    base: &Path,
    built: &Built,
) -> Result<Vec<Plan>> {
    let user_store = base.join("user-store");
    std::fs::create_dir(&user_store)?;
    let mut plans = vec![
        (
            Mount::KernelMerged,
            Who::Me,
            "kernel erofs, merged image (-o device=)",
            "kernel",
        ),
        (
            Mount::Overlay,
            Who::Me,
            "kernel overlayfs over kernel erofs of each layer (containerd)",
            "kernel",
        ),
        (
            Mount::Foliofs,
            Who::Me,
            "foliofs, merged image, root",
            "foliofs",
        ),
        (
            Mount::Foliofs,
            user.clone().unwrap_or(Who::Me),
            "foliofs, merged image, as a user",
            "foliofs",
        ),
        (
            Mount::KernelFlat,
            Who::Me,
            "kernel erofs, one image of the flattened tree (no layers)",
            "kernel",
        ),
    ]
    .into_iter()
    .map(|(mount, who, label, kind)| Plan {
        mount,
        store: if label.ends_with("user") {
            user_store.clone()
        } else {
            built.store.clone()
        },
        who,
        row: Row::new(label, kind),
    })
    .collect::<Vec<_>>();
    for p in &mut plans {
        p.row.note = match p.mount {
            Mount::KernelMerged | Mount::Overlay | Mount::KernelFlat if !env.root => {
                Some("needs root: mounting the kernel's erofs".into())
            }
            Mount::Foliofs if p.row.label.ends_with("root") && !env.root => {
                Some("needs root: the user row is this one's".into())
            }
            Mount::Foliofs if p.row.label.ends_with("user") => user.as_ref().err().cloned(),
            _ => None,
        };
        if p.row.label.ends_with("user") && p.row.note.is_none() {
            p.who.own(&p.store)?;
        }
    }
    Ok(plans)
}

/// A fresh mount of `plan`'s tree; the directory to start from.
fn mount(
    env: &BenchEnv,
    made: &layout::Made,
    built: &Built,
    plan: &Plan,
) -> Result<(Stack, PathBuf)> {
    let mnt = env.fresh_dir("mnt")?;
    plan.who.own(&mnt)?;
    let mut stack = Stack(Vec::new());
    let erofs = |opts: String| How::KernelFile {
        fstype: "erofs",
        opts,
    };
    let layers = store_layers(&built.store, made);
    match plan.mount {
        Mount::KernelMerged => stack.0.push(Mounted::new(
            env,
            &erofs(device_opts(&layers)),
            &built.merged,
            &mnt,
        )?),
        Mount::Overlay => {
            let mut lower = Vec::new();
            for l in &layers {
                let dir = env.fresh_dir("layer")?;
                stack
                    .0
                    .push(Mounted::new(env, &erofs(String::new()), l, &dir)?);
                lower.push(dir);
            }
            stack.0.push(overlay(env, &lower, &mnt)?);
        }
        Mount::Foliofs => {
            let how = How::Image {
                store: plan.store.clone(),
                who: plan.who.clone(),
                extra: Vec::new(),
            };
            stack
                .0
                .push(Mounted::new(env, &how, Path::new(&made.reference), &mnt)?);
        }
        Mount::KernelFlat => {
            stack
                .0
                .push(Mounted::new(env, &erofs(String::new()), &built.flat, &mnt)?)
        }
    }
    Ok((stack, mnt))
}

/// The command of the step `key` on the tree at `dir`, as `who`.
pub(crate) fn step(who: &Who, key: &str, dir: &Path, made: &layout::Made, script: &str) -> Command {
    match key {
        "find" => {
            let mut c = who.command("find");
            c.arg(dir);
            c
        }
        "stat" => {
            let mut c = who.command("find");
            c.arg(dir).args(["-printf", "%i %n %m %s %T@\\n"]);
            c
        }
        "python" => {
            let py = made.python.as_ref().map_or(PathBuf::new(), |p| dir.join(p));
            let mut c = who.command(py);
            c.args(["-I", "-S", "-c", script]).current_dir("/");
            c
        }
        _ => {
            // The three on one mount, one after another, as a start that
            // walks its tree and then runs its program.
            let mut c = who.command("sh");
            c.args([
                "-c",
                "find \"$1\" > /dev/null && find \"$1\" -printf '%i %n %m %s %T@\\n' > /dev/null && \
                 { [ -z \"$2\" ] || \"$1/$2\" -I -S -c \"$3\"; }",
                "sh",
            ])
            .arg(dir)
            .arg(made.python.as_deref().unwrap_or(Path::new("")))
            .arg(script)
            .current_dir("/");
            c
        }
    }
}
