//! Tars as people's tools write them, read as their writers read them:
//! one tree (binary xattrs, a capability, ACLs, long names and paths,
//! hard links, devices, sparse files, big ids, times before 1970 and
//! after 2038, every mode bit) archived by GNU tar in each format, by
//! bsdtar, Python's `tarfile`, busybox and Go's `archive/tar`; each tar,
//! plain, gzip or zstd on standard input, makes an image that walks
//! under the kernel equal to the writer's own extraction of it. The same
//! plain tars through mkfs.erofs 1.9.3 are reported beside it, one line
//! a case (`FOLIOFS_WRITERS_REPORT=FILE` appends the lines there too),
//! and never fail the test.

mod programs;
mod run;
mod tree;

use run::Compress::{Gzip, Plain, Zstd};
use run::{Case, Matrix, Writer};

fn run(cases: &[Case]) {
    Matrix::new(cases).run(cases);
}

#[test]
fn gnu_tar_in_every_format() {
    require!("root", "kernel-erofs", "tar", "setfacl", "gzip", "zstd");
    run(&[
        Case {
            name: "gnu-tar-gnu",
            writer: Writer::GnuTar(&["--format=gnu"]),
            compress: Plain,
            containerd: true,
            lossy: false,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "gnu-tar-oldgnu",
            writer: Writer::GnuTar(&["--format=oldgnu"]),
            compress: Gzip,
            containerd: true,
            lossy: false,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "gnu-tar-posix",
            // GNU tar stores xattrs and ACLs in this format only.
            writer: Writer::GnuTar(&["--format=posix", "--xattrs", "--xattrs-include=*", "--acls"]),
            compress: Zstd,
            containerd: true,
            lossy: false,
            xattrs: true,
            huge: false,
        },
        Case {
            name: "gnu-tar-ustar",
            writer: Writer::GnuTar(&["--format=ustar"]),
            compress: Plain,
            containerd: false,
            lossy: true,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "gnu-tar-v7",
            writer: Writer::GnuTar(&["--format=v7"]),
            compress: Gzip,
            containerd: true,
            lossy: true,
            xattrs: false,
            huge: false,
        },
    ]);
}

#[test]
fn gnu_tar_sparse_files() {
    require!("root", "kernel-erofs", "tar", "setfacl", "gzip", "zstd");
    macro_rules! posix_sparse {
        ($version:literal) => {
            &[
                "--format=posix",
                "--xattrs",
                "--xattrs-include=*",
                "--acls",
                "--sparse",
                concat!("--sparse-version=", $version),
            ]
        };
    }
    run(&[
        // Old GNU sparse headers, and the one file past 4 GiB.
        Case {
            name: "gnu-tar-gnu-sparse",
            writer: Writer::GnuTar(&["--format=gnu", "--sparse"]),
            compress: Zstd,
            containerd: true,
            lossy: false,
            xattrs: false,
            huge: true,
        },
        Case {
            name: "gnu-tar-posix-sparse-0.0",
            writer: Writer::GnuTar(posix_sparse!("0.0")),
            compress: Plain,
            containerd: true,
            lossy: false,
            xattrs: true,
            huge: false,
        },
        Case {
            name: "gnu-tar-posix-sparse-0.1",
            writer: Writer::GnuTar(posix_sparse!("0.1")),
            compress: Gzip,
            containerd: false,
            lossy: false,
            xattrs: true,
            huge: false,
        },
        Case {
            name: "gnu-tar-posix-sparse-1.0",
            writer: Writer::GnuTar(posix_sparse!("1.0")),
            compress: Zstd,
            containerd: true,
            lossy: false,
            xattrs: true,
            huge: false,
        },
    ]);
}

/// bsdtar reads holes by default (`--read-sparse`): its pax tars store
/// sparse files as GNU sparse 1.0.
#[test]
fn bsdtar_in_every_format() {
    require!("root", "kernel-erofs", "tar", "setfacl", "gzip", "zstd");
    run(&[
        Case {
            name: "bsdtar-restricted-pax",
            writer: Writer::Bsdtar(&["--xattrs", "--acls"]),
            compress: Gzip,
            containerd: true,
            lossy: false,
            xattrs: true,
            huge: false,
        },
        Case {
            name: "bsdtar-pax",
            writer: Writer::Bsdtar(&["--format", "pax", "--xattrs", "--acls"]),
            compress: Plain,
            containerd: false,
            lossy: false,
            xattrs: true,
            huge: false,
        },
        Case {
            name: "bsdtar-gnutar",
            writer: Writer::Bsdtar(&["--format", "gnutar", "--xattrs", "--acls"]),
            compress: Zstd,
            containerd: true,
            lossy: false,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "bsdtar-ustar",
            writer: Writer::Bsdtar(&["--format", "ustar", "--xattrs", "--acls"]),
            compress: Gzip,
            containerd: true,
            lossy: true,
            xattrs: false,
            huge: false,
        },
    ]);
}

#[test]
fn python_busybox_and_go_archive_tar() {
    require!("root", "kernel-erofs", "tar", "setfacl", "gzip", "zstd");
    run(&[
        Case {
            name: "python-tarfile-pax",
            writer: Writer::Python("pax"),
            compress: Zstd,
            containerd: true,
            lossy: false,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "python-tarfile-gnu",
            writer: Writer::Python("gnu"),
            compress: Gzip,
            containerd: false,
            lossy: false,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "python-tarfile-ustar",
            writer: Writer::Python("ustar"),
            compress: Plain,
            containerd: true,
            lossy: true,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "busybox-tar",
            writer: Writer::Busybox,
            compress: Zstd,
            containerd: true,
            lossy: false,
            xattrs: false,
            huge: false,
        },
        Case {
            name: "go-archive-tar",
            writer: Writer::Go,
            compress: Gzip,
            containerd: true,
            lossy: false,
            xattrs: true,
            huge: false,
        },
    ]);
}
