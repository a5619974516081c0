//! The vsock muxer thread: one epoll set over the per-VM Unix listener, the accepted host
//! streams and the device's kick eventfd. It owns all queue processing for the device.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::{lock, VsockBackend};

/// Longest `CONNECT <port>\n` line accepted.
pub const MAX_HANDSHAKE_LINE: usize = 32;
/// Most host connections waiting to send their CONNECT line.
pub const MAX_HANDSHAKES: usize = 64;
/// How long a host connection may take to send its CONNECT line.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const POLL_MS: i32 = 250;

struct Handshake {
    stream: UnixStream,
    buf: Vec<u8>,
    since: Instant,
}

/// Parses `CONNECT <port>` (without the newline).
pub fn parse_connect_line(line: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(line).ok()?;
    let s = s.strip_suffix('\r').unwrap_or(s);
    let port = s.strip_prefix("CONNECT ")?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

/// The muxer.
pub struct Muxer {
    epoll: Epoll,
    listener: UnixListener,
    kick: Arc<EventFd>,
    backend: Arc<Mutex<VsockBackend>>,
    handshakes: BTreeMap<RawFd, Handshake>,
    registered: BTreeMap<RawFd, EventSet>,
    stop: Arc<AtomicBool>,
}

impl Muxer {
    /// Sets up epoll over `listener` (made non-blocking) and `kick`.
    pub fn new(
        listener: UnixListener,
        kick: Arc<EventFd>,
        backend: Arc<Mutex<VsockBackend>>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let epoll = Epoll::new()?;
        let lfd = listener.as_raw_fd();
        epoll.ctl(
            ControlOperation::Add,
            lfd,
            EpollEvent::new(EventSet::IN, lfd as u64),
        )?;
        let kfd = kick.as_raw_fd();
        epoll.ctl(
            ControlOperation::Add,
            kfd,
            EpollEvent::new(EventSet::IN, kfd as u64),
        )?;
        Ok(Self {
            epoll,
            listener,
            kick,
            backend,
            handshakes: BTreeMap::new(),
            registered: BTreeMap::new(),
            stop,
        })
    }

    /// Runs until the stop flag is set.
    pub fn run(mut self) {
        let mut events = vec![EpollEvent::default(); 64];
        while !self.stop.load(Ordering::Relaxed) {
            let n = match self.epoll.wait(POLL_MS, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    log::error!("vsock muxer: epoll_wait failed: {e}");
                    std::thread::sleep(Duration::from_millis(POLL_MS as u64));
                    0
                }
            };
            let ready: Vec<(RawFd, EventSet)> = events[..n]
                .iter()
                .map(|e| (e.data() as RawFd, e.event_set()))
                .collect();
            self.iteration(&ready);
        }
    }

    /// One round: handle `ready` fds, process the queues, resync epoll interests.
    pub fn iteration(&mut self, ready: &[(RawFd, EventSet)]) {
        let lfd = self.listener.as_raw_fd();
        let kfd = self.kick.as_raw_fd();
        for &(fd, ev) in ready {
            if fd == lfd {
                self.accept_all();
            } else if fd == kfd {
                // A failed read only means there was nothing to consume.
                let _ = self.kick.read();
            } else if self.handshakes.contains_key(&fd) {
                self.advance_handshake(fd);
            } else {
                let mut b = lock(&self.backend);
                if let Some(key) = b.key_for_fd(fd) {
                    let hup =
                        ev.intersects(EventSet::HANG_UP | EventSet::ERROR | EventSet::READ_HANG_UP);
                    b.stream_event(
                        key,
                        ev.contains(EventSet::IN) || hup,
                        ev.contains(EventSet::OUT),
                        hup,
                    );
                }
            }
        }
        let reaped = {
            let mut b = lock(&self.backend);
            b.process();
            b.reap(Instant::now())
        };
        for c in reaped {
            let fd = c.stream().as_raw_fd();
            if self.registered.remove(&fd).is_some() {
                self.epoll_del(fd);
            }
            drop(c);
        }
        self.sync_interests();
        self.expire_handshakes();
    }

    fn epoll_del(&self, fd: RawFd) {
        // ENOENT/EBADF when the fd was already closed (device reset): nothing to do.
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }

    fn sync_interests(&mut self) {
        let wanted: BTreeMap<RawFd, EventSet> = lock(&self.backend)
            .poll_interests()
            .into_iter()
            .map(|(fd, r, w, h)| {
                let mut ev = EventSet::empty();
                if r {
                    ev |= EventSet::IN;
                }
                if w {
                    ev |= EventSet::OUT;
                }
                if h {
                    ev |= EventSet::READ_HANG_UP;
                }
                (fd, ev)
            })
            .filter(|(_, ev)| !ev.is_empty())
            .collect();
        let stale: Vec<RawFd> = self
            .registered
            .keys()
            .filter(|fd| !wanted.contains_key(fd))
            .copied()
            .collect();
        for fd in stale {
            self.registered.remove(&fd);
            self.epoll_del(fd);
        }
        for (fd, ev) in wanted {
            let op = match self.registered.get(&fd) {
                None => ControlOperation::Add,
                Some(old) if *old != ev => ControlOperation::Modify,
                Some(_) => continue,
            };
            match self.epoll.ctl(op, fd, EpollEvent::new(ev, fd as u64)) {
                Ok(()) => {
                    self.registered.insert(fd, ev);
                }
                Err(e) => log::warn!("vsock muxer: epoll_ctl({fd}) failed: {e}"),
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            // SAFETY: accept4 on a listening socket we own, with null address pointers; the
            // returned fd (if any) is new and owned by nobody else.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return,
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => continue,
                    _ => {
                        log::warn!("vsock muxer: accept failed: {e}");
                        return;
                    }
                }
            }
            // SAFETY: `fd` was just returned by accept4 and is exclusively ours.
            let stream = unsafe { UnixStream::from_raw_fd(fd) };
            if self.handshakes.len() >= MAX_HANDSHAKES {
                log::warn!("vsock muxer: too many pending host connections");
                continue;
            }
            let ev = EpollEvent::new(EventSet::IN | EventSet::READ_HANG_UP, fd as u64);
            if let Err(e) = self.epoll.ctl(ControlOperation::Add, fd, ev) {
                log::warn!("vsock muxer: cannot watch host connection: {e}");
                continue;
            }
            self.handshakes.insert(
                fd,
                Handshake {
                    stream,
                    buf: Vec::new(),
                    since: Instant::now(),
                },
            );
        }
    }

    fn advance_handshake(&mut self, fd: RawFd) {
        let Some(hs) = self.handshakes.get_mut(&fd) else {
            return;
        };
        let mut tmp = [0u8; MAX_HANDSHAKE_LINE];
        let room = MAX_HANDSHAKE_LINE - hs.buf.len();
        let done = match hs.stream.read(&mut tmp[..room.max(1)]) {
            Ok(0) => Some(None),
            Ok(n) => {
                hs.buf.extend_from_slice(&tmp[..n]);
                match hs.buf.iter().position(|b| *b == b'\n') {
                    Some(pos) => Some(parse_connect_line(&hs.buf[..pos]).map(|p| (p, pos))),
                    None if hs.buf.len() >= MAX_HANDSHAKE_LINE => Some(None),
                    None => None,
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
            Err(_) => Some(None),
        };
        let Some(result) = done else {
            return;
        };
        let Some(hs) = self.handshakes.remove(&fd) else {
            return;
        };
        self.epoll_del(fd);
        let Some((port, pos)) = result else {
            log::debug!("vsock muxer: bad CONNECT line from host");
            return; // dropping the stream closes it
        };
        let early = hs.buf.get(pos + 1..).unwrap_or(&[]).to_vec();
        let mut b = lock(&self.backend);
        match b.connect_from_host(port, hs.stream) {
            Some(local) => {
                if !early.is_empty() {
                    if let Some(c) = b.connection_mut(local, port) {
                        c.preload_rx(early);
                    }
                }
            }
            None => log::debug!("vsock muxer: CONNECT {port} refused (device not ready)"),
        }
    }

    fn expire_handshakes(&mut self) {
        let now = Instant::now();
        let old: Vec<RawFd> = self
            .handshakes
            .iter()
            .filter(|(_, h)| now.duration_since(h.since) > HANDSHAKE_TIMEOUT)
            .map(|(fd, _)| *fd)
            .collect();
        for fd in old {
            self.handshakes.remove(&fd);
            self.epoll_del(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_line() {
        assert_eq!(parse_connect_line(b"CONNECT 1234"), Some(1234));
        assert_eq!(parse_connect_line(b"CONNECT 1234\r"), Some(1234));
        assert_eq!(parse_connect_line(b"CONNECT 4294967295"), Some(u32::MAX));
        assert_eq!(parse_connect_line(b"CONNECT 4294967296"), None);
        assert_eq!(parse_connect_line(b"CONNECT -1"), None);
        assert_eq!(parse_connect_line(b"CONNECT +1"), None);
        assert_eq!(parse_connect_line(b"CONNECT "), None);
        assert_eq!(parse_connect_line(b"connect 1"), None);
        assert_eq!(parse_connect_line(b"CONNECT 1 2"), None);
        assert_eq!(parse_connect_line(b"\xffCONNECT 1"), None);
    }
}
