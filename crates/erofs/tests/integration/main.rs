//! The EROFS library's integration tests, one binary: images mkfs.erofs
//! built read back as their source trees hold them, the committed corpus of
//! every layout erofs-utils 1.9.3 writes reads as its manifests say, and
//! damage of one kind at a time (and inside a cluster of each algorithm) is
//! reported as that kind.

mod corpus;
mod damage;
mod manifest;
mod mkfs_images;
mod pclusters;
mod tar_mutations;
