use std::fmt;
use std::io;

/// Errors a file system reports.
///
/// Three kinds are kept apart because callers act on them differently: the
/// image is damaged ([`Error::Corrupt`]), the image is fine but uses something
/// foliofs does not read ([`Error::Incompatible`]), and the storage under it
/// failed ([`Error::Io`]). The first two carry a typed kind that the format
/// defines (see [`Corruption`]). The rest are ordinary POSIX outcomes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The image is damaged: `offset` is the byte offset in the image (or
    /// backing device) where the bad structure sits, `kind` what is wrong
    /// with it.
    #[error("corrupt image at offset {offset:#x}: {kind}")]
    Corrupt {
        /// Byte offset of the damaged structure in the image or device.
        offset: u64,
        /// The format's own account of the damage.
        kind: Corruption,
    },

    /// The image uses a feature this reader does not implement.
    #[error("unsupported feature: {0}")]
    Incompatible(Incompatibility),

    /// Reading or writing the backing store failed.
    #[error("I/O error at offset {offset:#x}: {source}")]
    Io {
        /// Byte offset in the image or device of the read or write that
        /// failed.
        offset: u64,
        /// The system call's error.
        #[source]
        source: io::Error,
    },

    /// No entry of that name, or the inode is gone (`ENOENT`).
    #[error("no such file or directory")]
    NotFound,
    /// A directory operation on an inode that is not a directory (`ENOTDIR`).
    #[error("not a directory")]
    NotDir,
    /// A file operation, such as a write or `unlink`, on a directory (`EISDIR`).
    #[error("is a directory")]
    IsDir,
    /// `readlink` of an inode that is not a symbolic link (`EINVAL`, as
    /// readlink(2) reports it).
    #[error("not a symbolic link")]
    NotSymlink,
    /// A change to a read-only file system (`EROFS`); the default of every
    /// mutating [`FileSystem`](crate::FileSystem) method.
    #[error("read-only file system")]
    ReadOnly,
    /// A name longer than the format allows (`ENAMETOOLONG`).
    #[error("file name too long")]
    NameTooLong,
    /// The name to create is taken (`EEXIST`).
    #[error("file exists")]
    Exists,
    /// Removing or replacing a directory that still has entries (`ENOTEMPTY`).
    #[error("directory not empty")]
    NotEmpty,
    /// The file system's size, inode or xattr limit is reached (`ENOSPC`).
    #[error("no space left on device")]
    NoSpace,
    /// An argument the operation cannot take (`EINVAL`).
    #[error("invalid argument")]
    Invalid,
    /// An operation refused whatever the caller's rights, such as a hard
    /// link to a directory (`EPERM`).
    #[error("operation not permitted")]
    NotPermitted,
    /// The caller's permissions do not allow it (`EACCES`).
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
    /// A size or write end past the largest file the format holds (`EFBIG`).
    #[error("file too large")]
    TooBig,
    /// One more hard link would pass the format's link count limit (`EMLINK`).
    #[error("too many links")]
    TooManyLinks,
    /// A value does not fit, such as an xattr name over 255 bytes (`ERANGE`).
    #[error("result out of range")]
    Range,
    /// The file system does not offer this operation, or this variant of
    /// it (an `fallocate` mode, an xattr namespace): `EOPNOTSUPP`. Not to
    /// be confused with [`Error::Incompatible`], an image feature.
    #[error("operation not supported")]
    OperationNotSupported,
    /// A link or rename across file systems (`EXDEV`).
    #[error("cross-device link")]
    CrossDevice,
    /// Too many symbolic links on the way (`ELOOP`).
    #[error("too many levels of symbolic links")]
    Loop,
    /// Any other errno.
    #[error("{}", io::Error::from_raw_os_error(*.0))]
    Errno(i32),
}

/// Result with the file-system [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// `e` and its causes on one line, each cause once, as a command prints an
/// error. Many errors (ours and the libraries') put their source in their
/// own message as well as returning it from `source()`, so joining every
/// message in the chain would print that source twice.
pub fn chain_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if line.is_empty() {
            line = text;
        } else if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

impl Error {
    /// The image is damaged at `offset`, as `kind` (a format's own
    /// corruption type) says.
    pub fn corrupt<K>(offset: u64, kind: K) -> Self
    where
        K: std::error::Error + Send + Sync + 'static,
    {
        Error::Corrupt {
            offset,
            kind: Corruption::new(kind),
        }
    }

    /// The image uses a feature this reader does not implement, as `kind`
    /// (a format's own type) says.
    pub fn incompatible<K>(kind: K) -> Self
    where
        K: std::error::Error + Send + Sync + 'static,
    {
        Error::Incompatible(Incompatibility::new(kind))
    }

    /// The corruption kind, if this is corruption and its kind is a `K`.
    pub fn corruption<K: std::error::Error + 'static>(&self) -> Option<&K> {
        match self {
            Error::Corrupt { kind, .. } => kind.kind(),
            _ => None,
        }
    }

    /// The incompatibility kind, if this is one and its kind is a `K`.
    pub fn incompatibility<K: std::error::Error + 'static>(&self) -> Option<&K> {
        match self {
            Error::Incompatible(kind) => kind.kind(),
            _ => None,
        }
    }

    /// The byte offset in the image or device the error is about, when it
    /// has one (corruption and I/O failures).
    pub fn offset(&self) -> Option<u64> {
        match self {
            Error::Corrupt { offset, .. } | Error::Io { offset, .. } => Some(*offset),
            _ => None,
        }
    }

    /// The errno a system call reports for this error. Corruption and I/O
    /// failures are both `EIO`: the kernel's file systems do the same, and a
    /// program cannot act on the difference (the server logs the detail).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Corrupt { .. } | Error::Io { .. } => libc::EIO,
            Error::Incompatible(_) => libc::EOPNOTSUPP,
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

    /// True for an image feature this reader does not implement.
    pub fn is_incompatible(&self) -> bool {
        matches!(self, Error::Incompatible(_))
    }
}

/// Defines a holder of a format's own error kind: any error type, kept
/// boxed, shown as itself and recovered with `kind::<K>()`.
macro_rules! kind_holder {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name(Box<dyn std::error::Error + Send + Sync + 'static>);

        impl $name {
            /// Wraps a format's kind.
            pub fn new<K>(kind: K) -> Self
            where
                K: std::error::Error + Send + Sync + 'static,
            {
                $name(Box::new(kind))
            }

            /// The kind, if it is a `K`.
            pub fn kind<K: std::error::Error + 'static>(&self) -> Option<&K> {
                self.0.downcast_ref()
            }

            /// True when the kind is a `K`.
            pub fn is<K: std::error::Error + 'static>(&self) -> bool {
                self.0.is::<K>()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

kind_holder! {
    /// What is wrong with a damaged image, in the terms of its format.
    ///
    /// Each format crate has its own `Corrupt` enum (romfs, EROFS, the block
    /// layer); its `Display` is the message, its variants carry what the
    /// message names. Callers and tests match the kind, not the text:
    ///
    /// ```
    /// # use foliofs_vfs::Error;
    /// #[derive(Debug, PartialEq, thiserror::Error)]
    /// enum Corrupt {
    ///     #[error("bad magic {0:#x}")]
    ///     BadMagic(u32),
    /// }
    /// let e = Error::corrupt(0, Corrupt::BadMagic(7));
    /// assert_eq!(e.corruption::<Corrupt>(), Some(&Corrupt::BadMagic(7)));
    /// assert_eq!(e.to_string(), "corrupt image at offset 0x0: bad magic 0x7");
    /// ```
    Corruption
}

kind_holder! {
    /// Which feature of an image this reader does not implement, in the
    /// terms of its format (each format crate has its own `Incompatible`
    /// enum); shown as the format's message.
    Incompatibility
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
