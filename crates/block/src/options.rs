//! How an image is opened, and the `-o` keys that say so: the block size,
//! the I/O mode, an image in object storage ([`RemoteOptions`]) and an
//! image's extra devices. This layer owns their grammar and limits; a
//! command that takes `-o` offers each item here and takes what is left
//! to the layers above.

use std::path::PathBuf;

use foliofs_vfs::options::{flag, required, size_value, OptionError};

use crate::remote::RemoteOptions;
use crate::{check_block_size, BlockSizeChoice, IoMode, DEFAULT_CACHE_BYTES};

/// How to open an image: the options every image format shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// How to pick the block size: the unit of caching and of small reads.
    pub block_size: BlockSizeChoice,
    /// Buffered reads through the page cache, or `O_DIRECT`.
    pub io_mode: IoMode,
    /// Bytes of block cache.
    pub cache_bytes: usize,
    /// How an image in object storage is fetched and cached (for sources
    /// that [`crate::remote::is_remote`] recognises).
    pub remote: RemoteOptions,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            block_size: BlockSizeChoice::Default,
            io_mode: IoMode::Buffered,
            cache_bytes: DEFAULT_CACHE_BYTES,
            remote: RemoteOptions::default(),
        }
    }
}

/// The keys of [`OpenOptions`]'s own fields, beside its remote ones.
const STORE_KEYS: &[&str] = &["directio", "nodirectio", "blocksize", "largeblocks"];

impl OpenOptions {
    /// The `-o` keys that make up [`OpenOptions`]: the block size and the
    /// I/O mode, and every one of [`RemoteOptions::KEYS`].
    pub const KEYS: &'static [&'static str] = &concat::<
        { STORE_KEYS.len() + RemoteOptions::KEYS.len() },
    >(STORE_KEYS, RemoteOptions::KEYS);

    /// Whether `key` is one of [`OpenOptions::KEYS`].
    pub fn is_key(key: &str) -> bool {
        Self::KEYS.contains(&key)
    }

    /// Applies one `-o` option: `Ok(true)` when it is one of ours (and
    /// valid), `Ok(false)` when it is not (`prefetch=FILE` included, see
    /// [`RemoteOptions::set`]), an error naming the key when its value is
    /// malformed. Later options win: `directio,nodirectio` is buffered.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, OptionError> {
        match key {
            "directio" => {
                flag(key, value)?;
                self.io_mode = IoMode::Direct;
            }
            "nodirectio" => {
                flag(key, value)?;
                self.io_mode = IoMode::Buffered;
            }
            "largeblocks" => {
                flag(key, value)?;
                self.block_size = BlockSizeChoice::LargeBlocks;
            }
            "blocksize" => {
                let v = required(key, value)?;
                let n = u32::try_from(size_value(key, v)?)
                    .ok()
                    .filter(|&n| check_block_size(n).is_ok())
                    .ok_or_else(|| {
                        OptionError::bad(key, format!("`{v}` is not a power of two from 1K to 2M"))
                    })?;
                self.block_size = BlockSizeChoice::Fixed(n);
            }
            _ => return self.remote.set(key, value),
        }
        Ok(true)
    }

    /// The options from `-o` items, `(key, value)` in the order given; a
    /// key that is not one of ours is refused by name, as is a bad value.
    pub fn from_mount_options(
        items: &[(String, Option<String>)],
    ) -> Result<OpenOptions, OptionError> {
        let mut o = OpenOptions::default();
        apply_all(items, |k, v| o.set(k, v))?;
        Ok(o)
    }
}

/// How an image is read: how each of its stores is opened, and the extra
/// devices (`device=PATH`, in order) its device table names.
///
/// The devices are not in [`OpenOptions`]: they belong to an image, not to
/// a store. An EROFS image opens each device with the same
/// [`OpenOptions`], a store has no devices of its own, and the open remote
/// objects are shared by source and [`OpenOptions`], which a list of
/// devices would split for nothing.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ImageOptions {
    /// How the image and each of its devices are opened.
    pub open: OpenOptions,
    /// Extra devices (`device=PATH`, repeatable), in order.
    pub devices: Vec<PathBuf>,
}

impl ImageOptions {
    /// Every `-o` key that changes how an image is read: what
    /// [`OpenOptions`] and the devices are made of. Every other key
    /// changes only what a mount serves or how it is mounted.
    pub const KEYS: &'static [&'static str] =
        &concat::<{ OpenOptions::KEYS.len() + 1 }>(OpenOptions::KEYS, &["device"]);

    /// Whether `key` is one of [`ImageOptions::KEYS`].
    pub fn is_key(key: &str) -> bool {
        Self::KEYS.contains(&key)
    }

    /// Applies one `-o` option, as [`OpenOptions::set`] does, and
    /// `device=PATH`.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, OptionError> {
        match key {
            "device" => self.devices.push(PathBuf::from(required(key, value)?)),
            _ => return self.open.set(key, value),
        }
        Ok(true)
    }

    /// The options from `-o` items, `(key, value)` in the order given; a
    /// key that is not one of ours is refused by name, as is a bad value.
    pub fn from_mount_options(
        items: &[(String, Option<String>)],
    ) -> Result<ImageOptions, OptionError> {
        let mut o = ImageOptions::default();
        apply_all(items, |k, v| o.set(k, v))?;
        Ok(o)
    }
}

/// Feeds `items` to `set` in order, refusing by name the first one it
/// does not take.
pub(crate) fn apply_all(
    items: &[(String, Option<String>)],
    mut set: impl FnMut(&str, Option<&str>) -> Result<bool, OptionError>,
) -> Result<(), OptionError> {
    for (k, v) in items {
        if !set(k, v.as_deref())? {
            return Err(OptionError::unknown(k, v.as_deref()));
        }
    }
    Ok(())
}

/// `a` then `b` as one list, so a list of keys is made of its parts' lists
/// rather than kept by hand beside them.
const fn concat<const N: usize>(a: &[&'static str], b: &[&'static str]) -> [&'static str; N] {
    assert!(a.len() + b.len() == N);
    let mut out = [""; N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    let mut j = 0;
    while j < b.len() {
        out[a.len() + j] = b[j];
        j += 1;
    }
    out
}

#[cfg(test)]
mod tests;
