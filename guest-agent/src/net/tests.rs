//! `voidbox.net` parsing and the generated files as data; mount points on real files; and,
//! as root, a real interface (a tap device in a network namespace private to the test
//! thread) configured, re-applied and flushed by the same calls the guest makes, and the
//! `/etc` files bind-mounted over a system root in a private mount namespace.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use super::iface::{self, Socket};
use super::*;
use crate::cmdline::BootParams;
use crate::mount::{self, FileMountPoint};

const CONTRACT: &str = "10.0.2.15/24,10.0.2.2,10.0.2.3";

fn contract() -> NetConfig {
    NetConfig::parse(CONTRACT).unwrap()
}

#[test]
fn parses_the_engine_contract() {
    let c = contract();
    assert_eq!(
        c,
        NetConfig {
            address: Ipv4Addr::new(10, 0, 2, 15),
            prefix: 24,
            gateway: Ipv4Addr::new(10, 0, 2, 2),
            dns: Ipv4Addr::new(10, 0, 2, 3),
        }
    );
    assert_eq!(c.to_string(), CONTRACT);
    assert_eq!(c.netmask(), Ipv4Addr::new(255, 255, 255, 0));
    assert_eq!(c.network(), Ipv4Addr::new(10, 0, 2, 0));
    assert_eq!(c.broadcast(), Ipv4Addr::new(10, 0, 2, 255));
    for ok in [
        "192.168.1.10/16,192.168.0.1,1.1.1.1",
        "10.0.2.13/30,10.0.2.14,10.0.2.3",
        "10.1.2.3/8,10.255.255.254,10.0.0.1",
        "172.16.0.5/24,172.16.0.1,172.16.0.1",
        "100.64.0.2/1,1.0.0.1,9.9.9.9",
    ] {
        let c = NetConfig::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(c.to_string(), ok);
    }
    assert_eq!(
        NetConfig::parse("10.0.2.13/30,10.0.2.14,10.0.2.3")
            .unwrap()
            .netmask(),
        Ipv4Addr::new(255, 255, 255, 252)
    );
    assert_eq!(
        NetConfig::parse("100.64.0.2/1,1.0.0.1,9.9.9.9")
            .unwrap()
            .netmask(),
        Ipv4Addr::new(128, 0, 0, 0)
    );
}

#[test]
fn refuses_anything_else() {
    let long = format!("{CONTRACT}{}", ",".repeat(10_000));
    let cases: &[(&str, &str)] = &[
        ("", "expected ADDR/PREFIX,GATEWAY,DNS"),
        ("10.0.2.15/24", "expected"),
        ("10.0.2.15/24,10.0.2.2", "expected"),
        ("10.0.2.15/24,10.0.2.2,10.0.2.3,", "expected"),
        ("10.0.2.15/24,10.0.2.2,10.0.2.3,1.1.1.1", "expected"),
        ("10.0.2.15,10.0.2.2,10.0.2.3", "no /PREFIX"),
        (" 10.0.2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.15 /24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.15/24, 10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.15/24,10.0.2.2,10.0.2.3\n", "not a dotted-quad"),
        ("10.0.2.15/24,10.0.2.2,10.0.2.3\0", "not a dotted-quad"),
        ("010.0.2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.015/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.00/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("0x0a.0.2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("+10.0.2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.15.1/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10..2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.1500/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.256/24,10.0.2.2,10.0.2.3", "above 255"),
        ("１０.0.2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("::ffff:10.0.2.15/24,10.0.2.2,10.0.2.3", "not a dotted-quad"),
        ("10.0.2.15/0,10.0.2.2,10.0.2.3", "out of range"),
        ("10.0.2.15/31,10.0.2.14,10.0.2.3", "out of range"),
        ("10.0.2.15/32,10.0.2.2,10.0.2.3", "out of range"),
        ("10.0.2.15/33,10.0.2.2,10.0.2.3", "out of range"),
        ("10.0.2.15/255,10.0.2.2,10.0.2.3", "not a number of bits"),
        ("10.0.2.15/024,10.0.2.2,10.0.2.3", "not a number of bits"),
        ("10.0.2.15/+4,10.0.2.2,10.0.2.3", "not a number of bits"),
        ("10.0.2.15/,10.0.2.2,10.0.2.3", "not a number of bits"),
        ("10.0.2.15/24/24,10.0.2.2,10.0.2.3", "not a number of bits"),
        (
            "10.0.2.15/255.255.255.0,10.0.2.2,10.0.2.3",
            "not a number of bits",
        ),
        (
            "10.0.2.15/24,10.0.3.2,10.0.2.3",
            "not on the guest's subnet",
        ),
        (
            "10.0.2.15/24,10.0.2.15,10.0.2.3",
            "the gateway is the guest's own",
        ),
        ("10.0.2.15/24,10.0.2.0,10.0.2.3", "network or broadcast"),
        ("10.0.2.15/24,10.0.2.255,10.0.2.3", "network or broadcast"),
        ("10.0.2.0/24,10.0.2.2,10.0.2.3", "network or broadcast"),
        ("10.0.2.255/24,10.0.2.2,10.0.2.3", "network or broadcast"),
        ("10.0.2.15/24,10.0.2.2,10.0.2.15", "the guest's own address"),
        ("10.0.2.15/24,10.0.2.2,0.0.0.0", "unspecified"),
        ("10.0.2.15/24,10.0.2.2,127.0.0.53", "loopback"),
        ("10.0.2.15/24,10.0.2.2,224.0.0.251", "multicast"),
        ("10.0.2.15/24,10.0.2.2,255.255.255.255", "broadcast"),
        ("10.0.2.15/24,10.0.2.2,240.0.0.1", "reserved"),
        ("127.0.0.2/8,127.0.0.1,10.0.2.3", "loopback"),
        ("0.1.2.3/8,0.1.2.1,10.0.2.3", "0.0.0.0/8"),
        ("224.0.0.5/24,224.0.0.1,10.0.2.3", "multicast"),
        (&long, "longer than 64 bytes"),
    ];
    for (input, why) in cases {
        match NetConfig::parse(input) {
            Ok(c) => panic!("{input:?} was accepted as {c}"),
            Err(e) => assert!(e.contains(why), "{input:?}: {e:?} lacks {why:?}"),
        }
    }
}

#[test]
fn the_parameter_is_strict_on_the_command_line() {
    let p = BootParams::parse(format!("console=ttyS0 voidbox.net={CONTRACT} quiet"));
    assert_eq!(p.net, NetParam::Config(contract()));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(
        BootParams::parse("console=ttyS0".into()).net,
        NetParam::Absent
    );
    // Errors are the boot's to report (as errors), not parse warnings.
    let p = BootParams::parse("voidbox.net".into());
    let NetParam::Invalid(why) = &p.net else {
        panic!("{:?}", p.net);
    };
    assert!(
        why.contains("voidbox.net=``") && why.contains("expected"),
        "{why}"
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    // Twice is refused even when both values are valid and equal.
    let p = BootParams::parse(format!("voidbox.net={CONTRACT} voidbox.net={CONTRACT}"));
    assert_eq!(
        p.net,
        NetParam::Invalid("voidbox.net is given more than once".into())
    );
    // A quoted value with control characters is escaped in the message, and a long one is
    // cut.
    let p = BootParams::parse("\"voidbox.net=10.0.2.15/24,\t\u{1b}[2J\"".into());
    let NetParam::Invalid(why) = &p.net else {
        panic!("{:?}", p.net);
    };
    assert!(why.contains("\\t\\u{1b}[2J"), "{why}");
    assert!(!why.contains('\u{1b}'), "{why}");
    let mut param = NetParam::Absent;
    param.apply(&"9".repeat(5000));
    let NetParam::Invalid(why) = &param else {
        panic!("{param:?}");
    };
    assert!(why.len() < 200 && why.contains('…'), "{why}");
}

#[test]
fn generated_files() {
    let c = contract();
    assert_eq!(
        c.resolv_conf(),
        "# Written by the voidbox guest agent (voidbox.net).\nnameserver 10.0.2.3\n"
    );
    assert_eq!(
        c.hosts("box-1"),
        "# Written by the voidbox guest agent (voidbox.net).\n\
         127.0.0.1\tlocalhost\n10.0.2.15\tbox-1\n"
    );
    assert_eq!(
        c.hosts("localhost"),
        "# Written by the voidbox guest agent (voidbox.net).\n127.0.0.1\tlocalhost\n"
    );
    let l = Layout::guest();
    assert_eq!(files_dir(&l), Path::new("/run/voidbox/net"));
}

#[test]
fn states() {
    let up = NetState::Up {
        iface: "eth0".into(),
        config: contract(),
    };
    assert!(up.is_up() && up.failure().is_none());
    assert_eq!(up.capability(), Some(CAP_NET));
    let failed = NetState::Failed("the node's network failed at boot: x".into());
    assert_eq!(
        failed.failure(),
        Some("the node's network failed at boot: x")
    );
    assert_eq!(failed.capability(), None);
    assert_eq!(NetState::Off.capability(), None);
    // Nothing to re-apply, and a boot failure is not reported a second time by a re-key.
    assert!(reapply(&NetState::Off).is_ok());
    assert!(reapply(&failed).is_ok());
    // A broken boot turns the exec root into a failure that names both causes.
    let root = crate::rootfs::ExecRoot::System.also_broken("net: x");
    let crate::rootfs::ExecRoot::Broken(why) = &root else {
        panic!("{root:?}");
    };
    assert_eq!(&**why, "net: x");
    let crate::rootfs::ExecRoot::Broken(why) = root.also_broken("y") else {
        panic!();
    };
    assert_eq!(&*why, "net: x; y");
    // An invalid parameter fails the boot without touching any interface.
    let dir = tempfile::tempdir().unwrap();
    let l = layout(dir.path());
    let s = boot(&NetParam::Invalid("voidbox.net=`x`: bad".into()), "h", &l);
    assert_eq!(
        s.failure(),
        Some("the node's network failed at boot: voidbox.net=`x`: bad")
    );
    assert!(matches!(boot(&NetParam::Absent, "h", &l), NetState::Off));
    assert!(!files_dir(&l).exists());
}

#[test]
fn proc_listings() {
    let dev = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       0          0
  eth0:1234567     890    0    0    0     0          0         0      100       1    0    0    0     0       0          0
 tunl0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
";
    assert_eq!(iface::interfaces(dev), ["lo", "eth0", "tunl0"]);
    assert!(iface::interfaces("").is_empty());
    let live = std::fs::read_to_string(iface::PROC_NET_DEV).unwrap();
    assert!(iface::interfaces(&live).iter().any(|n| n == "lo"), "{live}");

    let arp = "IP address       HW type     Flags       HW address            Mask     Device
10.0.2.2         0x1         0x2         52:55:0a:00:02:02     *        eth0
10.0.2.3         0x1         0x0         00:00:00:00:00:00     *        eth0
192.0.2.1        0x1         0x2         02:fc:00:00:00:05     *        eth1
garbage
";
    assert_eq!(
        iface::neighbours(arp, "eth0"),
        [Ipv4Addr::new(10, 0, 2, 2), Ipv4Addr::new(10, 0, 2, 3)]
    );
    assert_eq!(
        iface::neighbours(arp, "eth1"),
        [Ipv4Addr::new(192, 0, 2, 1)]
    );
    assert!(iface::neighbours(arp, "eth").is_empty());
}

#[test]
fn interface_choice() {
    let c = |v: &[(&str, bool)]| -> Vec<(String, bool)> {
        v.iter().map(|(n, e)| (n.to_string(), *e)).collect()
    };
    assert_eq!(iface::choose(&c(&[])), Ok(None));
    assert_eq!(iface::choose(&c(&[("lo", true)])), Ok(None));
    assert_eq!(iface::choose(&c(&[("tunl0", false)])), Ok(None));
    assert_eq!(
        iface::choose(&c(&[("lo", false), ("tunl0", false), ("eth0", true)])),
        Ok(Some("eth0".into()))
    );
    assert_eq!(
        iface::choose(&c(&[("enp0s1", true)])),
        Ok(Some("enp0s1".into()))
    );
    let e = iface::choose(&c(&[("eth0", true), ("eth1", true)])).unwrap_err();
    assert!(e.contains("eth0, eth1"), "{e}");
}

#[test]
fn file_mount_points() {
    let dir = tempfile::tempdir().unwrap();
    let p = |s: &str| dir.path().join(s);
    std::fs::create_dir_all(p("etc/dir")).unwrap();
    std::fs::write(p("etc/file"), "kept\n").unwrap();
    std::fs::write(p("target"), "target\n").unwrap();
    std::os::unix::fs::symlink("../run/systemd/resolve/stub-resolv.conf", p("etc/dangling"))
        .unwrap();
    std::os::unix::fs::symlink(p("target"), p("etc/link")).unwrap();
    let choice = |s: &str| mount::file_mount_point_choice(&p(s)).unwrap();
    assert_eq!(choice("etc/file"), FileMountPoint::Use);
    assert_eq!(choice("etc/dangling"), FileMountPoint::ReplaceLink);
    assert_eq!(choice("etc/link"), FileMountPoint::ReplaceLink);
    assert_eq!(choice("etc/dir"), FileMountPoint::Refuse);
    assert_eq!(choice("new/etc/resolv.conf"), FileMountPoint::Create);
    assert_eq!(
        mount::file_mount_point_choice(Path::new("/dev/null")).unwrap(),
        FileMountPoint::Refuse
    );

    let is_empty_file = |s: &str| {
        let m = p(s).symlink_metadata().unwrap();
        m.is_file() && m.len() == 0
    };
    mount::file_mount_point(&p("etc/file")).unwrap();
    assert_eq!(std::fs::read_to_string(p("etc/file")).unwrap(), "kept\n");
    mount::file_mount_point(&p("etc/dangling")).unwrap();
    assert!(is_empty_file("etc/dangling"));
    assert!(!p("run").exists(), "the link's target must not be created");
    mount::file_mount_point(&p("etc/link")).unwrap();
    assert!(is_empty_file("etc/link"));
    assert_eq!(std::fs::read_to_string(p("target")).unwrap(), "target\n");
    mount::file_mount_point(&p("new/etc/resolv.conf")).unwrap();
    assert!(is_empty_file("new/etc/resolv.conf"));
    let e = mount::file_mount_point(&p("etc/dir")).unwrap_err();
    assert!(e.contains("not a file"), "{e}");
}

// ---- as root: a real interface and real mounts ---------------------------------------

fn layout(dir: &Path) -> Layout {
    Layout {
        devices: dir.join("dev"),
        run: dir.join("run"),
        system: dir.join("sys"),
        device_wait: Duration::from_millis(100),
    }
}

/// Whether a root-only test may run; panics when it cannot and skipping was not asked for.
fn root_or_skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var("VOIDBOX_SKIP_ROOT_TESTS").as_deref() == Ok("1"),
        "{what} needs root (set VOIDBOX_SKIP_ROOT_TESTS=1 to skip it)"
    );
    eprintln!("VOIDBOX_SKIP_ROOT_TESTS=1: {what} not checked");
    false
}

/// Moves the calling thread (and the threads it starts) into a new network namespace,
/// which has only a `lo` that is down, and is gone with its last thread.
fn private_netns() {
    // SAFETY: affects only the calling thread.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWNET): {}",
        std::io::Error::last_os_error()
    );
}

/// A tap device named `name` in the calling thread's network namespace (an Ethernet
/// interface, as virtio-net is); it is deleted when the fd is dropped.
fn tap(name: &str) -> OwnedFd {
    // SAFETY: plain open; the fd is owned below.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "/dev/net/tun: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = b as libc::c_char;
    }
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads the ifreq we pass; the fd is open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) };
    assert_eq!(rc, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
    fd
}

/// `ATF_COM` of `<net/if_arp.h>`: a completed entry (with a hardware address).
const ATF_COM: libc::c_int = 0x02;

/// Adds a completed neighbour entry (`SIOCSARP`), as traffic would.
fn add_neighbour(name: &str, ip: Ipv4Addr, mac: [u8; 6]) {
    // SAFETY: arpreq is plain data.
    let mut req: libc::arpreq = unsafe { std::mem::zeroed() };
    req.arp_pa = iface::sockaddr(ip);
    req.arp_ha.sa_family = libc::ARPHRD_ETHER;
    for (d, b) in req.arp_ha.sa_data.iter_mut().zip(mac) {
        *d = b as libc::c_char;
    }
    req.arp_flags = ATF_COM;
    for (d, b) in req.arp_dev.iter_mut().zip(name.bytes()) {
        *d = b as libc::c_char;
    }
    let s = Socket::new().unwrap();
    // SAFETY: a socket we own and an arpreq that SIOCSARP reads.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSARP, &mut req) };
    assert_eq!(rc, 0, "SIOCSARP: {}", std::io::Error::last_os_error());
}

/// Completed neighbour entries on `dev`, from `/proc/thread-self/net/arp`.
fn complete_neighbours(dev: &str) -> Vec<String> {
    std::fs::read_to_string(iface::PROC_NET_ARP)
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() == 6 && f[5] == dev && i64::from_str_radix(&f[2][2..], 16).unwrap() & 2 != 0
        })
        .map(str::to_string)
        .collect()
}

/// Default routes (`Destination` 0) as `(device, gateway)`, from the kernel's table.
fn default_routes() -> Vec<(String, Ipv4Addr)> {
    std::fs::read_to_string("/proc/thread-self/net/route")
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[1] == "00000000").then(|| {
                let gw = u32::from_str_radix(f[2], 16).unwrap();
                (f[0].to_string(), Ipv4Addr::from(u32::from_be(gw)))
            })
        })
        .collect()
}

#[test]
fn configures_reapplies_and_flushes_a_real_interface() {
    if !root_or_skip("the interface test") {
        return;
    }
    std::thread::spawn(|| {
        private_netns();
        let s = Socket::new().unwrap();
        // Loopback: down in a new namespace; up with 127.0.0.1/8 afterwards, twice over.
        assert_eq!(s.flags("lo").unwrap() & libc::IFF_UP, 0);
        iface::loopback_up().unwrap();
        iface::loopback_up().unwrap();
        assert_ne!(s.flags("lo").unwrap() & libc::IFF_UP, 0);
        assert_eq!(s.address("lo").unwrap(), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(s.netmask("lo").unwrap(), Ipv4Addr::new(255, 0, 0, 0));

        // Nothing but lo: the wait is bounded and says so.
        let t = Instant::now();
        let e = iface::find_interface(Duration::from_millis(50)).unwrap_err();
        assert!(
            e.contains("no Ethernet interface appeared within 50 ms"),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(2));

        // The interface appears while boot waits for it (a driver still probing).
        let (tx, rx) = std::sync::mpsc::channel();
        let maker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            tx.send(tap("eth0")).unwrap();
        });
        let t = Instant::now();
        assert_eq!(
            iface::find_interface(Duration::from_secs(5)).unwrap(),
            "eth0"
        );
        assert!(t.elapsed() >= Duration::from_millis(100));
        maker.join().unwrap();
        let eth0 = rx.recv().unwrap();

        let c = contract();
        for _ in 0..2 {
            iface::configure("eth0", &c).unwrap();
            assert_eq!(s.address("eth0").unwrap(), Some(c.address));
            assert_eq!(s.netmask("eth0").unwrap(), c.netmask());
            assert_ne!(s.flags("eth0").unwrap() & libc::IFF_UP, 0);
            assert_eq!(default_routes(), [("eth0".to_string(), c.gateway)]);
        }

        // A restored VM: neighbours learnt before the snapshot are flushed, the rest stays.
        add_neighbour("eth0", c.gateway, [0x52, 0x55, 10, 0, 2, 2]);
        add_neighbour("eth0", c.dns, [0x52, 0x55, 10, 0, 2, 3]);
        assert_eq!(complete_neighbours("eth0").len(), 2);
        let up = NetState::Up {
            iface: "eth0".into(),
            config: c,
        };
        reapply(&up).unwrap();
        assert_eq!(complete_neighbours("eth0"), Vec::<String>::new());
        assert_eq!(default_routes(), [("eth0".to_string(), c.gateway)]);

        // An interface found down (its routes gone with it) is brought back entirely.
        // SAFETY: ifreq is plain data.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, b) in ifr.ifr_name.iter_mut().zip(b"eth0") {
            *d = *b as libc::c_char;
        }
        // SAFETY: SIOCSIFFLAGS reads the ifreq; flags 0 takes the interface down.
        assert_eq!(
            unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr) },
            0
        );
        assert!(default_routes().is_empty());
        reapply(&up).unwrap();
        assert_ne!(s.flags("eth0").unwrap() & libc::IFF_UP, 0);
        assert_eq!(default_routes(), [("eth0".to_string(), c.gateway)]);

        // A second Ethernet interface makes the choice ambiguous: refused, not guessed.
        let eth1 = tap("eth1");
        let e = iface::find_interface(Duration::from_millis(10)).unwrap_err();
        assert!(e.contains("eth0, eth1"), "{e}");
        drop(eth1);

        // The interface is gone: the re-key is refused with the reason.
        drop(eth0);
        let (code, msg) = reapply(&up).unwrap_err();
        assert_eq!(code, voidbox_protocol::ErrorCode::Io);
        assert!(
            msg.contains("re-key refused") && msg.contains("eth0") && msg.contains("not rotated"),
            "{msg}"
        );
    })
    .join()
    .unwrap();
}

#[test]
fn files_are_bound_over_the_system_root() {
    if !root_or_skip("the /etc files test") {
        return;
    }
    std::thread::spawn(|| {
        // SAFETY: affects only this thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare");
        mount::make_private().unwrap();
        let dir = tempfile::tempdir().unwrap();
        mount::mount(Path::new("tmpfs"), dir.path(), "tmpfs", 0, "mode=0755").unwrap();
        let c = contract();

        // The system disk: both files exist (the mount points), the root is read-only.
        let l = layout(dir.path());
        let etc = l.system_path("/etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("hosts"), "127.0.0.1\tlocalhost voidbox\n").unwrap();
        std::fs::write(etc.join("resolv.conf"), "").unwrap();
        mount::mount(&l.system, &l.system, "", libc::MS_BIND, "").unwrap();
        let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
        mount::mount(Path::new("none"), &l.system, "", ro, "").unwrap();
        place_files(&l, &c, "box-1").unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&etc.join("resolv.conf")), c.resolv_conf());
        assert_eq!(read(&etc.join("hosts")), c.hosts("box-1"));
        assert_eq!(read(&files_dir(&l).join("hosts")), c.hosts("box-1"));

        // A read-only root without the mount point: a loud error that says what to do.
        let old = layout(&dir.path().join("old"));
        let etc = old.system_path("/etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("hosts"), "x\n").unwrap();
        mount::mount(&old.system, &old.system, "", libc::MS_BIND, "").unwrap();
        mount::mount(Path::new("none"), &old.system, "", ro, "").unwrap();
        let e = place_files(&old, &c, "voidbox").unwrap_err();
        assert!(
            e.contains("resolv.conf") && e.contains("Read-only") && e.contains("rebuild"),
            "{e}"
        );

        // A writable root (an overlay or an initramfs) with a dangling link: replaced.
        let rw = layout(&dir.path().join("rw"));
        let etc = rw.system_path("/etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::os::unix::fs::symlink(
            "../run/systemd/resolve/stub-resolv.conf",
            etc.join("resolv.conf"),
        )
        .unwrap();
        place_files(&rw, &c, "voidbox").unwrap();
        assert_eq!(read(&etc.join("resolv.conf")), c.resolv_conf());
        assert_eq!(read(&etc.join("hosts")), c.hosts("voidbox"));
        assert!(!rw.system_path("/run/systemd").exists());
    })
    .join()
    .unwrap();
}
