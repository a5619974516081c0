//! Guest networking, configured by the agent itself — no DHCP round trips.
//!
//! The engine gives a node with network a virtio-net device and the boot parameter
//! `voidbox.net=ADDR/PREFIX,GATEWAY,DNS` (today always `10.0.2.15/24,10.0.2.2,10.0.2.3`:
//! the VMM's user-mode NAT answers as the gateway and as the DNS server). Without the
//! parameter the VM has no network device and only `lo` is brought up.
//!
//! At boot ([`boot`]), before the disks are set up and long before the agent listens (so a
//! golden snapshot holds all of it):
//!
//! 1. the NAT's interface is found ([`iface::find_interface`]: the single non-loopback
//!    Ethernet interface, waited for at most [`IFACE_WAIT`] in case the driver is still
//!    probing) and given the address, netmask, `IFF_UP` and the default route;
//! 2. `/etc/resolv.conf` (`nameserver DNS`) and `/etc/hosts` (`localhost`, and the
//!    hostname at the guest's address, as Docker writes it) are generated in the tmpfs at
//!    [`files_dir`] and bind-mounted over the system root's files (which the system disk
//!    ships, as mount points, on its read-only erofs root). A node running in an OCI image
//!    gets the same two files bound over the image's (a symlink there, dangling or not, is
//!    replaced by a plain file first; see [`crate::disks::root_plan`]);
//! 3. `net.ipv4.ping_group_range` admits every group, as Docker does, so programs that use
//!    unprivileged ICMP sockets (`ping` of iputils in an image) can reach the NAT's ICMP
//!    echo. (Busybox's `ping` needs a raw socket and stays root-only.)
//!
//! Without `voidbox.net` nothing is generated: the system disk's `/etc/resolv.conf` stays
//! empty (the C libraries then try 127.0.0.1, where nothing listens, and fail at once) and
//! an image keeps its own `/etc/resolv.conf` (with no route out of the VM any server it
//! names is unreachable at once, never a hang).
//!
//! Failures are loud, like the disks': an invalid `voidbox.net` value, a missing interface
//! or a refused ioctl is logged on the console and every exec fails with the reason
//! ([`NetState::Failed`]) instead of running without the network the spec asked for.
//!
//! After a snapshot restore the engine sends `Rekey`; its system half calls [`reapply`]:
//! the same idempotent interface steps (nothing changes when the restored kernel still has
//! them), then a flush of the neighbour table so that no MAC address learnt before the
//! snapshot is used. A re-apply that cannot put the interface back into its configured
//! state refuses the re-key (the restored VM would otherwise run commands without the
//! network its spec has); a failed neighbour flush is only logged (stale entries expire by
//! themselves), and a node whose network already failed at boot does not fail the re-key
//! again (its execs already answer with the boot failure).

pub mod iface;

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use voidbox_protocol::ErrorCode;

use crate::disks::Layout;

/// How long boot waits for the NAT's interface to appear.
pub const IFACE_WAIT: Duration = Duration::from_secs(3);
/// `GuestInfo` capability of an agent whose network is configured.
pub const CAP_NET: &str = "net";
/// Longest accepted `voidbox.net` value (`255.255.255.255/30,…` is 49 bytes).
pub const MAX_PARAM: usize = 64;
/// What `net.ipv4.ping_group_range` is set to: every group (Docker's default).
const PING_GROUP_RANGE: &str = "0 2147483647";

/// The guest's addressing, from `voidbox.net=ADDR/PREFIX,GATEWAY,DNS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetConfig {
    /// The guest's address.
    pub address: Ipv4Addr,
    /// Prefix length of its subnet (1..=30).
    pub prefix: u8,
    /// The default gateway (on the subnet).
    pub gateway: Ipv4Addr,
    /// The DNS server written to `/etc/resolv.conf`.
    pub dns: Ipv4Addr,
}

impl NetConfig {
    /// Parses `ADDR/PREFIX,GATEWAY,DNS` strictly: dotted-quad addresses without leading
    /// zeros or spaces, a prefix of 1..=30, the address and gateway distinct host addresses
    /// of one subnet, and no loopback, multicast, broadcast, reserved or unspecified
    /// address anywhere (the DNS server may sit off the subnet, behind the gateway).
    pub fn parse(v: &str) -> Result<NetConfig, String> {
        if v.len() > MAX_PARAM {
            return Err(format!("longer than {MAX_PARAM} bytes"));
        }
        let fields: Vec<&str> = v.split(',').collect();
        let [cidr, gateway, dns] = fields[..] else {
            return Err("expected ADDR/PREFIX,GATEWAY,DNS".into());
        };
        let (address, prefix) = cidr
            .split_once('/')
            .ok_or("the address has no /PREFIX (expected ADDR/PREFIX,GATEWAY,DNS)")?;
        let c = NetConfig {
            address: parse_ipv4(address).map_err(|e| format!("address: {e}"))?,
            prefix: parse_prefix(prefix)?,
            gateway: parse_ipv4(gateway).map_err(|e| format!("gateway: {e}"))?,
            dns: parse_ipv4(dns).map_err(|e| format!("DNS server: {e}"))?,
        };
        for (what, ip) in [
            ("address", c.address),
            ("gateway", c.gateway),
            ("DNS server", c.dns),
        ] {
            if let Some(why) = unusable(ip) {
                return Err(format!("{what} {ip} is {why}"));
            }
        }
        let (net, bcast) = (c.network(), c.broadcast());
        if c.network_of(c.gateway) != net {
            return Err(format!(
                "gateway {} is not on the guest's subnet {net}/{}",
                c.gateway, c.prefix
            ));
        }
        for (what, ip) in [("address", c.address), ("gateway", c.gateway)] {
            if ip == net || ip == bcast {
                return Err(format!(
                    "{what} {ip} is the network or broadcast address of {net}/{}",
                    c.prefix
                ));
            }
        }
        if c.gateway == c.address {
            return Err(format!(
                "the gateway is the guest's own address {}",
                c.address
            ));
        }
        if c.dns == c.address {
            return Err(format!(
                "the DNS server is the guest's own address {} (no resolver runs in the guest)",
                c.address
            ));
        }
        Ok(c)
    }

    /// The subnet mask.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(mask_bits(self.prefix))
    }

    fn network_of(&self, ip: Ipv4Addr) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(ip) & mask_bits(self.prefix))
    }

    /// The subnet's network address.
    pub fn network(&self) -> Ipv4Addr {
        self.network_of(self.address)
    }

    /// The subnet's broadcast address.
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.address) | !mask_bits(self.prefix))
    }

    /// `/etc/resolv.conf`: the DNS server only (no search domains, default options).
    pub fn resolv_conf(&self) -> String {
        format!(
            "# Written by the voidbox guest agent (voidbox.net).\nnameserver {}\n",
            self.dns
        )
    }

    /// `/etc/hosts`: `localhost`, and `hostname` at the guest's address (as Docker writes
    /// it). No IPv6 lines: the guest kernel has no IPv6.
    pub fn hosts(&self, hostname: &str) -> String {
        let mut s = String::from("# Written by the voidbox guest agent (voidbox.net).\n");
        s.push_str("127.0.0.1\tlocalhost\n");
        if hostname != "localhost" {
            s.push_str(&format!("{}\t{hostname}\n", self.address));
        }
        s
    }
}

impl fmt::Display for NetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{},{},{}",
            self.address, self.prefix, self.gateway, self.dns
        )
    }
}

fn mask_bits(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// Why `ip` cannot be an address of this network, if it cannot.
fn unusable(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip.is_broadcast() {
        Some("the broadcast address")
    } else if ip.octets()[0] >= 240 {
        Some("a reserved (class E) address")
    } else if ip.octets()[0] == 0 {
        Some("in 0.0.0.0/8 (\"this network\")")
    } else {
        None
    }
}

/// A dotted quad of decimal octets: 1 to 3 digits each, no leading zeros (`010` could be
/// read as octal elsewhere), no signs or spaces.
fn parse_ipv4(s: &str) -> Result<Ipv4Addr, String> {
    let parts: Vec<&str> = s.split('.').collect();
    let [a, b, c, d] = parts[..] else {
        return Err(format!("`{s}` is not a dotted-quad IPv4 address"));
    };
    let octet = |p: &str| -> Result<u8, String> {
        let digits = !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit());
        if !digits || (p.len() > 1 && p.starts_with('0')) {
            return Err(format!("`{s}` is not a dotted-quad IPv4 address"));
        }
        p.parse()
            .map_err(|_| format!("`{s}`: octet {p} is above 255"))
    };
    Ok(Ipv4Addr::new(octet(a)?, octet(b)?, octet(c)?, octet(d)?))
}

fn parse_prefix(p: &str) -> Result<u8, String> {
    let digits = !p.is_empty() && p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit());
    if !digits || (p.len() > 1 && p.starts_with('0')) {
        return Err(format!("prefix `{p}` is not a number of bits"));
    }
    match p.parse::<u8>() {
        Ok(n @ 1..=30) => Ok(n),
        _ => Err(format!(
            "prefix /{p} is out of range (1..=30: the gateway must be another host on the subnet)"
        )),
    }
}

/// `voidbox.net` as found on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NetParam {
    /// Not given: no network device, only `lo`.
    #[default]
    Absent,
    /// A valid configuration.
    Config(NetConfig),
    /// An invalid value, or the parameter given twice: every exec fails with this.
    Invalid(String),
}

impl NetParam {
    /// Takes one `voidbox.net=value`. A second occurrence makes the parameter invalid
    /// (which of two differing values the engine meant cannot be told).
    pub fn apply(&mut self, value: &str) {
        *self = match self {
            NetParam::Absent => match NetConfig::parse(value) {
                Ok(c) => NetParam::Config(c),
                Err(e) => NetParam::Invalid(format!("voidbox.net=`{}`: {e}", printable(value))),
            },
            NetParam::Config(_) | NetParam::Invalid(_) => {
                NetParam::Invalid("voidbox.net is given more than once".into())
            }
        };
    }
}

/// `s` with control characters escaped and cut to [`MAX_PARAM`] characters, for messages.
fn printable(s: &str) -> String {
    let cut: String = s.chars().take(MAX_PARAM).collect();
    let mut out = cut.escape_debug().to_string();
    if s.chars().count() > MAX_PARAM {
        out.push('…');
    }
    out
}

/// What boot made of the network.
#[derive(Debug, Clone, Default)]
pub enum NetState {
    /// No `voidbox.net` (or a host process): only `lo`.
    #[default]
    Off,
    /// Configured: interface `iface` carries `config`.
    Up {
        /// The interface (`eth0`).
        iface: String,
        /// Its configuration.
        config: NetConfig,
    },
    /// The network the boot parameters ask for could not be set up: every exec fails with
    /// this message.
    Failed(Arc<str>),
}

impl NetState {
    /// Whether the interface and the `/etc` files are in place.
    pub fn is_up(&self) -> bool {
        matches!(self, NetState::Up { .. })
    }

    /// The message every exec fails with, if boot failed.
    pub fn failure(&self) -> Option<&str> {
        match self {
            NetState::Failed(why) => Some(why),
            _ => None,
        }
    }

    /// The `GuestInfo` capability announcing a configured network ([`CAP_NET`]).
    pub fn capability(&self) -> Option<&'static str> {
        self.is_up().then_some(CAP_NET)
    }
}

/// Where the generated `/etc/resolv.conf` and `/etc/hosts` live (`/run/voidbox/net`, a
/// tmpfs).
pub fn files_dir(layout: &Layout) -> PathBuf {
    layout.run.join("net")
}

/// The guest paths of the generated files and their names in [`files_dir`].
pub const FILES: [(&str, &str); 2] = [("/etc/resolv.conf", "resolv.conf"), ("/etc/hosts", "hosts")];

/// Boot-time entry point (PID 1, after `/proc`, `/run` and `lo`): sets up what `param`
/// asks for and reports it on the console. `hostname` goes into `/etc/hosts`.
pub fn boot(param: &NetParam, hostname: &str, layout: &Layout) -> NetState {
    let failed = |why: String| {
        crate::log!("error: network: {why}; every command will fail");
        NetState::Failed(format!("the node's network failed at boot: {why}").into())
    };
    let config = match param {
        NetParam::Absent => return NetState::Off,
        NetParam::Invalid(why) => return failed(why.clone()),
        NetParam::Config(c) => *c,
    };
    let started = Instant::now();
    let iface = match iface::find_interface(IFACE_WAIT)
        .and_then(|name| iface::configure(&name, &config).map(|()| name))
    {
        Ok(name) => name,
        Err(e) => return failed(e),
    };
    if let Err(e) = place_files(layout, &config, hostname) {
        return failed(e);
    }
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ping_group_range", PING_GROUP_RANGE) {
        crate::log!("warning: network: net.ipv4.ping_group_range: {e}");
    }
    crate::init::boot_mark("network configured");
    crate::log!(
        "network: {iface} {}/{} via {}, dns {} ({} ms)",
        config.address,
        config.prefix,
        config.gateway,
        config.dns,
        started.elapsed().as_millis()
    );
    NetState::Up { iface, config }
}

/// Writes `/etc/resolv.conf` and `/etc/hosts` for `config` into [`files_dir`] and
/// bind-mounts them over the system root's files (mount points are prepared by
/// [`crate::mount::file_mount_point`]; on a read-only root they must exist).
pub fn place_files(layout: &Layout, config: &NetConfig, hostname: &str) -> Result<(), String> {
    let dir = files_dir(layout);
    crate::mount::mkdir_p(&dir)?;
    for (guest, name) in FILES {
        let text = match name {
            "hosts" => config.hosts(hostname),
            _ => config.resolv_conf(),
        };
        let source = dir.join(name);
        write_file(&source, &text)?;
        let target = layout.system_path(guest);
        crate::mount::file_mount_point(&target).map_err(|e| {
            format!("{e} (a read-only system disk must ship {guest}: rebuild it with this agent)")
        })?;
        crate::mount::mount(&source, &target, "", libc::MS_BIND, "")?;
    }
    Ok(())
}

/// Writes `text` to a new file `path` (mode 0644, replacing an old one).
fn write_file(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The network half of a `Rekey` after a snapshot restore: puts the interface back into
/// its configured state (no-ops when it still is) and flushes the neighbour table. Only a
/// configuration that cannot be re-applied refuses the re-key (see the module
/// documentation).
pub fn reapply(state: &NetState) -> Result<(), (ErrorCode, String)> {
    let NetState::Up { iface, config } = state else {
        return Ok(());
    };
    iface::configure(iface, config).map_err(|e| {
        (
            ErrorCode::Io,
            format!(
                "re-key refused: re-applying the network configuration ({iface} {}/{} via {}) \
                 failed: {e}; the session secret was not rotated",
                config.address, config.prefix, config.gateway
            ),
        )
    })?;
    match iface::flush_neighbours(iface) {
        Ok(n) => crate::debug!("network re-applied on {iface}; {n} neighbour entries flushed"),
        Err(e) => crate::log!("warning: network: flushing the neighbours of {iface}: {e}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
