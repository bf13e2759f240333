//! Values of kernel-style options, parsed by one set of rules for every
//! foliofs command and format; how an option string splits into items; and
//! the error a refused `-o` option gives. Each layer owns its own keys
//! (the block layer's, FUSE's, ramfs's) and reads their values with these.
//!
//! Sizes (`blocksize=`, ramfs `size=` and `nr_inodes=`, `mkfs --align`,
//! `bench --size`): decimal digits, then at most one suffix `K`, `M`, `G`,
//! `T`, `P` or `E` in either case, each a power of 1024 as the kernel's
//! `memparse` reads them. Nothing else: no sign, no blanks, no `0x`, no
//! fractions, no `B` or `KiB`. A size of 2^64 bytes or more (`16E`) is
//! refused rather than wrapped. Zero is a size; whether it means anything is
//! the option's business (ramfs `size=0` is "no limit", `blocksize=0` is
//! refused). A percentage (ramfs `size=N%`) is not a size: the option that
//! takes one parses it.
//!
//! Ids (`uid=`, `gid=`): decimal digits, 0 to 4294967294. 4294967295 is
//! `(uid_t)-1`, which `chown(2)` and the kernel's mount parsers read as "no
//! change", never as an owner, so it is refused here as `-1` is.
//!
//! Modes (`umask=`, ramfs `mode=`): octal digits, 0 to 7777 (the permission
//! bits with set-user-ID, set-group-ID and sticky). No sign, no blanks, no
//! `0o`; leading zeros are fine (`0022`).

/// A refused `-o` option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// The key is not an option of this file system.
    #[error("unknown mount option `{0}`")]
    Unknown(String),
    /// The key is known but its value is missing or wrong.
    #[error("bad value for mount option `{key}`: {why}")]
    BadValue {
        /// The option's key, as given.
        key: String,
        /// What is wrong with the value, for the message.
        why: String,
    },
    /// Each option is fine on its own, but together, or on this machine,
    /// they cannot be honoured.
    #[error("bad mount options: {0}")]
    Conflict(String),
}

impl OptionError {
    /// A [`OptionError::BadValue`] for `key`.
    pub fn bad(key: &str, why: impl Into<String>) -> Self {
        OptionError::BadValue {
            key: key.to_owned(),
            why: why.into(),
        }
    }

    /// An [`OptionError::Unknown`] naming the item as given: `key` or
    /// `key=value`.
    pub fn unknown(key: &str, value: Option<&str>) -> Self {
        OptionError::Unknown(match value {
            Some(v) => format!("{key}={v}"),
            None => key.to_owned(),
        })
    }
}

/// The items of an option string: comma separated, each `key` or
/// `key=value` split at its first `=`, so a URL's `=` and `:` stay in the
/// value. Empty items (`a,,b`) are skipped, as the kernel does.
pub fn items(s: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    s.split(',')
        .filter(|i| !i.is_empty())
        .map(|i| match i.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (i, None),
        })
}

/// Refuses a value for `key`, which takes none (`ro=1`).
pub fn flag(key: &str, value: Option<&str>) -> Result<(), OptionError> {
    match value {
        None => Ok(()),
        Some(_) => Err(OptionError::bad(key, "takes no value")),
    }
}

/// The value of `key`, which needs one: an empty value (`fsname=`) is
/// none, since no option means anything by it.
pub fn required<'v>(key: &str, value: Option<&'v str>) -> Result<&'v str, OptionError> {
    match value {
        Some(v) if !v.is_empty() => Ok(v),
        _ => Err(OptionError::bad(key, "needs a value")),
    }
}

/// The size `v` given to `key`, or an error naming both.
pub fn size_value(key: &str, v: &str) -> Result<u64, OptionError> {
    parse_size(v).map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))
}

/// Why a size was refused. The messages do not repeat the value: every
/// caller names it (`blocksize=3X: ...`, `--align 3X: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// The value is empty.
    #[error("no size given")]
    Empty,
    /// Not decimal digits (a sign, blanks, `0x`, a fraction, or digits that
    /// are missing before the suffix).
    #[error("not a size: expected decimal digits with an optional K, M, G, T, P or E")]
    NotASize,
    /// A letter that is not one of the six suffixes.
    #[error("unknown size suffix `{0}`: expected K, M, G, T, P or E (powers of 1024)")]
    BadSuffix(char),
    /// 2^64 bytes or more.
    #[error("too large: a size must stay below 16E (2^64 bytes)")]
    TooLarge,
}

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not decimal digits, or more than fits in 32 bits.
    #[error("not a numeric id: expected a decimal number from 0 to 4294967294")]
    NotAnId,
    /// `-1` or 4294967295 (`(uid_t)-1`), which mean "no change" rather than
    /// an id.
    #[error("-1 (4294967295 as an unsigned id) means \"no change\" to the kernel, never an owner")]
    NoChange,
}

/// Why a mode was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    /// Empty, or a character other than an octal digit (signs included).
    #[error("not an octal mode: expected octal digits from 0 to 7777")]
    NotOctal,
    /// Above 7777: bits beyond set-user-ID, set-group-ID, sticky and
    /// the permissions.
    #[error("more than the permission bits: a mode is at most 7777")]
    TooLarge,
}

/// The suffixes a size may carry, smallest first, with their shifts.
const SUFFIXES: [(char, u32); 6] = [
    ('K', 10),
    ('M', 20),
    ('G', 30),
    ('T', 40),
    ('P', 50),
    ('E', 60),
];

/// Parses a size by the rules in the module documentation.
pub fn parse_size(v: &str) -> Result<u64, SizeError> {
    let (digits, shift) = match v.chars().last() {
        None => return Err(SizeError::Empty),
        Some(c) if c.is_ascii_alphabetic() => {
            let up = c.to_ascii_uppercase();
            let shift = SUFFIXES
                .iter()
                .find(|(s, _)| *s == up)
                .map(|(_, shift)| *shift)
                .ok_or(SizeError::BadSuffix(c))?;
            (&v[..v.len() - 1], shift)
        }
        Some(_) => (v, 0),
    };
    let n = decimal(digits).ok_or(SizeError::NotASize)?;
    let n = n.ok_or(SizeError::TooLarge)?;
    n.checked_mul(1u64 << shift).ok_or(SizeError::TooLarge)
}

/// Formats a byte count the way [`parse_size`] reads it back, with the
/// largest suffix that divides it exactly (`64K`, `2M`, `1536`).
pub fn format_size(n: u64) -> String {
    if n != 0 {
        for (suffix, shift) in SUFFIXES.iter().rev() {
            if n.trailing_zeros() >= *shift {
                return format!("{}{suffix}", n >> shift);
            }
        }
    }
    n.to_string()
}

/// Parses a user or group id by the rules in the module documentation.
pub fn parse_id(v: &str) -> Result<u32, IdError> {
    if v == "-1" {
        return Err(IdError::NoChange);
    }
    match decimal(v).flatten().map(u32::try_from) {
        Some(Ok(u32::MAX)) => Err(IdError::NoChange),
        Some(Ok(id)) => Ok(id),
        _ => Err(IdError::NotAnId),
    }
}

/// Parses a permission mode or mask by the rules in the module
/// documentation.
pub fn parse_mode(v: &str) -> Result<u32, ModeError> {
    if v.is_empty() || !v.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(ModeError::NotOctal);
    }
    // All octal digits: the only failure left is overflow.
    match u32::from_str_radix(v, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(ModeError::TooLarge),
    }
}

/// `None` when `s` is not all ASCII digits (or is empty); `Some(None)` when
/// it is, but the number does not fit in 64 bits.
fn decimal(s: &str) -> Option<Option<u64>> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse().ok())
}

#[cfg(test)]
mod tests;
