//! The romfs library's integration tests, one binary.

mod mutations;
mod smoke_walk;
