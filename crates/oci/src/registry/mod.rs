//! Images in a registry, through the OCI distribution API (v2):
//! `docker://` references ([`reference`]), credentials and challenges
//! ([`auth`]), manifests resolved as a layout's are ([`client`]), and
//! layer blobs streamed into the store, resumed when a connection breaks
//! off and checked at their end ([`blob`]); native EROFS layers read
//! lazily, chunk by chunk, each checked ([`lazy`]).

pub mod auth;
pub mod blob;
pub mod client;
pub mod lazy;
pub mod reference;
pub mod upload;

pub use client::{Client, Options};
pub use reference::Reference;
