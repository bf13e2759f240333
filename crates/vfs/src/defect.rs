//! What a full check of an image reports, in one shape for every format, so
//! a tool prints any format's findings the same way.

use std::fmt;

use crate::Error;

/// One problem a full check found.
#[derive(Debug)]
pub struct Defect {
    /// Where in the tree the check met it ("/" is the root), when it knows.
    pub path: Option<String>,
    /// What is wrong: usually [`Error::Corrupt`], whose offset says where in
    /// the image and whose kind (the format's own) says what.
    pub error: Error,
}

impl Defect {
    /// A defect met at `path`.
    pub fn new(path: Option<&str>, error: Error) -> Defect {
        Defect {
            path: path.map(str::to_owned),
            error,
        }
    }

    /// The byte offset in the image, when the error has one.
    pub fn offset(&self) -> Option<u64> {
        self.error.offset()
    }
}

/// The error's own message with the path placed after its category, so the
/// line reads like every other message about that error ("corrupt image at
/// offset 0x4c: /etc/passwd: bad header checksum ...").
impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(path) = &self.path else {
            return write!(f, "{}", self.error);
        };
        match &self.error {
            Error::Corrupt { offset, kind } => {
                write!(f, "corrupt image at offset {offset:#x}: {path}: {kind}")
            }
            Error::Incompatible(kind) => write!(f, "unsupported feature: {path}: {kind}"),
            Error::Io { offset, source } => {
                write!(f, "I/O error at offset {offset:#x}: {path}: {source}")
            }
            other => write!(f, "{path}: {other}"),
        }
    }
}

/// What a format's full check reports, in the same shape for every format.
pub trait CheckReport {
    /// The defects listed, in the order found.
    fn defects(&self) -> &[Defect];

    /// Defects found beyond those listed: a check may stop listing to bound
    /// its memory on a badly damaged image.
    fn unlisted(&self) -> u64 {
        0
    }

    /// All defects found, listed or not.
    fn defect_count(&self) -> u64 {
        self.defects().len() as u64 + self.unlisted()
    }

    /// True when nothing was wrong.
    fn is_clean(&self) -> bool {
        self.defect_count() == 0
    }

    /// Named counts of what was checked, in the order a summary shows them
    /// (`("entries", 12)`, `("headers checked", 13)`).
    fn counts(&self) -> Vec<(&'static str, u64)>;

    /// The counts as one phrase: "12 entries, 13 headers checked".
    fn summary(&self) -> String {
        self.counts()
            .iter()
            .map(|(name, n)| format!("{n} {name}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("bad header checksum")]
    struct BadSum;

    struct Report(Vec<Defect>);

    impl CheckReport for Report {
        fn defects(&self) -> &[Defect] {
            &self.0
        }
        fn counts(&self) -> Vec<(&'static str, u64)> {
            vec![("entries", 12), ("headers checked", 13)]
        }
    }

    #[test]
    fn a_defect_reads_as_its_error_with_the_path_after_the_category() {
        let d = Defect::new(Some("/a/b"), Error::corrupt(0x4c, BadSum));
        assert_eq!(
            d.to_string(),
            "corrupt image at offset 0x4c: /a/b: bad header checksum"
        );
        assert_eq!(d.offset(), Some(0x4c));
        let d = Defect::new(None, Error::corrupt(0x4c, BadSum));
        assert_eq!(d.to_string(), d.error.to_string());
        let d = Defect::new(Some("/x"), Error::NotDir);
        assert_eq!(d.to_string(), "/x: not a directory");
        assert_eq!(d.offset(), None);
    }

    #[test]
    fn a_report_sums_itself_up() {
        let r = Report(vec![Defect::new(None, Error::corrupt(0, BadSum))]);
        assert_eq!(r.summary(), "12 entries, 13 headers checked");
        assert_eq!(r.defect_count(), 1);
        assert!(!r.is_clean());
        assert!(Report(Vec::new()).is_clean());
    }
}
