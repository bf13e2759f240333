//! foliofs's integration tests, one binary: the built `foliofs` command and
//! the libraries against the source trees, the reference tools and the
//! kernel's own drivers. One module per format, `remote` for images in
//! object storage (a SeaweedFS per test), `registry` for images pulled
//! from a registry (a docker-registry per test), `user` for mounts by a user,
//! `push` for data pushed ahead and start-up profiles, `spin` for polling
//! for the next request, `supervise` for mounts that outlive their
//! servers, `transport` for io_uring and lean listings; `common` holds what
//! they share (bounded runs, the mount guard,
//! fixtures, walks, the romfs oracle).

#[macro_use]
mod common;

mod bench;
mod cli;
#[macro_use]
mod erofs;
mod harness;
mod image;
mod push;
mod ramfs;
mod registry;
mod remote;
mod romfs;
mod spin;
mod supervise;
mod transport;
mod user;
