//! The host's own addresses (every address of every interface in the VMM process's network
//! namespace), read over an `AF_NETLINK`/`NETLINK_ROUTE` socket: an `RTM_GETADDR` dump in
//! [`Nat::new`](crate::Nat::new), then again before a new outbound flow when the last read is
//! older than [`REFRESH`], so an address added later is a host address within that time.
//! The socket is created once, before seccomp; re-reading needs only `sendto` and `recvfrom`.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::host;

/// The longest a read set is trusted before a new outbound flow re-reads it.
pub(crate) const REFRESH: Duration = Duration::from_millis(50);

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const IFADDRMSG_LEN: usize = 8;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
/// Most messages read for one dump (a guard against a kernel that never says DONE).
const MAX_READS: usize = 4096;

/// The set of host addresses and the socket that re-reads it.
pub(crate) struct HostAddrs {
    sock: Option<Socket>,
    v4: BTreeSet<Ipv4Addr>,
    v6: BTreeSet<Ipv6Addr>,
    read_at: Option<Instant>,
    seq: u32,
    buf: Vec<u8>,
}

impl HostAddrs {
    /// Opens the netlink socket and reads the addresses once.
    pub(crate) fn open() -> io::Result<HostAddrs> {
        let sock = Socket::new(
            Domain::from(libc::AF_NETLINK),
            Type::RAW.nonblocking(),
            Some(Protocol::from(libc::NETLINK_ROUTE)),
        )?;
        let mut h = HostAddrs {
            sock: Some(sock),
            v4: BTreeSet::new(),
            v6: BTreeSet::new(),
            read_at: None,
            seq: 0,
            buf: vec![0; 32 * 1024],
        };
        let (v4, v6) = h.dump()?;
        h.v4 = v4;
        h.v6 = v6;
        h.read_at = Some(Instant::now());
        Ok(h)
    }

    /// A fixed set that is never re-read (tests).
    #[cfg(test)]
    pub(crate) fn fixed(addrs: &[IpAddr]) -> HostAddrs {
        let mut h = HostAddrs {
            sock: None,
            v4: BTreeSet::new(),
            v6: BTreeSet::new(),
            read_at: None,
            seq: 0,
            buf: Vec::new(),
        };
        for a in addrs {
            match a {
                IpAddr::V4(v4) => h.v4.insert(*v4),
                IpAddr::V6(v6) => h.v6.insert(*v6),
            };
        }
        h
    }

    /// Whether `ip` is one of the host's addresses (as last read).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => self.v4.contains(&v4),
            IpAddr::V6(v6) => {
                self.v6.contains(&v6) || v6.to_ipv4_mapped().is_some_and(|v| self.v4.contains(&v))
            }
        }
    }

    /// Re-reads the set when the last read is older than [`REFRESH`]. A failed read keeps
    /// the old set (and is retried on the next flow).
    pub(crate) fn refresh(&mut self, now: Instant) {
        if self.sock.is_none() || self.read_at.is_some_and(|t| now < t + REFRESH) {
            return;
        }
        match self.dump() {
            Ok((v4, v6)) => {
                self.v4 = v4;
                self.v6 = v6;
                self.read_at = Some(now);
            }
            Err(e) => log::warn!("net: re-reading the host's addresses: {e}"),
        }
    }

    /// One `RTM_GETADDR` dump (all families). The kernel queues the first part during
    /// `sendto` and each next part during the `recvfrom` that empties the queue, so a
    /// non-blocking socket never waits.
    fn dump(&mut self) -> io::Result<(BTreeSet<Ipv4Addr>, BTreeSet<Ipv6Addr>)> {
        let Some(sock) = &self.sock else {
            return Err(io::Error::other("no netlink socket"));
        };
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut req = Vec::with_capacity(NLMSG_HDRLEN + IFADDRMSG_LEN);
        req.extend_from_slice(&((NLMSG_HDRLEN + IFADDRMSG_LEN) as u32).to_ne_bytes());
        req.extend_from_slice(&RTM_GETADDR.to_ne_bytes());
        req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        req.extend_from_slice(&seq.to_ne_bytes());
        req.extend_from_slice(&0u32.to_ne_bytes());
        req.extend_from_slice(&[0u8; IFADDRMSG_LEN]); // AF_UNSPEC: every family
        host::send(sock, &req)?;
        let (mut v4, mut v6) = (BTreeSet::new(), BTreeSet::new());
        for _ in 0..MAX_READS {
            let n = match host::recv(sock, &mut self.buf) {
                Ok(n) => n,
                Err(e) if host::would_block(&e) => {
                    return Err(io::Error::other("address dump ended without NLMSG_DONE"))
                }
                Err(e) => return Err(e),
            };
            let buf = self.buf.get(..n).unwrap_or(&[]);
            if parse(buf, seq, &mut v4, &mut v6)? {
                return Ok((v4, v6));
            }
        }
        Err(io::Error::other("address dump did not end"))
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Adds the addresses of the `RTM_NEWADDR` messages of dump `seq` in `buf` (messages of
/// other sequence numbers are skipped); true at `NLMSG_DONE`.
fn parse(
    buf: &[u8],
    seq: u32,
    v4: &mut BTreeSet<Ipv4Addr>,
    v6: &mut BTreeSet<Ipv6Addr>,
) -> io::Result<bool> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink message");
    let mut at = 0;
    while at + NLMSG_HDRLEN <= buf.len() {
        let len = u32_at(buf, at).ok_or_else(bad)? as usize;
        let ty = u16_at(buf, at + 4).ok_or_else(bad)?;
        let mseq = u32_at(buf, at + 8).ok_or_else(bad)?;
        if len < NLMSG_HDRLEN || at + len > buf.len() {
            return Err(bad());
        }
        let msg = &buf[at + NLMSG_HDRLEN..at + len];
        at += align4(len);
        if mseq != seq {
            continue;
        }
        match ty {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(msg, 0).ok_or_else(bad)? as i32;
                return Err(io::Error::from_raw_os_error(errno.saturating_neg()));
            }
            RTM_NEWADDR => {
                let family = i32::from(*msg.first().ok_or_else(bad)?);
                let (mut local, mut address) = (None, None);
                let mut a = IFADDRMSG_LEN;
                while a + 4 <= msg.len() {
                    let alen = usize::from(u16_at(msg, a).ok_or_else(bad)?);
                    let aty = u16_at(msg, a + 2).ok_or_else(bad)?;
                    if alen < 4 || a + alen > msg.len() {
                        return Err(bad());
                    }
                    let data = &msg[a + 4..a + alen];
                    match aty {
                        IFA_LOCAL => local = Some(data),
                        IFA_ADDRESS => address = Some(data),
                        _ => {}
                    }
                    a += align4(alen);
                }
                // IFA_LOCAL is this host's end of a point-to-point link (IFA_ADDRESS is then
                // the peer); otherwise IFA_ADDRESS is the address.
                let Some(data) = local.or(address) else {
                    continue;
                };
                match (family, data.len()) {
                    (libc::AF_INET, 4) => {
                        v4.insert(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
                    }
                    (libc::AF_INET6, 16) => {
                        let mut o = [0u8; 16];
                        o.copy_from_slice(data);
                        v6.insert(Ipv6Addr::from(o));
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `ip -o addr` lists, parsed: (family, address).
    fn ip_addr_list() -> Vec<IpAddr> {
        let out = std::process::Command::new("ip")
            .args(["-o", "addr"])
            .output()
            .expect("iproute2's `ip`");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let mut w = l
                    .split_whitespace()
                    .skip_while(|w| *w != "inet" && *w != "inet6");
                w.next()?;
                w.next()?.split('/').next()?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn reads_every_address_ip_lists() {
        let h = HostAddrs::open().unwrap();
        let listed = ip_addr_list();
        assert!(!listed.is_empty());
        for a in &listed {
            assert!(
                h.contains(*a),
                "{a} is not a host address: {:?} {:?}",
                h.v4,
                h.v6
            );
        }
        assert!(h.contains(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(!h.contains("198.51.100.77".parse().unwrap()));
        let n = h.v4.len() + h.v6.len();
        assert_eq!(
            n,
            listed.iter().collect::<BTreeSet<_>>().len(),
            "{listed:?}"
        );
    }

    #[test]
    fn refresh_rereads_after_the_ttl_only() {
        let mut h = HostAddrs::open().unwrap();
        let fake: Ipv4Addr = "198.51.100.77".parse().unwrap();
        h.v4.insert(fake);
        let t = h.read_at.unwrap();
        h.refresh(t + REFRESH / 2);
        assert!(h.contains(IpAddr::V4(fake)), "re-read before the TTL");
        h.refresh(t + REFRESH);
        assert!(!h.contains(IpAddr::V4(fake)), "not re-read after the TTL");
        assert!(h.contains(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    }

    #[test]
    fn malformed_messages_are_errors_not_panics() {
        let (mut v4, mut v6) = (BTreeSet::new(), BTreeSet::new());
        for buf in [
            &[0xffu8, 0xff, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0][..],
            &[4, 0, 0, 0, 20, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0][..],
        ] {
            assert!(parse(buf, 1, &mut v4, &mut v6).is_err());
        }
        // An RTM_NEWADDR with a truncated attribute.
        let mut m = vec![0u8; 28];
        m[..4].copy_from_slice(&28u32.to_ne_bytes());
        m[4..6].copy_from_slice(&RTM_NEWADDR.to_ne_bytes());
        m[8..12].copy_from_slice(&1u32.to_ne_bytes());
        m[16] = libc::AF_INET as u8;
        m[24..26].copy_from_slice(&40u16.to_ne_bytes());
        assert!(parse(&m, 1, &mut v4, &mut v6).is_err());
        assert!(v4.is_empty() && v6.is_empty());
    }
}
