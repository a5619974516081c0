//! Shared test harness: raw frame builders and parsers (smoltcp::wire), and a second smoltcp
//! interface acting as the guest's TCP/IP stack, wired to a real `Nat`.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{ChecksumCapabilities, Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, HardwareAddress, Icmpv4Packet, Icmpv4Repr, IpAddress, IpCidr, IpProtocol,
    Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber, UdpPacket, UdpRepr,
};
use voidbox_net::{
    Nat, NatConfig, NetworkPolicy, DEFAULT_GUEST_MAC, GATEWAY_IP, GATEWAY_MAC, GUEST_IP, MTU,
};

pub const GUEST_MAC: EthernetAddress = EthernetAddress(DEFAULT_GUEST_MAC);

/// A NAT with `policy` and the given DNS upstream (default: the discard port, unused).
pub fn nat(policy: NetworkPolicy, upstream: Option<std::net::SocketAddr>) -> Nat {
    Nat::new(NatConfig {
        policy,
        dns_upstreams: vec![upstream.unwrap_or_else(|| "127.0.0.1:9".parse().unwrap())],
        guest_mac: DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    })
    .expect("nat")
}

// ---------------------------------------------------------------- frames from the guest

fn eth(ethertype: EthernetProtocol, dst: EthernetAddress, payload_len: usize) -> Vec<u8> {
    let mut frame = vec![0; 14 + payload_len];
    EthernetRepr {
        src_addr: GUEST_MAC,
        dst_addr: dst,
        ethertype,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut frame[..]));
    frame
}

pub fn arp_request(target: Ipv4Addr) -> Vec<u8> {
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: GUEST_MAC,
        source_protocol_addr: GUEST_IP,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    };
    let mut frame = eth(
        EthernetProtocol::Arp,
        EthernetAddress::BROADCAST,
        repr.buffer_len(),
    );
    repr.emit(&mut ArpPacket::new_unchecked(&mut frame[14..]));
    frame
}

/// An IPv4 frame from the guest to `dst` whose transport part `emit` writes.
pub fn ipv4(dst: Ipv4Addr, proto: IpProtocol, len: usize, emit: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let ip = Ipv4Repr {
        src_addr: GUEST_IP,
        dst_addr: dst,
        next_header: proto,
        payload_len: len,
        hop_limit: 64,
    };
    let mut frame = eth(
        EthernetProtocol::Ipv4,
        EthernetAddress(GATEWAY_MAC),
        20 + len,
    );
    let mut p = Ipv4Packet::new_unchecked(&mut frame[14..]);
    ip.emit(&mut p, &ChecksumCapabilities::default());
    emit(p.payload_mut());
    frame
}

pub fn tcp_syn(dst: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    tcp_segment(dst, sport, dport, TcpControl::Syn, 1000, None, &[])
}

pub fn tcp_segment(
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    control: TcpControl,
    seq: i32,
    ack: Option<i32>,
    payload: &[u8],
) -> Vec<u8> {
    let repr = TcpRepr {
        src_port: sport,
        dst_port: dport,
        control,
        seq_number: TcpSeqNumber(seq),
        ack_number: ack.map(TcpSeqNumber),
        window_len: 64000,
        window_scale: None,
        max_seg_size: if control == TcpControl::Syn {
            Some(1460)
        } else {
            None
        },
        sack_permitted: false,
        sack_ranges: [None; 3],
        timestamp: None,
        payload,
    };
    ipv4(dst, IpProtocol::Tcp, repr.buffer_len(), |buf| {
        repr.emit(
            &mut TcpPacket::new_unchecked(buf),
            &IpAddress::Ipv4(GUEST_IP),
            &IpAddress::Ipv4(dst),
            &ChecksumCapabilities::default(),
        )
    })
}

pub fn udp(dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let repr = UdpRepr {
        src_port: sport,
        dst_port: dport,
    };
    ipv4(dst, IpProtocol::Udp, 8 + payload.len(), |buf| {
        repr.emit(
            &mut UdpPacket::new_unchecked(buf),
            &IpAddress::Ipv4(GUEST_IP),
            &IpAddress::Ipv4(dst),
            payload.len(),
            |p| p.copy_from_slice(payload),
            &ChecksumCapabilities::default(),
        )
    })
}

pub fn icmp_echo(dst: Ipv4Addr, ident: u16, seq_no: u16, data: &[u8]) -> Vec<u8> {
    let repr = Icmpv4Repr::EchoRequest {
        ident,
        seq_no,
        data,
    };
    ipv4(dst, IpProtocol::Icmp, repr.buffer_len(), |buf| {
        repr.emit(
            &mut Icmpv4Packet::new_unchecked(buf),
            &ChecksumCapabilities::default(),
        )
    })
}

// ---------------------------------------------------------------- frames to the guest

/// A frame the NAT sent, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    ArpReply {
        sender_ip: Ipv4Addr,
        sender_mac: EthernetAddress,
    },
    ArpRequest {
        target: Ipv4Addr,
    },
    Tcp {
        src: Ipv4Addr,
        sport: u16,
        dport: u16,
        control: TcpControl,
        ack: Option<i32>,
        payload: Vec<u8>,
    },
    Udp {
        src: Ipv4Addr,
        sport: u16,
        dport: u16,
        payload: Vec<u8>,
    },
    EchoReply {
        src: Ipv4Addr,
        ident: u16,
        seq_no: u16,
        data: Vec<u8>,
    },
    /// ICMP destination unreachable with its code, and the quoted destination.
    Unreachable {
        src: Ipv4Addr,
        code: u8,
        quoted_dst: Ipv4Addr,
    },
    Other(Vec<u8>),
}

/// Decodes (and checks: to the guest's MAC, valid checksums) a frame from the NAT.
pub fn decode(frame: &[u8]) -> Out {
    assert!(frame.len() <= MTU + 14, "oversized frame to guest");
    let eth = EthernetFrame::new_checked(frame).expect("ethernet");
    assert_eq!(eth.src_addr(), EthernetAddress(GATEWAY_MAC));
    match eth.ethertype() {
        EthernetProtocol::Arp => {
            let p = ArpPacket::new_checked(eth.payload()).expect("arp");
            match ArpRepr::parse(&p).expect("arp repr") {
                ArpRepr::EthernetIpv4 {
                    operation: ArpOperation::Reply,
                    source_hardware_addr,
                    source_protocol_addr,
                    ..
                } => {
                    assert_eq!(eth.dst_addr(), GUEST_MAC);
                    Out::ArpReply {
                        sender_ip: source_protocol_addr,
                        sender_mac: source_hardware_addr,
                    }
                }
                ArpRepr::EthernetIpv4 {
                    operation: ArpOperation::Request,
                    target_protocol_addr,
                    ..
                } => Out::ArpRequest {
                    target: target_protocol_addr,
                },
                _ => Out::Other(frame.to_vec()),
            }
        }
        EthernetProtocol::Ipv4 => {
            assert_eq!(eth.dst_addr(), GUEST_MAC);
            let ip = Ipv4Packet::new_checked(eth.payload()).expect("ipv4");
            let repr =
                Ipv4Repr::parse(&ip, &ChecksumCapabilities::default()).expect("ipv4 checksum");
            assert_eq!(repr.dst_addr, GUEST_IP);
            let (src, dst) = (
                IpAddress::Ipv4(repr.src_addr),
                IpAddress::Ipv4(repr.dst_addr),
            );
            match repr.next_header {
                IpProtocol::Tcp => {
                    let t = TcpPacket::new_checked(ip.payload()).expect("tcp");
                    let r = TcpRepr::parse(&t, &src, &dst, &ChecksumCapabilities::default())
                        .expect("tcp checksum");
                    Out::Tcp {
                        src: repr.src_addr,
                        sport: r.src_port,
                        dport: r.dst_port,
                        control: r.control,
                        ack: r.ack_number.map(|a| a.0),
                        payload: r.payload.to_vec(),
                    }
                }
                IpProtocol::Udp => {
                    let u = UdpPacket::new_checked(ip.payload()).expect("udp");
                    assert!(u.verify_checksum(&src, &dst), "udp checksum");
                    Out::Udp {
                        src: repr.src_addr,
                        sport: u.src_port(),
                        dport: u.dst_port(),
                        payload: u.payload().to_vec(),
                    }
                }
                IpProtocol::Icmp => {
                    let i = Icmpv4Packet::new_checked(ip.payload()).expect("icmp");
                    assert!(i.verify_checksum(), "icmp checksum");
                    if i.msg_type() == smoltcp::wire::Icmpv4Message::DstUnreachable {
                        // Parsed by hand: the quote may be shorter than the datagram.
                        let quoted = Ipv4Packet::new_unchecked(i.data());
                        return Out::Unreachable {
                            src: repr.src_addr,
                            code: i.msg_code(),
                            quoted_dst: quoted.dst_addr(),
                        };
                    }
                    match Icmpv4Repr::parse(&i, &ChecksumCapabilities::default())
                        .expect("icmp checksum")
                    {
                        Icmpv4Repr::EchoReply {
                            ident,
                            seq_no,
                            data,
                        } => Out::EchoReply {
                            src: repr.src_addr,
                            ident,
                            seq_no,
                            data: data.to_vec(),
                        },
                        Icmpv4Repr::DstUnreachable { reason, header, .. } => Out::Unreachable {
                            src: repr.src_addr,
                            code: reason.into(),
                            quoted_dst: header.dst_addr,
                        },
                        _ => Out::Other(frame.to_vec()),
                    }
                }
                _ => Out::Other(frame.to_vec()),
            }
        }
        _ => Out::Other(frame.to_vec()),
    }
}

/// Pops and decodes everything queued for the guest.
pub fn drain(nat: &mut Nat) -> Vec<Out> {
    let now = Instant::now();
    std::iter::from_fn(|| nat.to_guest(now))
        .map(|f| decode(&f))
        .collect()
}

/// Polls the NAT until `pick` accepts a frame for the guest (other frames are skipped), or
/// panics after `timeout`.
pub fn wait_for<T>(nat: &mut Nat, timeout: Duration, mut pick: impl FnMut(&Out) -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let now = Instant::now();
        nat.poll(now);
        while let Some(f) = nat.to_guest(now) {
            if let Some(t) = pick(&decode(&f)) {
                return t;
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for a frame");
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------- a guest TCP/IP stack

/// Frames between the guest stack and the NAT (unbounded here: the NAT is what is tested).
#[derive(Default)]
pub struct Wire {
    pub rx: VecDeque<Vec<u8>>,
    pub tx: VecDeque<Vec<u8>>,
}

pub struct WireRx(Vec<u8>);
pub struct WireTx<'a>(&'a mut VecDeque<Vec<u8>>);

impl RxToken for WireRx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for WireTx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut buf = vec![0; len];
        let r = f(&mut buf);
        self.0.push_back(buf);
        r
    }
}

impl Device for Wire {
    type RxToken<'a> = WireRx;
    type TxToken<'a> = WireTx<'a>;
    fn receive(&mut self, _: smoltcp::time::Instant) -> Option<(WireRx, WireTx<'_>)> {
        let f = self.rx.pop_front()?;
        Some((WireRx(f), WireTx(&mut self.tx)))
    }
    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<WireTx<'_>> {
        Some(WireTx(&mut self.tx))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = MTU + 14;
        c
    }
}

/// The guest: a smoltcp interface at 10.0.2.15/24, default route via the gateway, plus the
/// NAT it talks to.
pub struct Harness {
    pub nat: Nat,
    pub iface: Interface,
    pub sockets: SocketSet<'static>,
    pub wire: Wire,
    /// TCP segments with RST the NAT sent to the guest.
    pub resets: u64,
    epoch: Instant,
    next_port: u16,
}

impl Harness {
    pub fn new(nat: Nat) -> Harness {
        let mut wire = Wire::default();
        let mut config = Config::new(HardwareAddress::Ethernet(GUEST_MAC));
        config.random_seed = 0x5eed;
        let mut iface = Interface::new(config, &mut wire, smoltcp::time::Instant::ZERO);
        iface.update_ip_addrs(|a| {
            a.push(IpCidr::new(IpAddress::Ipv4(GUEST_IP), 24)).unwrap();
        });
        iface
            .routes_mut()
            .add_default_ipv4_route(GATEWAY_IP)
            .unwrap();
        Harness {
            nat,
            iface,
            sockets: SocketSet::new(Vec::new()),
            wire,
            resets: 0,
            epoch: Instant::now(),
            next_port: 40000,
        }
    }

    fn snow(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    /// One exchange round; true if any frame moved.
    pub fn pump(&mut self) -> bool {
        let ts = self.snow();
        self.iface.poll(ts, &mut self.wire, &mut self.sockets);
        let now = Instant::now();
        let mut moved = false;
        while let Some(f) = self.wire.tx.pop_front() {
            self.nat.from_guest(&f, now);
            moved = true;
        }
        self.nat.poll(now);
        while let Some(f) = self.nat.to_guest(now) {
            if is_rst(&f) {
                self.resets += 1;
            }
            self.wire.rx.push_back(f);
            moved = true;
        }
        let ts = self.snow();
        self.iface.poll(ts, &mut self.wire, &mut self.sockets);
        moved
    }

    /// Pumps until `done` or panics after `timeout`.
    pub fn run_until(&mut self, timeout: Duration, mut done: impl FnMut(&mut Harness) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if done(self) {
                return;
            }
            assert!(Instant::now() < deadline, "timed out");
            if !self.pump() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Opens a guest TCP connection to `dst:port` (buffers of `buf` bytes).
    pub fn connect(&mut self, dst: Ipv4Addr, port: u16, buf: usize) -> SocketHandle {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buf]),
            tcp::SocketBuffer::new(vec![0; buf]),
        );
        self.next_port += 1;
        s.connect(
            self.iface.context(),
            (IpAddress::Ipv4(dst), port),
            self.next_port,
        )
        .unwrap();
        self.sockets.add(s)
    }

    pub fn tcp(&mut self, h: SocketHandle) -> &mut tcp::Socket<'static> {
        self.sockets.get_mut::<tcp::Socket>(h)
    }

    pub fn state(&self, h: SocketHandle) -> tcp::State {
        self.sockets.get::<tcp::Socket>(h).state()
    }
}

/// Whether `frame` is a TCP segment with RST.
fn is_rst(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    let Ok(ip) = smoltcp::wire::Ipv4Packet::new_checked(eth.payload()) else {
        return false;
    };
    ip.next_header() == IpProtocol::Tcp
        && smoltcp::wire::TcpPacket::new_checked(ip.payload()).is_ok_and(|t| t.rst())
}

/// Bytes `0..n` of a recognizable pattern.
pub fn pattern(n: usize, salt: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i * 7 + i / 251) as u8).wrapping_add(salt))
        .collect()
}

/// Sends a DNS query (message id `id`) for `name` from guest port `sport` over UDP and
/// returns the answer, checking its id was mapped back.
pub fn ask_dns(
    nat: &mut Nat,
    sport: u16,
    id: u16,
    name: &str,
    rtype: hickory_proto::rr::RecordType,
) -> hickory_proto::op::Message {
    let q = voidbox_net::testing::query_message(id, name, rtype).unwrap();
    nat.from_guest(&udp(voidbox_net::DNS_IP, sport, 53, &q), Instant::now());
    let payload = wait_for(nat, Duration::from_secs(10), |o| match o {
        Out::Udp {
            src,
            sport: 53,
            dport,
            payload,
        } if *src == voidbox_net::DNS_IP && *dport == sport => Some(payload.clone()),
        _ => None,
    });
    let m = hickory_proto::op::Message::from_vec(&payload).unwrap();
    assert_eq!(m.metadata.id, id, "reply id mapped back");
    m
}
