//! A FUSE connection's life: the INIT handshake, then server threads each
//! reading requests on an open file of its own and answering them, until
//! the file system is unmounted (a read then fails with `ENODEV`).

use std::io;
use std::sync::Arc;

use super::abi::{self, InitIn, InitOut, KERNEL_MINOR_VERSION, KERNEL_VERSION};
use super::uring::Queues;
use super::{Agreed, Args, Dev, Handler, Reply, Request};

/// Reads the kernel's INIT on `dev` and answers it with what `handler`
/// takes. A kernel speaking another major version, or a minor older than
/// [`abi::OLDEST_MINOR_VERSION`], is refused (`EPROTO`).
pub fn handshake(dev: &Dev, handler: &dyn Handler) -> io::Result<Agreed> {
    let mut buf = vec![0u8; abi::MIN_READ_BUFFER.max(64 << 10)];
    let n = dev.read(&mut buf)?;
    let req = Request::parse(&buf[..n])
        .map_err(|e| io::Error::other(format!("the kernel's first request is garbled: {e:?}")))?;
    let Args::Init(init) = req.args else {
        return Err(io::Error::other(format!(
            "the kernel's first request is opcode {}, not INIT",
            req.header.opcode
        )));
    };
    if init.major != KERNEL_VERSION || init.minor < abi::OLDEST_MINOR_VERSION {
        Reply::new(req.header.unique, dev).error(libc::EPROTO);
        return Err(io::Error::other(format!(
            "the kernel speaks FUSE {}.{}; foliofs needs 7.{} or later",
            init.major,
            init.minor,
            abi::OLDEST_MINOR_VERSION
        )));
    }
    let mut offered = u64::from(init.flags);
    if offered & abi::init::INIT_EXT != 0 {
        offered |= u64::from(init.flags2) << 32;
    }
    let mut want = handler.init(offered, &init);
    want.flags &= offered;
    if want.flags >> 32 != 0 {
        want.flags |= abi::init::INIT_EXT;
    }
    if want.flags & abi::init::PASSTHROUGH == 0 {
        want.max_stack_depth = 0;
    }
    let max_pages = want.max_pages.max(1);
    let minor = init.minor.min(KERNEL_MINOR_VERSION);
    let out = InitOut {
        major: KERNEL_VERSION,
        minor,
        max_readahead: want.max_readahead.min(init.max_readahead),
        flags: want.flags as u32,
        max_background: want.max_background,
        congestion_threshold: want.congestion_threshold,
        max_write: u32::from(max_pages) * 4096,
        time_gran: 1,
        max_pages,
        map_alignment: 0,
        flags2: (want.flags >> 32) as u32,
        max_stack_depth: want.max_stack_depth,
        request_timeout: 0,
        unused: [0; 11],
    };
    Reply::new(req.header.unique, dev).record(&out);
    Ok(Agreed {
        minor,
        flags: want.flags,
        max_write: out.max_write,
        offered,
    })
}

/// Takes over a connection whose INIT an earlier server answered with
/// `agreed`: `handler` settles its state as if the kernel had offered
/// exactly what was agreed, and so takes exactly that.
pub fn resume(handler: &dyn Handler, agreed: Agreed) {
    handler.init(agreed.flags, &InitIn::default());
}

/// Serves requests on `main` and on each of `others` (open files of the
/// same connection), a thread each, and on the io_uring `queues` where
/// INIT took FUSE over io_uring, until the unmount; `main` is served on
/// the calling thread.
pub fn serve(
    main: Arc<Dev>,
    others: Vec<Dev>,
    queues: Option<Queues>,
    handler: Arc<dyn Handler>,
    agreed: Agreed,
) -> io::Result<()> {
    let size = agreed.buffer_size();
    let mut threads = match queues {
        Some(q) => q.serve(main.clone(), handler.clone())?,
        None => Vec::new(),
    };
    for (i, dev) in others.into_iter().enumerate() {
        let h = handler.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("foliofs-fuse-{}", i + 1))
                .spawn(move || worker(&dev, &*h, size))?,
        );
    }
    let first = worker(&main, &*handler, size);
    let mut result = first;
    for t in threads {
        let r = t
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a server thread panicked")));
        if result.is_ok() {
            result = r;
        }
    }
    handler.destroy();
    result
}

/// One server thread: read, answer, until the connection is gone.
fn worker(dev: &Dev, handler: &dyn Handler, size: usize) -> io::Result<()> {
    let mut buf = vec![0u8; size];
    loop {
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // Unmounted, or the connection aborted.
                Some(libc::ENODEV) => return Ok(()),
                // A polling descriptor found nothing yet: ask again.
                Some(libc::EAGAIN) => {
                    std::hint::spin_loop();
                    continue;
                }
                _ => return Err(e),
            },
        };
        match Request::parse(&buf[..n]) {
            Ok(req) => {
                let reply = Reply::new(req.header.unique, dev);
                handler.handle(req, reply);
            }
            Err(e) => log::warn!("a garbled request of {n} bytes ({e:?}): not answered"),
        }
    }
}
