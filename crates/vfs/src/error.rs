use std::io;

/// Errors a file system reports.
///
/// Three kinds are kept apart because callers act on them differently: the
/// image is damaged ([`Error::Corrupt`]), the image is fine but uses something
/// foliofs does not read ([`Error::Unsupported`]), and the storage under it
/// failed ([`Error::Io`]). The rest are ordinary POSIX outcomes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image is damaged: `offset` is the byte offset in the image (or
    /// backing device) where the bad structure sits.
    #[error("corrupt image at offset {offset:#x}: {what}")]
    Corrupt { offset: u64, what: String },

    /// The image uses a feature this reader does not implement.
    #[error("unsupported feature: {0}")]
    Unsupported(String),

    /// Reading or writing the backing store failed.
    #[error("I/O error at offset {offset:#x}: {source}")]
    Io {
        offset: u64,
        #[source]
        source: io::Error,
    },

    #[error("no such file or directory")]
    NotFound,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("not a symbolic link")]
    NotSymlink,
    #[error("read-only file system")]
    ReadOnly,
    #[error("file name too long")]
    NameTooLong,
    #[error("file exists")]
    Exists,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no space left on device")]
    NoSpace,
    #[error("invalid argument")]
    Invalid,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("permission denied")]
    AccessDenied,
    /// `getxattr` or `removexattr` of a name the inode does not have
    /// (`ENODATA`).
    #[error("no such extended attribute")]
    NoSuchXattr,
    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` from an offset at or past
    /// the end of the file, or `SEEK_DATA` where only a hole follows the
    /// offset (`ENXIO`).
    #[error("no data at or after this offset")]
    NoDataPastOffset,
    #[error("file too large")]
    TooBig,
    #[error("too many links")]
    TooManyLinks,
    #[error("result out of range")]
    Range,
    /// The file system does not offer this operation, or this variant of
    /// it (an `fallocate` mode, an xattr namespace): `EOPNOTSUPP`. Not to
    /// be confused with [`Error::Unsupported`], an image feature.
    #[error("operation not supported")]
    OperationNotSupported,
    #[error("cross-device link")]
    CrossDevice,
    #[error("too many levels of symbolic links")]
    Loop,
    /// Any other errno.
    #[error("{}", io::Error::from_raw_os_error(*.0))]
    Errno(i32),
}

/// Result with the file-system [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A corruption report at `offset`.
    pub fn corrupt(offset: u64, what: impl Into<String>) -> Self {
        Error::Corrupt {
            offset,
            what: what.into(),
        }
    }

    /// The errno a system call reports for this error. Corruption and I/O
    /// failures are both `EIO`: the kernel's file systems do the same, and a
    /// program cannot act on the difference (the server logs the detail).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Corrupt { .. } | Error::Io { .. } => libc::EIO,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NotFound => libc::ENOENT,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotSymlink => libc::EINVAL,
            Error::ReadOnly => libc::EROFS,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Exists => libc::EEXIST,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NoSpace => libc::ENOSPC,
            Error::Invalid => libc::EINVAL,
            Error::NotPermitted => libc::EPERM,
            Error::AccessDenied => libc::EACCES,
            Error::NoSuchXattr => libc::ENODATA,
            Error::NoDataPastOffset => libc::ENXIO,
            Error::TooBig => libc::EFBIG,
            Error::TooManyLinks => libc::EMLINK,
            Error::Range => libc::ERANGE,
            Error::OperationNotSupported => libc::EOPNOTSUPP,
            Error::CrossDevice => libc::EXDEV,
            Error::Loop => libc::ELOOP,
            Error::Errno(e) => *e,
        }
    }

    /// True for damage to the image (as opposed to I/O or user errors).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io { source, .. } => source,
            other => io::Error::new(
                io::Error::from_raw_os_error(other.errno()).kind(),
                other.to_string(),
            ),
        }
    }
}
