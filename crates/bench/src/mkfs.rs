//! Which mkfs.erofs the run has, and what it can make.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The mkfs.erofs a run builds its EROFS images with, and what it says it
/// can compress with.
#[derive(Clone, Debug)]
pub struct MkfsErofs {
    pub path: PathBuf,
    /// Its version as it prints it ("1.9.3"), if it does.
    pub version: Option<String>,
    /// The compressors it lists; `None` if it lists none we can read, in
    /// which case an image is simply tried.
    pub compressors: Option<Vec<String>>,
}

impl MkfsErofs {
    /// Asks `path` for its version and compressors. erofs-utils 1.6 and
    /// later print both for `-V`; older ones refuse `-V` but print their
    /// version on stdout and the compressors at the end of their usage.
    pub fn probe(path: &Path) -> MkfsErofs {
        let mut text = String::new();
        for flag in ["-V", "--help"] {
            if let Ok(out) = Command::new(path).arg(flag).stdin(Stdio::null()).output() {
                text.push_str(&String::from_utf8_lossy(&out.stdout));
                text.push('\n');
                text.push_str(&String::from_utf8_lossy(&out.stderr));
                text.push('\n');
            }
            if parse_compressors(&text).is_some() {
                break;
            }
        }
        MkfsErofs {
            path: path.to_owned(),
            version: parse_version(&text),
            compressors: parse_compressors(&text),
        }
    }

    /// Why this mkfs.erofs cannot make `alg` images, if it says so.
    pub fn lacks(&self, alg: &str) -> Option<String> {
        let list = self.compressors.as_ref()?;
        if list.iter().any(|c| c == alg) {
            return None;
        }
        Some(format!(
            "{} makes no {alg} images: needs a mkfs.erofs that lists {alg} in `-V` (erofs-utils 1.9.3 does; --mkfs-erofs PATH)",
            self.describe(),
        ))
    }

    /// "mkfs.erofs 1.5" or "/path/mkfs.erofs 1.9.3", as notes name it.
    pub fn describe(&self) -> String {
        let name = if self.path.components().count() > 1 {
            self.path.display().to_string()
        } else {
            "mkfs.erofs".to_owned()
        };
        match &self.version {
            Some(v) => format!("{name} {v}"),
            None => name,
        }
    }
}

/// The version on the first line naming mkfs.erofs: its last word, when
/// that starts with a digit.
fn parse_version(text: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.contains("mkfs.erofs") && !l.contains("sage"))
        .find_map(|l| {
            let w = l.split_whitespace().last()?;
            w.starts_with(|c: char| c.is_ascii_digit())
                .then(|| w.to_owned())
        })
}

/// The names on a line such as "available compressors: lz4, lz4hc, zstd"
/// (other lines of a usage text mention compressors too, but not a list).
fn parse_compressors(text: &str) -> Option<Vec<String>> {
    text.lines()
        .filter(|l| l.to_ascii_lowercase().contains("compressors"))
        .find_map(|l| {
            let (_, names) = l.rsplit_once(':')?;
            let list: Vec<String> = names
                .split([',', ' '])
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect();
            let word = |n: &String| n.chars().all(|c| c.is_ascii_alphanumeric());
            (!list.is_empty() && list.iter().all(word)).then_some(list)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressors_and_versions_of_old_and_new_mkfs() {
        // erofs-utils 1.9.3's `-V`.
        let new = "mkfs.erofs (erofs-utils) 1.9.3\navailable compressors: lz4, lz4hc, lzma, deflate, libdeflate, zstd\n";
        assert_eq!(parse_version(new).as_deref(), Some("1.9.3"));
        assert_eq!(
            parse_compressors(new).unwrap(),
            ["lz4", "lz4hc", "lzma", "deflate", "libdeflate", "zstd"]
        );
        // 1.5 refuses `-V`: its version on stdout, its usage on stderr.
        let old = "mkfs.erofs 1.5\n\nmkfs.erofs: invalid option -- 'V'\nusage: [options] FILE DIRECTORY\n -zX[,Y]               X=compressor (Y=compression level, optional)\n\nAvailable compressors are: lz4hc, lz4\n";
        assert_eq!(parse_version(old).as_deref(), Some("1.5"));
        assert_eq!(parse_compressors(old).unwrap(), ["lz4hc", "lz4"]);
        assert_eq!(parse_compressors("mkfs.erofs 1.0\n"), None);
        let help = " -zX[,level=Y]   alternative compressors can be separated by colons(:)\n";
        assert_eq!(parse_compressors(help), None);
        let m = MkfsErofs {
            path: "mkfs.erofs".into(),
            version: Some("1.5".into()),
            compressors: parse_compressors(old),
        };
        assert_eq!(m.lacks("lz4hc"), None);
        let why = m.lacks("zstd").unwrap();
        assert!(
            why.starts_with("mkfs.erofs 1.5 makes no zstd images"),
            "{why}"
        );
        let unknown = MkfsErofs {
            compressors: None,
            ..m
        };
        assert_eq!(unknown.lacks("zstd"), None);
    }
}
