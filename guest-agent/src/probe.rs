//! A service's readiness: which of its TCP ports accept a connection on the guest's
//! loopback (what `ProbePorts` asks). A port accepts when its listener completes the
//! handshake; the probe closes the connection at once, as a container health check does.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use voidbox_protocol::{ErrorCode, MAX_PROBE_PORTS};

/// Longest one port's connect may take (a listener's full backlog, not a refusal).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The ports among `ports` that accept a TCP connection on 127.0.0.1, in order; more than
/// [`MAX_PROBE_PORTS`] or a port 0 is refused.
pub fn open_ports(ports: &[u16]) -> Result<Vec<u16>, (ErrorCode, String)> {
    if ports.len() > MAX_PROBE_PORTS {
        return Err((
            ErrorCode::InvalidRequest,
            format!("{} ports to probe: at most {MAX_PROBE_PORTS}", ports.len()),
        ));
    }
    if ports.contains(&0) {
        return Err((ErrorCode::InvalidRequest, "port 0 cannot be probed".into()));
    }
    Ok(ports
        .iter()
        .copied()
        .filter(|&p| {
            TcpStream::connect_timeout(&SocketAddr::from((Ipv4Addr::LOCALHOST, p)), CONNECT_TIMEOUT)
                .is_ok()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_ports_are_open_and_others_not() {
        let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let open = l.local_addr().unwrap().port();
        // A port that was bound and released: nothing listens there now.
        let closed = {
            let t = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            t.local_addr().unwrap().port()
        };
        assert_eq!(open_ports(&[closed, open]).unwrap(), vec![open]);
        drop(l);
        assert_eq!(open_ports(&[open]).unwrap(), Vec::<u16>::new());
    }

    #[test]
    fn bad_requests_are_refused() {
        assert_eq!(open_ports(&[0]).unwrap_err().0, ErrorCode::InvalidRequest);
        let many = vec![1u16; MAX_PROBE_PORTS + 1];
        assert_eq!(open_ports(&many).unwrap_err().0, ErrorCode::InvalidRequest);
    }
}
