//! The ramfs seed's table: sequential writes at every block size.

use std::path::{Path, PathBuf};

use anyhow::Result;
use foliofs_vfs::chain_line;
use foliofs_vfs::options::format_size;

use crate::env::{extra_dir, remove_extra_dir, BenchEnv};
use crate::mount::How;
use crate::report::{Column, Section, Unit};
use crate::rows::{measure_rows, NoImage, Plan};
use crate::timing::time_write_zeros;
use crate::Config;

/// The ramfs seed's table: `dd bs=2M` writes at every block size.
pub fn ramfs(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    // Two columns, because where the memory comes from matters as much as
    // the file system: a first write into a fresh mount takes pages the
    // machine may not have backed yet (in a VM whose balloon reports free
    // pages, every such page costs the hypervisor a fault), while a rewrite
    // after `rm` reuses what the first write freed. The seed's table is
    // the second case on bare metal.
    let columns = vec![
        Column {
            key: "write",
            label: "1st write (dd bs=2M)",
            unit: Unit::GBps,
        },
        Column {
            key: "rewrite",
            label: "rewrite after rm",
            unit: Unit::GBps,
        },
    ];
    let mut plans = Vec::new();
    let mut bs = 4096u64;
    while bs <= 2 << 20 {
        plans.push(Plan {
            label: format!("foliofs ramfs blocksize={}", format_size(bs)),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: format!("blocksize={bs}"),
            },
            image: Ok(PathBuf::from("none")),
            x: Some(bs),
        });
        bs *= 2;
    }
    // 2 MiB blocks as huge pages, beside the kernel's tmpfs huge=always.
    plans.push(Plan {
        label: "foliofs ramfs blocksize=2M,huge=always".into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype: "ramfs",
            opts: "blocksize=2M,huge=always".into(),
        },
        image: Ok(PathBuf::from("none")),
        x: None,
    });
    // The kernel's writeback cache trades ENOSPC at write(2) for batching;
    // show what it buys at the largest block size.
    plans.push(Plan {
        label: "foliofs ramfs blocksize=2M,writeback".into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype: "ramfs",
            opts: "blocksize=2M,writeback".into(),
        },
        image: Ok(PathBuf::from("none")),
        x: None,
    });
    let reference = plans.len();
    for (label, fstype, opts) in [
        ("kernel ramfs", "ramfs", ""),
        ("kernel tmpfs", "tmpfs", ""),
        ("kernel tmpfs huge=always", "tmpfs", "huge=always"),
    ] {
        plans.push(Plan {
            label: label.into(),
            kind: "kernel",
            how: How::KernelMem {
                fstype,
                opts: opts.into(),
            },
            image: Ok(PathBuf::from("none")),
            x: None,
        });
    }
    let total = cfg.ramfs_bytes;
    // A user can mount neither, but has the machine's /dev/shm, a tmpfs
    // already mounted: the kernel's in-memory file system beside foliofs's.
    // Its options are the machine's, not a fresh mount's defaults.
    let shm = (!env.root).then(|| {
        let dir = shm_dir(total);
        plans.push(Plan {
            label: "kernel tmpfs at /dev/shm".into(),
            kind: "kernel",
            how: How::Plain,
            image: dir.as_ref().map(|(d, _)| d.clone()).map_err(Clone::clone),
            x: None,
        });
        (plans.len() - 1, dir)
    });
    let write = |mnt: &Path| -> Result<f64> {
        let f = mnt.join("f");
        let t = time_write_zeros(&f, total, 2 << 20)?;
        std::fs::remove_file(&f)?;
        Ok(total as f64 / 1e9 / t)
    };
    // Both columns run the same workload; they differ because
    // `measure_rows` runs a row's workloads in turn on one warm mount, so
    // the second finds the memory the first freed.
    let rows = measure_rows(
        env,
        cfg,
        "ramfs",
        &plans,
        false,
        &[("write", &write), ("rewrite", &write)],
    );
    let (reference, ref_name) = match &shm {
        None => (reference, "the kernel's ramfs".to_owned()),
        Some((i, dir)) => {
            let opts = match dir {
                Ok((d, opts)) => {
                    remove_extra_dir(d);
                    format!(" ({opts})")
                }
                Err(_) => String::new(),
            };
            (
                *i,
                format!("the kernel's tmpfs at /dev/shm{opts}, already mounted: mounting a new ramfs or tmpfs needs root"),
            )
        }
    };
    Ok(Section {
        name: "ramfs",
        title: "ramfs: sequential writes by block size (ramfs blocksize= table)".into(),
        columns,
        rows,
        reference,
        pairs: Vec::new(),
        notes: vec![format!(
            "{} MiB written from /dev/zero-like buffers in 2 MiB writes per run, then removed and written again on the same mount; ratios are to {ref_name}",
            total >> 20
        ), "the 1st write also measures how fast the machine hands out memory it has not used lately (in a VM, often a hypervisor fault per page), which depends on what ran before; the rewrite is the file systems' own speed".into()],
    })
}

/// A directory of this run in /dev/shm, with the tmpfs's options, if
/// /dev/shm is a tmpfs with room for `bytes`.
fn shm_dir(bytes: u64) -> Result<(PathBuf, String), NoImage> {
    let shm = Path::new("/dev/shm")
        .canonicalize()
        .map_err(|e| NoImage::skip(format!("/dev/shm: {e}")))?;
    match foliofs_fuse::find_mount(&shm).ok().flatten() {
        Some(m) if m.fs_type == "tmpfs" => {
            let st = nix::sys::statvfs::statvfs(&shm)
                .map_err(|e| NoImage::skip(format!("/dev/shm: {e}")))?;
            let free = st.blocks_available() as u64 * st.fragment_size() as u64;
            if free < bytes + bytes / 8 {
                return Err(NoImage::skip(format!(
                    "/dev/shm has {} free, the run writes {}",
                    format_size(free),
                    format_size(bytes)
                )));
            }
            let dir = extra_dir(&shm).map_err(|e| NoImage::skip(chain_line(e.as_ref())))?;
            Ok((dir, m.super_options))
        }
        Some(m) => Err(NoImage::skip(format!(
            "/dev/shm is a {}, not a tmpfs",
            m.fs_type
        ))),
        None => Err(NoImage::skip("/dev/shm is not a mount of its own")),
    }
}
