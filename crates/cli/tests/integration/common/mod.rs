//! Helpers shared by the integration tests, one file per concern; every
//! helper is re-exported here, so a test names it `common::NAME`:
//!
//! - [`needs`]: what a test needs from the machine, and the skip note when
//!   it is missing (with the `have!` and `require!` macros below);
//! - [`run`]: running the binary and other commands with bounded waits;
//! - [`users`]: the test user and running as them;
//! - [`mount`]: the mount guard that always unmounts, and what
//!   `foliofs mounts` says of a mount;
//! - [`host`]: machine-wide state tests take turns with (/etc/fuse.conf,
//!   the kernel's caches);
//! - [`fixtures`]: seeded files and a tree of every entry type;
//! - [`images`]: images built for a test;
//! - [`tree`]: walking trees and comparing them;
//! - [`oracle`]: the kernel-romfs oracle;
//! - [`debian`]: a debootstrap root, made once per process and shared.
#![allow(dead_code)]

#[macro_use]
mod debian;
mod fixtures;
mod host;
mod images;
mod mount;
mod needs;
pub mod oracle;
mod run;
mod tree;
mod users;

pub use debian::*;
pub use fixtures::*;
pub use host::*;
pub use images::*;
pub use mount::*;
pub use needs::*;
pub use run::*;
pub use tree::*;
pub use users::*;

pub use foliofs_testkit::data::{random_bytes, rng};
pub use foliofs_testkit::find_program;

/// Whether the machine has every need listed (see [`missing`]); when not,
/// prints one `skip:` line naming the calling function and the need.
#[macro_export]
macro_rules! have {
    ($($need:expr),+ $(,)?) => {{
        fn here() {}
        $crate::common::have(
            $crate::common::fn_path(std::any::type_name_of_val(&here)),
            &[$($need),+],
        )
    }};
}

/// Returns from the test, with one `skip:` line on stderr, unless the
/// machine has every need listed (see [`missing`]).
#[macro_export]
macro_rules! require {
    ($($need:expr),+ $(,)?) => {
        if !$crate::have!($($need),+) {
            return;
        }
    };
}
