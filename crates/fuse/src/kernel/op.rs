//! Every FUSE operation foliofs knows, named once: its opcode on the wire,
//! its name as the protocol spells it (in lower case), and the counter it
//! is counted under. The parser reads opcodes through it, the server
//! counts by it, and the published counts are named by it, so an
//! operation added here is parsed, counted and shown alike.
//!
//! The counted operations come first, in the order their counts are
//! published (`foliofs mounts --stats` and the bench read them by name,
//! and list them in this order): that order is part of the output, not the
//! protocol's, so it is not the opcodes' order.

macro_rules! ops {
    (
        counted { $($c:ident = $cc:literal, $cn:literal;)* }
        counted_as { $($a:ident = $ac:literal, $an:literal => $slot:ident;)* }
        uncounted { $($u:ident = $uc:literal, $un:literal;)* }
    ) => {
        /// A FUSE operation, whose discriminant is its opcode.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        #[allow(missing_docs)]
        pub enum Op {
            $($c = $cc,)*
            $($a = $ac,)*
            $($u = $uc,)*
        }

        /// The counters, in published order: one per counted operation,
        /// then [`OTHER`].
        #[allow(dead_code)]
        enum Counter {
            $($c,)*
            Other,
        }

        /// The name of every counter, in published order.
        pub const COUNTER_NAMES: [&str; Counter::Other as usize + 1] = [$($cn,)* OTHER];

        impl Op {
            /// Every operation: the counted ones in published order, then
            /// the others.
            pub const ALL: &'static [Op] = &[$(Op::$c,)* $(Op::$a,)* $(Op::$u,)*];

            /// The operation of `code`; `None` for an opcode foliofs does
            /// not know (answered `ENOSYS`).
            pub const fn from_code(code: u32) -> Option<Op> {
                match code {
                    $($cc => Some(Op::$c),)*
                    $($ac => Some(Op::$a),)*
                    $($uc => Some(Op::$u),)*
                    _ => None,
                }
            }

            /// Its name as the FUSE protocol spells it, in lower case.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Op::$c => $cn,)*
                    $(Op::$a => $an,)*
                    $(Op::$u => $un,)*
                }
            }

            /// The counter it is counted under, an index into
            /// [`COUNTER_NAMES`]; `None` for what is not counted.
            pub const fn counter(self) -> Option<usize> {
                match self {
                    $(Op::$c => Some(Counter::$c as usize),)*
                    $(Op::$a => Some(Counter::$slot as usize),)*
                    $(Op::$u => None,)*
                }
            }
        }
    };
}

/// The counter of the lock requests (refused): the one counter that is no
/// operation's own.
pub const OTHER: &str = "other";

impl Op {
    /// Its opcode on the wire.
    pub const fn code(self) -> u32 {
        self as u32
    }
}

ops! {
    // Counted under their own name, in published order.
    counted {
        Lookup = 1, "lookup";
        Forget = 2, "forget";
        Getattr = 3, "getattr";
        Setattr = 4, "setattr";
        Readlink = 5, "readlink";
        Mknod = 8, "mknod";
        Mkdir = 9, "mkdir";
        Unlink = 10, "unlink";
        Rmdir = 11, "rmdir";
        Symlink = 6, "symlink";
        Rename = 12, "rename";
        Link = 13, "link";
        Open = 14, "open";
        Read = 15, "read";
        Write = 16, "write";
        Flush = 25, "flush";
        Release = 18, "release";
        Fsync = 20, "fsync";
        Opendir = 27, "opendir";
        Readdir = 28, "readdir";
        Readdirplus = 44, "readdirplus";
        Releasedir = 29, "releasedir";
        Fsyncdir = 30, "fsyncdir";
        Statfs = 17, "statfs";
        Setxattr = 21, "setxattr";
        Getxattr = 22, "getxattr";
        Listxattr = 23, "listxattr";
        Removexattr = 24, "removexattr";
        Access = 34, "access";
        Create = 35, "create";
        Ioctl = 39, "ioctl";
        Fallocate = 43, "fallocate";
        Lseek = 46, "lseek";
    }
    // Counted under another's counter: a BATCH_FORGET counts each of its
    // inodes as a FORGET, RENAME2 is a RENAME with flags, and the lock
    // requests count together.
    counted_as {
        BatchForget = 42, "batch_forget" => Forget;
        Rename2 = 45, "rename2" => Rename;
        Getlk = 31, "getlk" => Other;
        Setlk = 32, "setlk" => Other;
        Setlkw = 33, "setlkw" => Other;
    }
    // Not counted: the connection's own (INIT, DESTROY, INTERRUPT), and
    // what the protocol layer refuses for good with ENOSYS.
    uncounted {
        Init = 26, "init";
        Interrupt = 36, "interrupt";
        Bmap = 37, "bmap";
        Destroy = 38, "destroy";
        Poll = 40, "poll";
        CopyFileRange = 47, "copy_file_range";
        Syncfs = 50, "syncfs";
        Tmpfile = 51, "tmpfile";
        Statx = 52, "statx";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_its_own_opcode_and_name() {
        for &op in Op::ALL {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        let mut names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
        assert_eq!(Op::from_code(0), None);
        assert_eq!(Op::from_code(31337), None);
    }

    #[test]
    fn counters_are_named_after_their_ops() {
        assert_eq!(Op::Lookup.counter(), Some(0));
        for &op in Op::ALL {
            match op.counter() {
                Some(i) if COUNTER_NAMES[i] == op.name() => {}
                Some(i) => assert!(
                    matches!(
                        (op, COUNTER_NAMES[i]),
                        (Op::BatchForget, "forget")
                            | (Op::Rename2, "rename")
                            | (Op::Getlk | Op::Setlk | Op::Setlkw, OTHER)
                    ),
                    "{op:?} counted as {}",
                    COUNTER_NAMES[i]
                ),
                None => {}
            }
        }
        assert_eq!(COUNTER_NAMES.last(), Some(&OTHER));
    }
}
