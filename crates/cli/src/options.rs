//! `-o` as every command reads it: each item goes, in the order given, to
//! the layer that owns its key. On a ramfs, ramfs's own keys are set aside
//! for it first (it rounds `blocksize=` where an image refuses odd sizes,
//! and `uid=`/`gid=` own its root); then the block layer takes what changes
//! how an image is read ([`ImageOptions`]), then FUSE what changes how it is
//! mounted and served ([`MountOptions`]). What nobody takes waits in
//! [`MountOpts::extra`], for ramfs or to be refused by name.

use foliofs_block::remote::RemoteOptions;
use foliofs_block::ImageOptions;
use foliofs_fuse::{MountOptions, OptionError};

/// The keys that change how an image is read: the block layer's. A
/// command that reads an image without mounting it takes these and
/// refuses every other key by name rather than ignore it.
pub const READING_KEYS: &[&str] = ImageOptions::KEYS;

/// The `-o` options of one command, each layer's share.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountOpts {
    /// How the image is read: the block size, the I/O mode, extra devices,
    /// and how an image in object storage is fetched.
    pub image: ImageOptions,
    /// What FUSE and `mount(8)` make of the mount.
    pub fuse: MountOptions,
    /// Options no layer took, `(key, value)`, in the order given: on a
    /// ramfs its own among them.
    pub extra: Vec<(String, Option<String>)>,
    /// Every key given, in order, whichever layer took it (also those left
    /// in `extra` and those passed over): a command that honours only some
    /// options refuses the rest by these.
    pub keys: Vec<String>,
}

impl MountOpts {
    /// Parses `-o` option strings (in order, as repeated `-o` flags are)
    /// for a file system of type `fstype`. A malformed value is refused
    /// here by the layer that owns its key; an unknown key is left in
    /// [`MountOpts::extra`] for the caller to refuse.
    pub fn parse(fstype: &str, items: &[String]) -> Result<MountOpts, OptionError> {
        let claimed = |key: &str| fstype == "ramfs" && foliofs_ramfs::Options::is_key(key);
        let mut o = MountOpts::default();
        let joined = items.join(",");
        for (key, value) in foliofs_vfs::options::items(&joined) {
            o.keys.push(key.to_owned());
            let taken = !claimed(key) && (o.image.set(key, value)? || o.fuse.set(key, value)?);
            if !taken {
                o.extra.push((key.to_owned(), value.map(ToOwned::to_owned)));
            }
        }
        Ok(o)
    }

    /// The first key given that is one of [`RemoteOptions::KEYS`]
    /// (`prefetch` only as `prefetch=all`: with a file it names a start-up
    /// profile, which any image mount takes).
    pub fn remote_key(&self) -> Option<&str> {
        self.keys
            .iter()
            .map(String::as_str)
            .filter(|&k| k != "prefetch" || self.image.open.remote.prefetch_all)
            .find(|k| RemoteOptions::is_key(k))
    }

    /// Refuses any option left in [`MountOpts::extra`] (for formats that
    /// take no options of their own).
    pub fn refuse_extra(&self) -> Result<(), OptionError> {
        self.refuse_extra_except(&|_| false)
    }

    /// Refuses the first option left in [`MountOpts::extra`] for which
    /// `known` returns false: a caller that has its own answer for some
    /// keys (ramfs's, say) gives them that, and names no key as unknown
    /// that some foliofs command takes.
    pub fn refuse_extra_except(&self, known: &dyn Fn(&str) -> bool) -> Result<(), OptionError> {
        match self.extra.iter().find(|(k, _)| !known(k)) {
            Some((k, v)) => Err(OptionError::unknown(k, v.as_deref())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use foliofs_block::{BlockSizeChoice, IoMode, OpenOptions};

    use super::*;

    fn parse(fstype: &str, s: &str) -> Result<MountOpts, OptionError> {
        MountOpts::parse(fstype, &[s.to_owned()])
    }

    #[test]
    fn each_layer_takes_its_own_keys() {
        let o = parse(
            "auto",
            "ro,uid=5,directio,blocksize=64K,device=/a,chunk=4M,prefetch=/p,push=1M,size=1M",
        )
        .unwrap();
        assert_eq!(o.fuse.read_only, Some(true));
        assert_eq!(o.fuse.uid, Some(5));
        assert_eq!(o.fuse.push, Some(1 << 20));
        assert_eq!(o.fuse.prefetch, Some(PathBuf::from("/p")));
        assert_eq!(o.image.open.io_mode, IoMode::Direct);
        assert_eq!(o.image.open.block_size, BlockSizeChoice::Fixed(65536));
        assert_eq!(o.image.open.remote.chunk, 4 << 20);
        assert!(!o.image.open.remote.prefetch_all);
        assert_eq!(o.image.devices, [PathBuf::from("/a")]);
        assert_eq!(o.extra, [("size".to_owned(), Some("1M".to_owned()))]);
        // `all` is the remote image's whole fetch, not a profile.
        let o = parse("auto", "prefetch=all").unwrap();
        assert!(o.image.open.remote.prefetch_all && o.fuse.prefetch.is_none());
        assert_eq!(o.remote_key(), Some("prefetch"));
        assert_eq!(parse("auto", "prefetch=/p").unwrap().remote_key(), None);
        // Repeated `-o` flags are one list.
        let o = MountOpts::parse("auto", &["largeblocks".into(), "blocksize=1m".into()]).unwrap();
        assert_eq!(o.image.open.block_size, BlockSizeChoice::Fixed(1 << 20));
    }

    #[test]
    fn ramfs_keys_are_left_to_ramfs() {
        let o = parse("ramfs", "blocksize=12000,uid=5,ro,mode=700").unwrap();
        assert_eq!(o.image, ImageOptions::default());
        assert_eq!(o.fuse.uid, None);
        assert_eq!(o.fuse.read_only, Some(true));
        assert_eq!(
            o.extra,
            vec![
                ("blocksize".to_owned(), Some("12000".to_owned())),
                ("uid".to_owned(), Some("5".to_owned())),
                ("mode".to_owned(), Some("700".to_owned())),
            ]
        );
        // An image's `blocksize=` is the block layer's, and refuses that.
        assert!(parse("auto", "blocksize=12000").is_err());
    }

    #[test]
    fn keys_are_recorded_in_order_wherever_they_went() {
        let o = parse("ramfs", "ro,,size=1M,defaults,uid=5,x-a=b,directio,ro").unwrap();
        assert_eq!(
            o.keys,
            ["ro", "size", "defaults", "uid", "x-a", "directio", "ro"]
        );
        assert_eq!(parse("auto", "").unwrap(), MountOpts::default());
    }

    #[test]
    fn unknown_keys_are_kept_then_refused() {
        let o = parse("auto", "size=1M,mode=0700,bogus").unwrap();
        assert_eq!(o.extra.len(), 3);
        assert_eq!(
            o.refuse_extra().unwrap_err().to_string(),
            "unknown mount option `size=1M`"
        );
        let known = |k: &str| k != "bogus";
        assert_eq!(
            o.refuse_extra_except(&known),
            Err(OptionError::Unknown("bogus".into()))
        );
    }

    #[test]
    fn remote_key_is_the_first_remote_one_given() {
        let o = parse(
            "auto",
            "chunk=4M,cache=/var/c,cache_size=2G,prefetch=all,endpoint=http://127.0.0.1:8333,region=eu-west-1,path_style,insecure_http,timeout=3",
        )
        .unwrap();
        assert!(o.extra.is_empty());
        assert_eq!(o.remote_key(), Some("chunk"));
        assert_eq!(parse("auto", "ro,uid=5").unwrap().remote_key(), None);
        assert_eq!(
            parse("auto", "ro,timeout=5,chunk=1M").unwrap().remote_key(),
            Some("timeout")
        );
    }

    #[test]
    fn the_layers_share_no_key_but_prefetch() {
        for k in READING_KEYS {
            let shared = MountOptions::is_key(k);
            assert_eq!(shared, *k == "prefetch", "{k}");
        }
        for k in RemoteOptions::KEYS {
            assert!(READING_KEYS.contains(k), "{k}");
        }
    }

    #[test]
    fn only_the_reading_keys_change_how_an_image_is_read() {
        let default = ImageOptions::default();
        for s in [
            "ro",
            "rw",
            "allow_other",
            "uid=5",
            "gid=5",
            "umask=022",
            "fsname=x",
            "debug",
            "writeback",
            "nowriteback",
            "threads=2",
            "spin=50",
            "nospin",
            "push=1M",
            "nopush",
            "record=/p",
            "prefetch=/p",
            "noexec",
            "noatime",
            "sync",
            "dirsync",
            "suid",
            "dev",
            "subtype=foliofs",
            "defaults",
        ] {
            let o = parse("auto", s).unwrap();
            assert!(!READING_KEYS.contains(&o.keys[0].as_str()) || s == "prefetch=/p");
            assert_eq!(o.image, default, "{s}");
            assert!(o.extra.is_empty(), "{s}");
        }
        assert_eq!(
            parse("auto", "directio,nodirectio").unwrap().image.open,
            OpenOptions::default()
        );
    }
}
