//! The request a server thread is answering, for a file system that must
//! answer a resent request the way it answered the first copy.
//!
//! A supervised server can die between carrying a request out and
//! answering it; the kernel then sends the request again, marked as
//! resent, to the next server. A file system whose changes outlive its
//! server (a supervised ramfs) records each request it carried out, and
//! answers a resent one it finds there without doing it twice. The FUSE
//! layer says which request a thread is answering with [`Scope`]; the
//! file system reads it with [`current`]. (Carried beside the call rather
//! than in every method's arguments: only such a file system needs it,
//! and only for the calls that change something.)

use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<Current> = const { Cell::new(Current { id: 0, resent: false }) };
}

/// A request: its id, and whether the kernel sent it again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Current {
    /// The request's id (FUSE's `unique`, without its resend mark); 0 for
    /// calls that answer no request.
    pub id: u64,
    /// Whether this is a copy of a request an earlier server read.
    pub resent: bool,
}

/// While alive, [`current`] on this thread is the request it names.
pub struct Scope(Current);

impl Scope {
    /// Enters request `id` (`resent`: sent again).
    pub fn enter(id: u64, resent: bool) -> Scope {
        Scope(CURRENT.with(|c| c.replace(Current { id, resent })))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// The request this thread is answering (id 0 when none).
pub fn current() -> Current {
    CURRENT.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_end() {
        assert_eq!(current().id, 0);
        {
            let _a = Scope::enter(4, false);
            {
                let _b = Scope::enter(6, true);
                assert_eq!(
                    current(),
                    Current {
                        id: 6,
                        resent: true
                    }
                );
            }
            assert_eq!(current().id, 4);
        }
        assert_eq!(current(), Current::default());
    }
}
