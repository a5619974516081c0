//! The interface half of [`crate::net`]: finding the NAT's interface and configuring it with
//! the classic `SIOC*` ioctls on an `AF_INET` datagram socket (no netlink, no extra crates).
//!
//! Every step is idempotent, so the same calls serve boot and the re-apply after a snapshot
//! restore: setting the address an interface already has changes nothing, `IFF_UP` is only
//! set when missing, and an identical default route (`EEXIST`) counts as added.
//!
//! The kernel's tables are read from `/proc/thread-self/net/…`, which show the network
//! namespace of the calling thread (the whole guest has one; host tests use a private one
//! per test thread).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use super::NetConfig;

/// The kernel's list of interfaces and their counters.
pub const PROC_NET_DEV: &str = "/proc/thread-self/net/dev";
/// The kernel's IPv4 neighbour (ARP) table.
pub const PROC_NET_ARP: &str = "/proc/thread-self/net/arp";
/// The loopback interface.
pub const LOOPBACK: &str = "lo";

/// Longest interface name (`IFNAMSIZ` less the NUL).
const MAX_NAME: usize = libc::IFNAMSIZ - 1;

/// The kernel's `struct rtentry` (`<linux/route.h>`), which glibc's headers have but the
/// `libc` crate does not define for glibc targets.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// An `AF_INET` datagram socket: the handle the interface ioctls go through.
pub struct Socket(OwnedFd);

impl Socket {
    /// Opens the socket (in the calling thread's network namespace).
    pub fn new() -> io::Result<Socket> {
        // SAFETY: plain socket creation; the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd owned by nothing else.
        Ok(Socket(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `ioctl(request, ifr)`.
    fn ioctl<T>(&self, request: libc::c_ulong, arg: &mut T) -> io::Result<()> {
        // SAFETY: every request used here reads and/or writes one `T` (an `ifreq`,
        // `rtentry` or `arpreq`, as the request defines), which `arg` points to; the fd is
        // our open socket.
        if unsafe { libc::ioctl(self.0.as_raw_fd(), request, arg as *mut T) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The interface's IPv4 address, `None` when it has none.
    pub fn address(&self, name: &str) -> io::Result<Option<Ipv4Addr>> {
        let mut ifr = ifreq(name)?;
        match self.ioctl(libc::SIOCGIFADDR, &mut ifr) {
            // SAFETY: SIOCGIFADDR filled the union's address member.
            Ok(()) => Ok(Some(from_sockaddr(unsafe { &ifr.ifr_ifru.ifru_addr }))),
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The interface's netmask.
    pub fn netmask(&self, name: &str) -> io::Result<Ipv4Addr> {
        let mut ifr = ifreq(name)?;
        self.ioctl(libc::SIOCGIFNETMASK, &mut ifr)?;
        // SAFETY: SIOCGIFNETMASK filled the union's netmask member.
        Ok(from_sockaddr(unsafe { &ifr.ifr_ifru.ifru_netmask }))
    }

    /// Sets the interface's address (`SIOCSIFADDR`; the same address again is a no-op in
    /// the kernel). A new address gets its classful mask: set the netmask after it.
    pub fn set_address(&self, name: &str, ip: Ipv4Addr) -> io::Result<()> {
        let mut ifr = ifreq(name)?;
        ifr.ifr_ifru.ifru_addr = sockaddr(ip);
        self.ioctl(libc::SIOCSIFADDR, &mut ifr)
    }

    /// Sets the interface's netmask (`SIOCSIFNETMASK`; needs an address).
    pub fn set_netmask(&self, name: &str, mask: Ipv4Addr) -> io::Result<()> {
        let mut ifr = ifreq(name)?;
        ifr.ifr_ifru.ifru_netmask = sockaddr(mask);
        self.ioctl(libc::SIOCSIFNETMASK, &mut ifr)
    }

    /// The interface's flags (`IFF_*`).
    pub fn flags(&self, name: &str) -> io::Result<libc::c_int> {
        let mut ifr = ifreq(name)?;
        self.ioctl(libc::SIOCGIFFLAGS, &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS filled the union's flags member.
        Ok(libc::c_int::from(unsafe { ifr.ifr_ifru.ifru_flags }) & 0xffff)
    }

    /// Sets `IFF_UP` unless it is set already; returns whether it changed anything.
    pub fn up(&self, name: &str) -> io::Result<bool> {
        let mut ifr = ifreq(name)?;
        self.ioctl(libc::SIOCGIFFLAGS, &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS filled the union's flags member.
        let flags = unsafe { ifr.ifr_ifru.ifru_flags };
        if flags & libc::IFF_UP as libc::c_short != 0 {
            return Ok(false);
        }
        ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        self.ioctl(libc::SIOCSIFFLAGS, &mut ifr)?;
        Ok(true)
    }

    /// Whether the interface is an Ethernet device (`SIOCGIFHWADDR`), as virtio-net is.
    pub fn is_ethernet(&self, name: &str) -> io::Result<bool> {
        let mut ifr = ifreq(name)?;
        self.ioctl(libc::SIOCGIFHWADDR, &mut ifr)?;
        // SAFETY: SIOCGIFHWADDR filled the union's hardware-address member.
        Ok(unsafe { ifr.ifr_ifru.ifru_hwaddr.sa_family } == libc::ARPHRD_ETHER)
    }

    /// Adds the default route via `gateway` on `name` (`SIOCADDRT`); the same route being
    /// there already (`EEXIST`) is success. The gateway must be on the interface's subnet
    /// and the interface up (its subnet route exists then).
    pub fn add_default_route(&self, name: &str, gateway: Ipv4Addr) -> io::Result<()> {
        let mut dev = ifname(name)?;
        let mut rt = RtEntry {
            rt_pad1: 0,
            rt_dst: sockaddr(Ipv4Addr::UNSPECIFIED),
            rt_gateway: sockaddr(gateway),
            rt_genmask: sockaddr(Ipv4Addr::UNSPECIFIED),
            rt_flags: libc::RTF_UP | libc::RTF_GATEWAY,
            rt_pad2: 0,
            rt_pad3: 0,
            rt_pad4: std::ptr::null_mut(),
            rt_metric: 0,
            rt_dev: dev.as_mut_ptr(),
            rt_mtu: 0,
            rt_window: 0,
            rt_irtt: 0,
        };
        // `rt_dev` points into `dev`, which outlives the call.
        match self.ioctl(libc::SIOCADDRT, &mut rt) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            r => r,
        }
    }

    /// Deletes the neighbour (ARP) entry of `ip` on `name` (`SIOCDARP`); a missing entry
    /// (`ENXIO`) is success.
    pub fn delete_neighbour(&self, name: &str, ip: Ipv4Addr) -> io::Result<()> {
        // SAFETY: arpreq is plain data; all-zero is valid.
        let mut req: libc::arpreq = unsafe { std::mem::zeroed() };
        req.arp_pa = sockaddr(ip);
        req.arp_dev = ifname(name)?;
        match self.ioctl(libc::SIOCDARP, &mut req) {
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(()),
            r => r,
        }
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

/// `name` as a NUL-padded `ifr_name`; longer than `IFNAMSIZ - 1` bytes or with a NUL is
/// `EINVAL`.
fn ifname(name: &str) -> io::Result<[libc::c_char; libc::IFNAMSIZ]> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains('\0') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut out = [0 as libc::c_char; libc::IFNAMSIZ];
    for (d, b) in out.iter_mut().zip(name.bytes()) {
        *d = b as libc::c_char;
    }
    Ok(out)
}

/// An `ifreq` naming `name`, the rest zeroed.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_name = ifname(name)?;
    Ok(ifr)
}

/// An `AF_INET` `sockaddr` holding `ip` (port 0).
pub fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes of plain data; this is how the
    // kernel's ioctls expect an IPv4 address in a `struct sockaddr`.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// The IPv4 address in an `AF_INET` `sockaddr`.
pub fn from_sockaddr(sa: &libc::sockaddr) -> Ipv4Addr {
    // SAFETY: as in `sockaddr`: same size, plain data.
    let sin = unsafe { std::mem::transmute::<libc::sockaddr, libc::sockaddr_in>(*sa) };
    Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
}

/// Names a failed step, keeping the error's kind.
fn step(what: &str, name: &str, e: io::Error) -> String {
    format!("{what} on {name}: {e}")
}

/// Puts `config` on interface `name`: address, netmask, `IFF_UP`, default route — each
/// step a no-op when already done. The error names the step that failed.
pub fn configure(name: &str, config: &NetConfig) -> Result<(), String> {
    let s = Socket::new().map_err(|e| format!("opening an AF_INET socket: {e}"))?;
    s.set_address(name, config.address)
        .map_err(|e| step(&format!("setting address {}", config.address), name, e))?;
    s.set_netmask(name, config.netmask())
        .map_err(|e| step(&format!("setting netmask {}", config.netmask()), name, e))?;
    s.up(name).map_err(|e| step("bringing up", name, e))?;
    s.add_default_route(name, config.gateway).map_err(|e| {
        step(
            &format!("adding the default route via {}", config.gateway),
            name,
            e,
        )
    })?;
    Ok(())
}

/// Deletes every neighbour entry of interface `name`, so that nothing learnt before a
/// snapshot is used after the restore; returns how many were deleted.
pub fn flush_neighbours(name: &str) -> Result<usize, String> {
    let table = std::fs::read_to_string(PROC_NET_ARP)
        .map_err(|e| format!("reading {PROC_NET_ARP}: {e}"))?;
    let s = Socket::new().map_err(|e| format!("opening an AF_INET socket: {e}"))?;
    let entries = neighbours(&table, name);
    for ip in &entries {
        s.delete_neighbour(name, *ip)
            .map_err(|e| step(&format!("deleting the neighbour {ip}"), name, e))?;
    }
    Ok(entries.len())
}

/// Brings `lo` up and makes sure it has 127.0.0.1/8 (the kernel assigns it when `lo` goes
/// up; this only adds it where that did not happen).
pub fn loopback_up() -> io::Result<()> {
    let s = Socket::new()?;
    s.up(LOOPBACK)?;
    if s.address(LOOPBACK)?.is_none() {
        s.set_address(LOOPBACK, Ipv4Addr::LOCALHOST)?;
        s.set_netmask(LOOPBACK, Ipv4Addr::new(255, 0, 0, 0))?;
    }
    Ok(())
}

/// The interface names in a `/proc/net/dev` listing, in its order.
pub fn interfaces(proc_net_dev: &str) -> Vec<String> {
    proc_net_dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The addresses with an entry on interface `dev` in a `/proc/net/arp` listing.
pub fn neighbours(proc_net_arp: &str, dev: &str) -> Vec<Ipv4Addr> {
    proc_net_arp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                [ip, _, _, _, _, d] if d == dev => ip.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

/// Picks the NAT's interface among `(name, is_ethernet)` candidates: the single Ethernet
/// interface that is not loopback. `Ok(None)`: none yet (the driver may still be probing).
pub fn choose(candidates: &[(String, bool)]) -> Result<Option<String>, String> {
    let ether: Vec<&str> = candidates
        .iter()
        .filter(|(n, e)| *e && n != LOOPBACK)
        .map(|(n, _)| n.as_str())
        .collect();
    match ether[..] {
        [] => Ok(None),
        [one] => Ok(Some(one.to_string())),
        _ => Err(format!(
            "more than one network interface ({}): cannot tell which one is the NAT's",
            ether.join(", ")
        )),
    }
}

/// Waits (polling every 10 ms, at most `limit`) for the NAT's interface ([`choose`]) and
/// returns its name.
pub fn find_interface(limit: Duration) -> Result<String, String> {
    let s = Socket::new().map_err(|e| format!("opening an AF_INET socket: {e}"))?;
    let start = Instant::now();
    loop {
        let list = std::fs::read_to_string(PROC_NET_DEV)
            .map_err(|e| format!("reading {PROC_NET_DEV}: {e}"))?;
        let candidates: Vec<(String, bool)> = interfaces(&list)
            .into_iter()
            .filter(|n| n != LOOPBACK)
            .map(|n| {
                // An interface that vanished in between, or a name the ioctl refuses, is
                // simply not a candidate.
                let ether = s.is_ethernet(&n).unwrap_or(false);
                (n, ether)
            })
            .collect();
        if let Some(name) = choose(&candidates)? {
            return Ok(name);
        }
        if start.elapsed() >= limit {
            let seen: Vec<&str> = candidates.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "no Ethernet interface appeared within {} ms (virtio-net missing from the VM?); \
                 interfaces besides lo: [{}]",
                limit.as_millis(),
                seen.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn rtentry_matches_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<RtEntry>(), 120);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_dst), 8);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_flags), 56);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_metric), 80);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_dev), 88);
        assert_eq!(std::mem::offset_of!(RtEntry, rt_irtt), 112);
    }

    #[test]
    fn sockaddr_round_trip_and_byte_order() {
        let ip = Ipv4Addr::new(10, 0, 2, 15);
        let sa = sockaddr(ip);
        assert_eq!(sa.sa_family, libc::AF_INET as libc::sa_family_t);
        // Port 0, then the address in network byte order.
        let data: Vec<u8> = sa.sa_data[..6].iter().map(|&b| b as u8).collect();
        assert_eq!(data, [0, 0, 10, 0, 2, 15]);
        assert_eq!(from_sockaddr(&sa), ip);
    }

    #[test]
    fn interface_names() {
        assert!(ifname("eth0").is_ok());
        assert!(ifname(&"x".repeat(15)).is_ok());
        for bad in ["", "0123456789abcdef", "a\0b"] {
            let e = ifname(bad).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{bad:?}");
        }
    }
}
