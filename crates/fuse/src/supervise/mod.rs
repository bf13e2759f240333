//! The supervisor of a held connection (see [`held`]): it starts a
//! server process on it, starts another when that one dies and has the
//! kernel resend what the dead one was working on, replaces a live server
//! with a new one on request (an upgrade in place), and gives up on a
//! server that keeps dying.
//!
//! Its own signals: SIGTERM, SIGINT and SIGHUP detach the mount (the
//! servers answer the files still open in it, then exit); SIGUSR1 starts
//! a new server and retires the old one once the new one is ready.

pub mod held;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use held::Held;

/// When a server that keeps dying is given up on.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Deaths within [`Policy::window`] after which no server is started
    /// again.
    pub deaths: usize,
    /// The window deaths are counted in.
    pub window: Duration,
    /// The wait before the second restart within the window; it doubles
    /// for each one after, up to [`Policy::longest_wait`]. The first
    /// restart is at once.
    pub first_wait: Duration,
    /// The longest wait before a restart.
    pub longest_wait: Duration,
    /// How long a new server has to report ready before it is stopped
    /// (and counted as dead).
    pub ready_timeout: Duration,
    /// A server that served this long was well: its death (the OOM
    /// killer, `kill -9`, a bug one request hit) is not held against the
    /// mount. The count of deaths starts again and the next server starts
    /// at once. What keeps dying is what dies starting or soon after.
    pub healthy: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            deaths: 5,
            window: Duration::from_secs(60),
            first_wait: Duration::from_millis(100),
            longest_wait: Duration::from_secs(5),
            ready_timeout: Duration::from_secs(60),
            healthy: Duration::from_millis(500),
        }
    }
}

impl Policy {
    /// The wait before restarting after the `n`th death in the window.
    fn wait(&self, n: usize) -> Duration {
        if n <= 1 {
            return Duration::ZERO;
        }
        let doublings = (n - 2).min(16) as u32;
        (self.first_wait * 2u32.pow(doublings)).min(self.longest_wait)
    }
}

/// What the supervisor asks of its caller.
pub trait Starter {
    /// Starts a server process that takes over `handoff` (inheriting the
    /// descriptors it names) and writes `ready` on the inherited
    /// descriptor `ready` once it serves. `restarted`: an earlier server
    /// served this mount.
    fn start(&mut self, handoff: &str, ready: &OwnedFd, restarted: bool) -> io::Result<Child>;

    /// Something happened worth recording.
    fn event(&mut self, event: Event<'_>);

    /// Whether two servers must never run at once (they change state the
    /// supervisor holds for them, a ramfs's): a takeover then stops the
    /// running server before it starts the new one, which takes over what
    /// the old one was answering as a restarted server does.
    fn exclusive(&self) -> bool {
        false
    }

    /// Before an exclusive takeover stops the running server: whether the
    /// new one can be started at all (`Err`: the takeover is not made).
    fn preflight(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the supervisor reports to its [`Starter`].
#[derive(Debug)]
pub enum Event<'a> {
    /// Server `pid` serves the mount; `restarts` servers were started
    /// after the first.
    Serving {
        /// The server's process id.
        pid: u32,
        /// Servers started after the first.
        restarts: u32,
        /// What its ready report said besides what INIT agreed.
        report: &'a str,
    },
    /// Server `pid` died (`how`); another is started after `wait`.
    Died {
        /// The dead server's process id.
        pid: u32,
        /// Its exit, in words.
        how: &'a str,
        /// The wait before the next one starts.
        wait: Duration,
    },
    /// A new server asked for (SIGUSR1) did not come up; the old one
    /// serves on.
    TakeoverFailed {
        /// Why, in words.
        reason: &'a str,
    },
}

/// How supervision ended.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    /// The first server did not come up (in its words, where it said
    /// why); the mount was detached.
    #[error("{0}")]
    NeverServed(String),
    /// Servers kept dying; the mount was detached.
    #[error("{0}")]
    GaveUp(String),
    /// The supervisor's own machinery failed; the mount was detached.
    #[error("supervising the mount failed: {0}")]
    Failed(#[source] io::Error),
}

/// A server process and the pipe it reports ready on.
struct Server {
    child: Child,
    /// Until it reports ready: the read end, and when it was started.
    starting: Option<(File, Instant)>,
    /// What it has written on the pipe so far.
    said: Vec<u8>,
    /// When it reported ready.
    ready_at: Option<Instant>,
    /// Why it failed, in its words (`error: ...` on the pipe).
    failure: Option<String>,
}

impl Server {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// `status` in words.
fn describe(status: ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        let name = Signal::try_from(sig).map_or_else(|_| sig.to_string(), |s| s.to_string());
        let core = if status.core_dumped() {
            " (core dumped)"
        } else {
            ""
        };
        format!("killed by {name}{core}")
    } else {
        format!("exited with status {}", status.code().unwrap_or(-1))
    }
}

/// The signals the supervisor takes through its descriptor.
fn signals() -> SigSet {
    let mut s = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGUSR1,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        s.add(sig);
    }
    s
}

struct Supervisor<'a> {
    held: Held,
    starter: &'a mut dyn Starter,
    policy: Policy,
    /// The server answering the mount (or, before the first is ready, the
    /// one starting).
    current: Option<Server>,
    /// A server starting to replace `current` (SIGUSR1).
    next: Option<Server>,
    deaths: VecDeque<Instant>,
    restarts: u32,
    /// When the next server is due, after a death.
    due: Option<Instant>,
    served: bool,
    detached: bool,
}

/// Supervises `held` until the mount is gone: `Ok` once it was unmounted
/// and the last server exited. `on_ready` runs once, when the first
/// server reports ready, after its [`Event::Serving`].
///
/// Call this from a process with no other threads that take signals: it
/// blocks SIGCHLD, SIGUSR1, SIGTERM, SIGINT and SIGHUP and takes them
/// through a signal descriptor.
pub fn supervise(
    held: Held,
    starter: &mut dyn Starter,
    policy: Policy,
    on_ready: &mut dyn FnMut(u32),
) -> Result<(), Ended> {
    let mask = signals();
    mask.thread_block()
        .map_err(|e| Ended::Failed(io::Error::from(e)))?;
    let mut sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| Ended::Failed(io::Error::from(e)))?;
    let mut s = Supervisor {
        held,
        starter,
        policy,
        current: None,
        next: None,
        deaths: VecDeque::new(),
        restarts: 0,
        due: None,
        served: false,
        detached: false,
    };
    let r = s.run(&mut sfd, on_ready);
    if r.is_err() && !s.detached {
        let _ = s.held.detach();
    }
    for srv in [s.current.take(), s.next.take()].into_iter().flatten() {
        let mut c = srv.child;
        let _ = c.kill();
        let _ = c.wait();
    }
    r
}

impl Supervisor<'_> {
    fn start(&mut self, restarted: bool) -> io::Result<Server> {
        let (fds, handoff) = self.held.handoff()?;
        let (rd, wr) = std::io::pipe()?;
        // Inherited by the server: a duplicate without close-on-exec.
        let wr_child = nix::unistd::dup(wr.as_fd()).map_err(io::Error::from)?;
        drop(wr);
        let child = self.starter.start(&handoff, &wr_child, restarted);
        drop(fds);
        drop(wr_child);
        let rd = File::from(OwnedFd::from(rd));
        nix::fcntl::fcntl(
            &rd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(io::Error::from)?;
        Ok(Server {
            child: child?,
            starting: Some((rd, Instant::now())),
            said: Vec::new(),
            ready_at: None,
            failure: None,
        })
    }

    fn run(&mut self, sfd: &mut SignalFd, on_ready: &mut dyn FnMut(u32)) -> Result<(), Ended> {
        self.current = Some(
            self.start(false)
                .map_err(|e| Ended::NeverServed(format!("cannot start the server: {e}")))?,
        );
        loop {
            let now = Instant::now();
            if self.due.is_some_and(|d| d <= now) {
                self.due = None;
                self.restarts += 1;
                match self.start(true) {
                    Ok(srv) => self.current = Some(srv),
                    Err(e) => {
                        let how = format!("cannot start a server: {e}");
                        self.died(None, &how)?;
                        continue;
                    }
                }
            }
            self.stop_late_starters(now);
            let timeout = self
                .next_deadline()
                .map(|d| d.saturating_duration_since(now));
            self.wait(sfd, timeout, on_ready)?;
            if self.reap()? {
                return Ok(());
            }
        }
    }

    /// The soonest moment something is due: a restart, or a starting
    /// server's time to report.
    fn next_deadline(&self) -> Option<Instant> {
        let starting = [&self.current, &self.next]
            .into_iter()
            .flatten()
            .filter_map(|s| {
                s.starting
                    .as_ref()
                    .map(|(_, t)| *t + self.policy.ready_timeout)
            });
        starting.chain(self.due).min()
    }

    /// Kills a server that did not report ready in time; its death is
    /// reaped as any other.
    fn stop_late_starters(&mut self, now: Instant) {
        let limit = self.policy.ready_timeout;
        for srv in [&mut self.current, &mut self.next].into_iter().flatten() {
            if srv
                .starting
                .as_ref()
                .is_some_and(|(_, t)| now.duration_since(*t) >= limit)
            {
                log::warn!(
                    "server {} did not report ready within {}s: stopping it",
                    srv.pid(),
                    limit.as_secs()
                );
                let _ = srv.child.kill();
            }
        }
    }

    /// Waits for a signal, a ready report, or `timeout`, and handles what
    /// came.
    fn wait(
        &mut self,
        sfd: &mut SignalFd,
        timeout: Option<Duration>,
        on_ready: &mut dyn FnMut(u32),
    ) -> Result<(), Ended> {
        let timeout = match timeout {
            None => PollTimeout::NONE,
            Some(d) => PollTimeout::try_from(d.as_millis().min(60_000) as u32 + 1)
                .unwrap_or(PollTimeout::MAX),
        };
        {
            let mut fds = vec![PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
            for srv in [&self.current, &self.next].into_iter().flatten() {
                if let Some((rd, _)) = &srv.starting {
                    fds.push(PollFd::new(rd.as_fd(), PollFlags::POLLIN));
                }
            }
            match nix::poll::poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(Ended::Failed(e.into())),
            }
        }
        self.read_reports(on_ready);
        while let Ok(Some(info)) = sfd.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP) => {
                    log::info!("unmounting {}", self.held.info().mountpoint.display());
                    if let Err(e) = self.held.detach() {
                        log::warn!("unmount: {e}");
                    }
                    self.detached = true;
                }
                Ok(Signal::SIGUSR1) => self.take_over()?,
                _ => {}
            }
        }
        Ok(())
    }

    /// SIGUSR1: a new server from the binary on disk, to replace the
    /// running one once it is ready.
    fn take_over(&mut self) -> Result<(), Ended> {
        if self.next.is_some() || self.current.as_ref().is_none_or(|c| c.starting.is_some()) {
            log::info!("a server is starting already: the new one is not started");
            return Ok(());
        }
        if self.starter.exclusive() {
            return self.take_over_exclusive();
        }
        match self.start(true) {
            Ok(srv) => {
                log::info!("server {} starting to take over", srv.pid());
                self.next = Some(srv);
            }
            Err(e) => {
                let reason = format!("cannot start the new server: {e}");
                self.starter
                    .event(Event::TakeoverFailed { reason: &reason });
            }
        }
        Ok(())
    }

    /// A takeover where two servers may not run at once: the old one is
    /// stopped first, what it had read resent, and the new one started in
    /// its place (its start-up is the pause the mount sees).
    fn take_over_exclusive(&mut self) -> Result<(), Ended> {
        if let Err(e) = self.starter.preflight() {
            let reason = format!("the new server cannot start: {e}");
            self.starter
                .event(Event::TakeoverFailed { reason: &reason });
            return Ok(());
        }
        if let Some(mut old) = self.current.take() {
            log::info!("stopping server {} for the new one", old.pid());
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
        if let Err(e) = self.held.resend() {
            log::warn!("resending the old server's requests: {e}");
        }
        self.restarts += 1;
        match self.start(true) {
            Ok(srv) => {
                log::info!("server {} taking over", srv.pid());
                self.current = Some(srv);
            }
            Err(e) => {
                let how = format!("cannot start a server: {e}");
                self.died(None, &how)?;
            }
        }
        Ok(())
    }

    /// Takes the ready reports in: a first server's calls `on_ready`, a
    /// new one's retires the old one. A server that reports a failure
    /// instead is left to die of it (and is reaped as dead).
    fn read_reports(&mut self, on_ready: &mut dyn FnMut(u32)) {
        for slot in [0, 1] {
            let srv = match slot {
                0 => self.current.as_mut(),
                _ => self.next.as_mut(),
            };
            let Some(srv) = srv else { continue };
            let Some((rd, _)) = srv.starting.as_mut() else {
                continue;
            };
            let mut buf = [0u8; 4096];
            // Bounded: a line a server could not end is not waited for.
            while let Ok(n) = rd.read(&mut buf) {
                if n == 0 || srv.said.len() > 64 << 10 {
                    break;
                }
                srv.said.extend_from_slice(&buf[..n]);
            }
            let Some(end) = srv.said.iter().position(|&b| b == b'\n') else {
                continue;
            };
            let line = String::from_utf8_lossy(&srv.said[..=end]).into_owned();
            srv.said.clear();
            if let Some(why) = line.strip_prefix("error: ") {
                srv.failure = Some(why.trim_end().to_owned());
                continue;
            }
            let report = match self.held.learn(&line) {
                Ok(r) => r.to_owned(),
                Err(e) => {
                    srv.failure = Some(e.to_string());
                    let _ = srv.child.kill();
                    continue;
                }
            };
            srv.starting = None;
            srv.ready_at = Some(Instant::now());
            let pid = srv.pid();
            if slot == 1 {
                self.retire_current();
                self.current = self.next.take();
                self.restarts += 1;
            }
            // The event first: it records the mount, and whoever waits
            // for readiness (the command that started a background mount)
            // may list it the moment it is told.
            self.starter.event(Event::Serving {
                pid,
                restarts: self.restarts,
                report: &report,
            });
            if !self.served {
                self.served = true;
                on_ready(pid);
            }
        }
    }

    /// Stops the server a new one replaces and has the kernel resend what
    /// it had read: the new one answers it.
    fn retire_current(&mut self) {
        if let Some(mut old) = self.current.take() {
            let _ = old.child.kill();
            let _ = old.child.wait();
            if let Err(e) = self.held.resend() {
                log::warn!("resending the old server's requests: {e}");
            }
        }
    }

    /// Reaps dead servers. `Ok(true)`: the mount is gone and the last
    /// server exited.
    fn reap(&mut self) -> Result<bool, Ended> {
        if let Some(next) = self.next.as_mut() {
            if let Ok(Some(st)) = next.child.try_wait() {
                let how = next.failure.take().unwrap_or_else(|| describe(st));
                let reason = format!("the new server {how}");
                self.next = None;
                self.starter
                    .event(Event::TakeoverFailed { reason: &reason });
            }
        }
        let Some(cur) = self.current.as_mut() else {
            return Ok(false);
        };
        let Ok(Some(status)) = cur.child.try_wait() else {
            return Ok(false);
        };
        let pid = cur.pid();
        let was_starting = cur.starting.is_some();
        let was_well = cur
            .ready_at
            .is_some_and(|t| t.elapsed() >= self.policy.healthy);
        let failure = cur.failure.take();
        self.current = None;
        // A server exits 0 when the connection is gone: unmounted.
        if status.success() {
            if let Some(mut n) = self.next.take() {
                let _ = n.child.kill();
                let _ = n.child.wait();
            }
            return Ok(true);
        }
        if !self.served && was_starting {
            return Err(Ended::NeverServed(
                failure.unwrap_or_else(|| format!("the server {}", describe(status))),
            ));
        }
        let how = failure.unwrap_or_else(|| describe(status));
        if !self.held.can_resend() {
            return Err(Ended::GaveUp(format!(
                "the server {how}, and this kernel cannot resend what it was working on (FUSE_NOTIFY_RESEND, Linux 6.9): the mount ends with it"
            )));
        }
        // What it had read goes to whoever serves next.
        if let Err(e) = self.held.resend() {
            log::warn!("resending the dead server's requests: {e}");
        }
        if was_well {
            self.deaths.clear();
        }
        self.died(Some(pid), &how)?;
        Ok(false)
    }

    /// Counts a death, and schedules the next server or gives up.
    fn died(&mut self, pid: Option<u32>, how: &str) -> Result<(), Ended> {
        let now = Instant::now();
        self.deaths.push_back(now);
        while self
            .deaths
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.policy.window)
        {
            self.deaths.pop_front();
        }
        let n = self.deaths.len();
        if n >= self.policy.deaths {
            return Err(Ended::GaveUp(format!(
                "the server died {n} times within {}s (the last {how}): the mount is given up",
                self.policy.window.as_secs()
            )));
        }
        // A new server taking over already serves.
        if let Some(next) = self.next.take() {
            self.current = Some(next);
            self.restarts += 1;
            return Ok(());
        }
        let wait = self.policy.wait(n);
        self.starter.event(Event::Died {
            pid: pid.unwrap_or(0),
            how,
            wait,
        });
        self.due = Some(now + wait);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_wait_longer_each_time_up_to_a_limit() {
        let p = Policy::default();
        assert_eq!(p.wait(1), Duration::ZERO);
        assert_eq!(p.wait(2), Duration::from_millis(100));
        assert_eq!(p.wait(3), Duration::from_millis(200));
        assert_eq!(p.wait(4), Duration::from_millis(400));
        assert_eq!(p.wait(40), Duration::from_secs(5));
    }
}
