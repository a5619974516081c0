//! A service's readiness, as the host asks for it: which of its TCP ports accept a
//! connection at one of the guest's own addresses (`ProbePorts`), and whether its ready file
//! is complete (a `ReadFile` with `complete`). A port accepts when its listener completes
//! the handshake; the probe closes the connection at once, as a container health check does.
//! A file is complete when no process holds it open for writing: written and closed, or
//! renamed into place.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use voidbox_protocol::{ErrorCode, MAX_PROBE_PORTS};

/// Longest one port's connect may take (a listener's full backlog, not a refusal).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The ports among `ports` that accept a TCP connection at `addr` (127.0.0.1 when `None`),
/// in order. More than [`MAX_PROBE_PORTS`], a port 0, or an address that is not one of this
/// machine's own is refused: the probe reaches the guest's own listeners, nothing else.
pub fn open_ports(ports: &[u16], addr: Option<Ipv4Addr>) -> Result<Vec<u16>, (ErrorCode, String)> {
    if ports.len() > MAX_PROBE_PORTS {
        return Err((
            ErrorCode::InvalidRequest,
            format!("{} ports to probe: at most {MAX_PROBE_PORTS}", ports.len()),
        ));
    }
    if ports.contains(&0) {
        return Err((ErrorCode::InvalidRequest, "port 0 cannot be probed".into()));
    }
    let addr = addr.unwrap_or(Ipv4Addr::LOCALHOST);
    if !is_own_address(addr) {
        return Err((
            ErrorCode::InvalidRequest,
            format!("{addr} is not an address of this guest: only its own listeners are probed"),
        ));
    }
    Ok(ports
        .iter()
        .copied()
        .filter(|&p| {
            TcpStream::connect_timeout(&SocketAddr::from((addr, p)), CONNECT_TIMEOUT).is_ok()
        })
        .collect())
}

/// `addr` is one of this machine's own addresses (a socket can be bound to it).
fn is_own_address(addr: Ipv4Addr) -> bool {
    !addr.is_unspecified() && UdpSocket::bind((addr, 0)).is_ok()
}

/// Some process holds `file` (the same inode) open for writing, as `/proc/*/fd` and
/// `/proc/*/fdinfo` say; a process whose descriptors cannot be read (it is exiting) counts
/// as not holding it.
pub fn open_for_writing(file: &File) -> std::io::Result<bool> {
    let meta = file.metadata()?;
    let (dev, ino) = (meta.dev(), meta.ino());
    for proc_entry in std::fs::read_dir("/proc")?.flatten() {
        let name = proc_entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let pid_dir = proc_entry.path();
        let Ok(fds) = std::fs::read_dir(pid_dir.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let same = std::fs::metadata(fd.path()).is_ok_and(|m| m.dev() == dev && m.ino() == ino);
            if same && writable(&pid_dir.join("fdinfo").join(fd.file_name())) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// `path` (under the file roots) is complete: it opens, and no process holds it open for
/// writing ([`ErrorCode::Busy`] then, with a message saying so).
pub fn complete(roots: &crate::files::Roots, path: &str) -> Result<(), (ErrorCode, String)> {
    let file = roots.open_read(path).map_err(|e| (e.code, e.message))?;
    match open_for_writing(&file) {
        Ok(false) => Ok(()),
        Ok(true) => Err((ErrorCode::Busy, format!("{path} is still open for writing"))),
        Err(e) => Err((
            ErrorCode::Io,
            format!("{path}: cannot tell its writers: {e}"),
        )),
    }
}

/// The descriptor whose `fdinfo` this is was opened for writing (`flags:` in octal; its
/// access mode is not `O_RDONLY`).
fn writable(fdinfo: &Path) -> bool {
    std::fs::read_to_string(fdinfo).is_ok_and(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            .is_some_and(|flags| flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn listening_ports_are_open_and_others_not() {
        let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let open = l.local_addr().unwrap().port();
        // A port that was bound and released: nothing listens there now.
        let closed = {
            let t = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            t.local_addr().unwrap().port()
        };
        assert_eq!(open_ports(&[closed, open], None).unwrap(), vec![open]);
        drop(l);
        assert_eq!(open_ports(&[open], None).unwrap(), Vec::<u16>::new());
    }

    /// A listener bound to one address only (here 127.0.0.2, as a service bound to its NIC
    /// address `10.0.2.15` in the guest) is open at that address and not at 127.0.0.1.
    #[test]
    fn a_listener_bound_to_one_address_is_open_there_only() {
        let own = Ipv4Addr::new(127, 0, 0, 2);
        let l = std::net::TcpListener::bind((own, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(open_ports(&[port], None).unwrap(), Vec::<u16>::new());
        assert_eq!(open_ports(&[port], Some(own)).unwrap(), vec![port]);
    }

    #[test]
    fn bad_requests_are_refused() {
        assert_eq!(
            open_ports(&[0], None).unwrap_err().0,
            ErrorCode::InvalidRequest
        );
        let many = vec![1u16; MAX_PROBE_PORTS + 1];
        assert_eq!(
            open_ports(&many, None).unwrap_err().0,
            ErrorCode::InvalidRequest
        );
        // Not an address of this machine (TEST-NET-1), nor the unspecified one.
        for addr in [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::UNSPECIFIED] {
            let (code, why) = open_ports(&[80], Some(addr)).unwrap_err();
            assert_eq!(code, ErrorCode::InvalidRequest);
            assert!(why.contains("not an address of this guest"), "{why}");
        }
    }

    #[test]
    fn a_file_is_complete_once_its_writers_closed_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("output.json");
        let mut w = File::create(&path).unwrap();
        w.write_all(b"{\"partial\":").unwrap();
        let r = File::open(&path).unwrap();
        assert!(open_for_writing(&r).unwrap(), "a writer holds it");
        w.write_all(b"true}").unwrap();
        drop(w);
        assert!(!open_for_writing(&r).unwrap(), "written and closed");
        // Opened read-write counts as a writer; read-only does not.
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        assert!(open_for_writing(&r).unwrap());
        drop(rw);
        let _other_reader = File::open(&path).unwrap();
        assert!(!open_for_writing(&r).unwrap());
        // Renamed into place: the new inode has no writer, even while the old one has.
        let tmp = dir.path().join("output.json.tmp");
        std::fs::write(&tmp, b"{\"done\":true}").unwrap();
        let _old_writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert!(!open_for_writing(&File::open(&path).unwrap()).unwrap());
    }
}
