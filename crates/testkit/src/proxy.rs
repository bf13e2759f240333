//! A fault-injecting HTTP/1.1 proxy on loopback, between a client and an
//! object store (the [`crate::weed`] server): every request is passed on
//! as it came (its `Host` header too, so a SigV4 signature made for the
//! proxy's address still holds), and the answer is handed back as the
//! [`Fault`] set at that moment says. The fault can be changed at any
//! time with [`FaultProxy::set`]; it applies to the requests that start
//! after.
//!
//! One thread per client connection, kept alive as the client wishes;
//! each request is sent upstream on a connection of its own
//! (`Connection: close`), and its whole answer read before any of it is
//! sent on, so that a fault can cut or change it anywhere.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the proxy answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// As the server answered.
    None,
    /// As the server answered, this much later.
    Delay(Duration),
    /// The head and half of the body, then nothing until the fault is
    /// changed (at most [`STALL_MAX`]), then the connection is closed.
    Stall,
    /// The head and half of the body, then a TCP reset.
    Reset,
    /// The head (with the right `Content-Length`) and half of the body,
    /// then the connection is closed.
    Short,
    /// A `Content-Range` one byte later than the body sent.
    WrongRange,
    /// This status (with an S3-style error body) for the next `count`
    /// requests, then the server's answers again.
    Burst {
        /// The status sent instead.
        status: u16,
        /// How many requests get it.
        count: u64,
    },
    /// The server's answers for `after` more requests, then 403 for all.
    ForbiddenAfter(u64),
    /// The server's answer with another `ETag`.
    OtherEtag,
    /// The server's body, of the right length, with one byte in every
    /// 4 KiB flipped.
    Flip,
}

/// The longest a [`Fault::Stall`] holds a connection.
pub const STALL_MAX: Duration = Duration::from_secs(120);

/// The largest request head accepted from a client.
const MAX_HEAD: usize = 64 << 10;

struct State {
    fault: Mutex<Fault>,
    /// Requests that reached the proxy, and those it answered with a
    /// fault other than [`Fault::None`].
    requests: AtomicU64,
    faulted: AtomicU64,
    /// Requests a `Burst` or `ForbiddenAfter` has counted.
    counted: AtomicU64,
    stop: AtomicBool,
}

/// A proxy of its own on loopback, stopped when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free loopback port and passes requests on to
    /// `upstream` (`http://HOST:PORT`, as [`crate::weed::Weed::endpoint`]
    /// gives it).
    pub fn start(upstream: &str) -> io::Result<FaultProxy> {
        let hostport = upstream
            .strip_prefix("http://")
            .ok_or_else(|| io::Error::other(format!("{upstream}: not an http:// endpoint")))?
            .trim_end_matches('/');
        let up = hostport
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::other(format!("{upstream}: no address")))?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            fault: Mutex::new(Fault::None),
            requests: AtomicU64::new(0),
            faulted: AtomicU64::new(0),
            counted: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = state.clone();
        let accept = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("fault-proxy-conn".into())
                        .spawn(move || {
                            let _ = serve(conn, up, &s);
                        });
                }
            })?;
        Ok(FaultProxy {
            addr,
            state,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:PORT`, the proxy's endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The mount options that reach the server through the proxy.
    pub fn mount_options(&self) -> String {
        format!("endpoint={},path_style,insecure_http", self.endpoint())
    }

    /// Answers from now on as `fault` says (counting a burst or the
    /// requests before a 403 from now).
    pub fn set(&self, fault: Fault) {
        let mut f = self.state.fault.lock().unwrap();
        self.state.counted.store(0, Ordering::Relaxed);
        *f = fault;
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        self.state.fault.lock().unwrap().clone()
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// Requests answered with a fault so far.
    pub fn faulted(&self) -> u64 {
        self.state.faulted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        *self.state.fault.lock().unwrap() = Fault::None;
        // Wakes the accepting thread.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// A request or response head: its first line and its headers.
struct Head {
    line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn set(&mut self, name: &str, value: String) {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value));
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.line);
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.into_bytes()
    }
}

/// Reads a head; `None` at a clean end of the connection.
fn read_head(r: &mut impl BufRead) -> io::Result<Option<Head>> {
    let mut line = String::new();
    let mut total = 0;
    let mut lines = Vec::new();
    loop {
        line.clear();
        let n = r.read_line(&mut line)?;
        if n == 0 {
            return if lines.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        total += n;
        if total > MAX_HEAD {
            return Err(io::Error::other("head too long"));
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            if lines.is_empty() {
                continue;
            }
            break;
        }
        lines.push(l.to_owned());
    }
    let first = lines.remove(0);
    let headers = lines
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Some(Head {
        line: first,
        headers,
    }))
}

/// Serves one client connection until it closes.
fn serve(client: TcpStream, upstream: SocketAddr, s: &State) -> io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client = client;
    while let Some(mut req) = read_head(&mut reader)? {
        s.requests.fetch_add(1, Ordering::Relaxed);
        let is_head = req.line.starts_with("HEAD ");
        let fault = s.fault.lock().unwrap().clone();
        // Requests carry no body here (HEAD and GET), so none is read.
        req.set("Connection", "close".to_owned());
        let (mut head, mut body) = fetch(upstream, &req, is_head)?;
        let counted = s.counted.fetch_add(1, Ordering::Relaxed);
        let status = match fault {
            Fault::Burst { status, count } if counted < count => Some(status),
            Fault::ForbiddenAfter(n) if counted >= n => Some(403),
            _ => None,
        };
        let ranged = head.line.contains(" 206 ");
        if fault != Fault::None && (status.is_some() || ranged || fault_all(&fault)) {
            s.faulted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(code) = status {
            let text = format!("<?xml version=\"1.0\"?><Error><Code>Injected{code}</Code></Error>");
            let reason = match code {
                403 => "Forbidden",
                500 => "Internal Server Error",
                503 => "Service Unavailable",
                _ => "Injected",
            };
            let mut h = Head {
                line: format!("HTTP/1.1 {code} {reason}"),
                headers: vec![("Content-Type".into(), "application/xml".into())],
            };
            h.set("Content-Length", text.len().to_string());
            client.write_all(&h.bytes())?;
            if !is_head {
                client.write_all(text.as_bytes())?;
            }
            continue;
        }
        if !is_head {
            head.set("Content-Length", body.len().to_string());
        }
        head.headers
            .retain(|(k, _)| !k.eq_ignore_ascii_case("connection"));
        let half = body.len() / 2;
        match fault {
            Fault::Delay(d) => std::thread::sleep(d),
            Fault::WrongRange if ranged => {
                if let Some(r) = head.get("Content-Range").and_then(shift_range) {
                    head.set("Content-Range", r);
                }
            }
            Fault::OtherEtag => head.set("ETag", "\"0123456789abcdef0123456789abcdef\"".into()),
            Fault::Flip if ranged => {
                for i in (0..body.len()).step_by(4096) {
                    body[i] ^= 0x01;
                }
            }
            Fault::Stall | Fault::Reset | Fault::Short if ranged && half > 0 => {
                client.write_all(&head.bytes())?;
                client.write_all(&body[..half])?;
                client.flush()?;
                match fault {
                    Fault::Stall => {
                        let start = Instant::now();
                        while *s.fault.lock().unwrap() == Fault::Stall
                            && start.elapsed() < STALL_MAX
                            && !s.stop.load(Ordering::Relaxed)
                        {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        let _ = client.shutdown(Shutdown::Both);
                    }
                    Fault::Reset => reset(&client),
                    _ => {
                        let _ = client.shutdown(Shutdown::Both);
                    }
                }
                return Ok(());
            }
            _ => {}
        }
        client.write_all(&head.bytes())?;
        if !is_head {
            client.write_all(&body)?;
        }
        client.flush()?;
    }
    Ok(())
}

/// Whether `fault` changes answers other than ranged bodies.
fn fault_all(fault: &Fault) -> bool {
    matches!(fault, Fault::Delay(_) | Fault::OtherEtag)
}

/// `bytes A-B/T` as `bytes A+1-B+1/T`.
fn shift_range(v: &str) -> Option<String> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    Some(format!("bytes {}-{}/{total}", a + 1, b + 1))
}

/// Closes `conn` with a reset rather than a FIN: SO_LINGER of zero.
fn reset(conn: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads `linger`, which outlives the call, on a
    // socket `conn` keeps open.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = conn.shutdown(Shutdown::Read);
    // Dropping the caller's stream closes the socket, which now resets.
}

/// Sends `req` upstream on a connection of its own and reads the whole
/// answer.
fn fetch(upstream: SocketAddr, req: &Head, is_head: bool) -> io::Result<(Head, Vec<u8>)> {
    let mut up = TcpStream::connect_timeout(&upstream, Duration::from_secs(10))?;
    up.set_read_timeout(Some(Duration::from_secs(60)))?;
    up.write_all(&req.bytes())?;
    let mut r = BufReader::new(up);
    let head = read_head(&mut r)?.ok_or(io::ErrorKind::UnexpectedEof)?;
    let mut body = Vec::new();
    if !is_head {
        match head
            .get("Content-Length")
            .and_then(|v| v.parse::<u64>().ok())
        {
            Some(n) => {
                body.resize(n as usize, 0);
                r.read_exact(&mut body)?;
            }
            None => {
                r.read_to_end(&mut body)?;
            }
        }
    }
    Ok((head, body))
}
