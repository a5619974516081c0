//! Guest frames: validation and classification (nothing is trusted), and the frames the NAT
//! builds itself (UDP and ICMP replies, TCP resets, ICMP errors).

use std::net::{Ipv4Addr, SocketAddrV4};

use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr,
    Icmpv4DstUnreachable, Icmpv4Message, Icmpv4Packet, Icmpv4Repr, IpAddress, IpProtocol,
    Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber, UdpPacket, UdpRepr,
};

use crate::{DNS_IP, GATEWAY_IP, GATEWAY_MAC, GUEST_IP, MTU};

const ETH_HEADER: usize = 14;
const IPV4_HEADER: usize = 20;
const HOP_LIMIT: u8 = 64;

/// Why a guest frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drop {
    /// Truncated or inconsistent headers.
    Malformed,
    /// Longer than `MTU + 14`.
    Oversized,
    /// Not addressed to the gateway's MAC (nor broadcast).
    WrongMac,
    /// Neither IPv4 nor ARP.
    NotIpv4,
    /// Source MAC or IP address other than the guest's.
    BadSource,
    /// An IP fragment (not supported).
    Fragment,
    /// Wrong IPv4, TCP, UDP or ICMP checksum.
    BadChecksum,
    /// Another IP protocol or ICMP message, or a non-unicast TCP destination.
    Unsupported,
    /// ARP not about the gateway or DNS address (probes, announcements).
    ArpIgnored,
}

/// A TCP segment from the guest (what the NAT needs to decide and to answer).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpInfo {
    pub dst: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    pub syn: bool,
    pub ack: bool,
    pub rst: bool,
    pub seq: u32,
    pub ack_number: u32,
    /// Payload length plus SYN and FIN.
    pub segment_len: usize,
}

impl TcpInfo {
    /// A SYN opening a connection (no ACK, no RST).
    pub fn is_open(&self) -> bool {
        self.syn && !self.ack && !self.rst
    }
}

/// A UDP datagram from the guest.
pub(crate) struct UdpInfo<'a> {
    pub dst: Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: &'a [u8],
    /// The whole IP packet (quoted in ICMP errors).
    pub ip: &'a [u8],
}

/// An ICMP echo request from the guest.
pub(crate) struct EchoInfo<'a> {
    pub dst: Ipv4Addr,
    pub ident: u16,
    /// The whole ICMP message (header and data).
    pub icmp: &'a [u8],
    /// The whole IP packet (quoted in ICMP errors).
    pub ip: &'a [u8],
}

/// What a valid guest frame is.
pub(crate) enum Parsed<'a> {
    /// ARP about the gateway or DNS address: smoltcp answers.
    Arp,
    Tcp(TcpInfo),
    Udp(UdpInfo<'a>),
    Echo(EchoInfo<'a>),
}

/// Validates and classifies one guest frame (sent from `guest_mac`).
pub(crate) fn parse(frame: &[u8], guest_mac: EthernetAddress) -> Result<Parsed<'_>, Drop> {
    if frame.len() > MTU + ETH_HEADER {
        return Err(Drop::Oversized);
    }
    let eth = EthernetFrame::new_checked(frame).map_err(|_| Drop::Malformed)?;
    let dst = eth.dst_addr();
    if dst != EthernetAddress(GATEWAY_MAC) && !dst.is_broadcast() {
        return Err(Drop::WrongMac);
    }
    if eth.src_addr() != guest_mac {
        return Err(Drop::BadSource);
    }
    let payload = &frame[ETH_HEADER..];
    match eth.ethertype() {
        EthernetProtocol::Arp => parse_arp(payload, guest_mac),
        EthernetProtocol::Ipv4 => parse_ipv4(payload),
        _ => Err(Drop::NotIpv4),
    }
}

fn parse_arp(payload: &[u8], guest_mac: EthernetAddress) -> Result<Parsed<'_>, Drop> {
    let packet = ArpPacket::new_checked(payload).map_err(|_| Drop::Malformed)?;
    let repr = ArpRepr::parse(&packet).map_err(|_| Drop::Malformed)?;
    match repr {
        ArpRepr::EthernetIpv4 {
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } => {
            if source_hardware_addr != guest_mac {
                return Err(Drop::BadSource);
            }
            if source_protocol_addr != GUEST_IP {
                return Err(Drop::ArpIgnored);
            }
            if target_protocol_addr != GATEWAY_IP && target_protocol_addr != DNS_IP {
                return Err(Drop::ArpIgnored);
            }
            Ok(Parsed::Arp)
        }
        _ => Err(Drop::Malformed),
    }
}

fn parse_ipv4(payload: &[u8]) -> Result<Parsed<'_>, Drop> {
    let packet = Ipv4Packet::new_checked(payload).map_err(|_| Drop::Malformed)?;
    if packet.version() != 4 {
        return Err(Drop::Malformed);
    }
    if !packet.verify_checksum() {
        return Err(Drop::BadChecksum);
    }
    if packet.more_frags() || packet.frag_offset() != 0 {
        return Err(Drop::Fragment);
    }
    let src = packet.src_addr();
    let dst = packet.dst_addr();
    if src != GUEST_IP {
        return Err(Drop::BadSource);
    }
    let total = usize::from(packet.total_len());
    let ip = payload.get(..total).ok_or(Drop::Malformed)?;
    let header = usize::from(packet.header_len());
    let body = ip.get(header..).ok_or(Drop::Malformed)?;
    let (src_ip, dst_ip) = (IpAddress::Ipv4(src), IpAddress::Ipv4(dst));
    match packet.next_header() {
        IpProtocol::Tcp => {
            let tcp = TcpPacket::new_checked(body).map_err(|_| Drop::Malformed)?;
            if !tcp.verify_checksum(&src_ip, &dst_ip) {
                return Err(Drop::BadChecksum);
            }
            if !dst.is_unicast_like() {
                return Err(Drop::Unsupported);
            }
            Ok(Parsed::Tcp(TcpInfo {
                dst,
                src_port: tcp.src_port(),
                dst_port: tcp.dst_port(),
                syn: tcp.syn(),
                ack: tcp.ack(),
                rst: tcp.rst(),
                seq: tcp.seq_number().0 as u32,
                ack_number: tcp.ack_number().0 as u32,
                segment_len: tcp.segment_len(),
            }))
        }
        IpProtocol::Udp => {
            let udp = UdpPacket::new_checked(body).map_err(|_| Drop::Malformed)?;
            if !udp.verify_checksum(&src_ip, &dst_ip) {
                return Err(Drop::BadChecksum);
            }
            let len = usize::from(udp.len());
            let payload = body.get(8..len).ok_or(Drop::Malformed)?;
            Ok(Parsed::Udp(UdpInfo {
                dst,
                src_port: udp.src_port(),
                dst_port: udp.dst_port(),
                payload,
                ip,
            }))
        }
        IpProtocol::Icmp => {
            let icmp = Icmpv4Packet::new_checked(body).map_err(|_| Drop::Malformed)?;
            if !icmp.verify_checksum() {
                return Err(Drop::BadChecksum);
            }
            if icmp.msg_type() != Icmpv4Message::EchoRequest || icmp.msg_code() != 0 {
                return Err(Drop::Unsupported);
            }
            Ok(Parsed::Echo(EchoInfo {
                dst,
                ident: icmp.echo_ident(),
                icmp: body,
                ip,
            }))
        }
        _ => Err(Drop::Unsupported),
    }
}

/// Unicast in the IPv4 sense: not broadcast, multicast or unspecified.
trait UnicastLike {
    fn is_unicast_like(&self) -> bool;
}

impl UnicastLike for Ipv4Addr {
    fn is_unicast_like(&self) -> bool {
        !(self.is_broadcast() || self.is_multicast() || self.is_unspecified())
    }
}

/// True when `dst` can be answered with an ICMP error (RFC 1122: not for broadcast or
/// multicast destinations).
pub(crate) fn answerable(dst: Ipv4Addr) -> bool {
    dst.is_unicast_like()
}

/// An IPv4 frame from `src` to the guest whose transport part `emit` writes.
fn ipv4_frame(
    guest_mac: EthernetAddress,
    src: Ipv4Addr,
    protocol: IpProtocol,
    transport_len: usize,
    emit: impl FnOnce(&mut [u8]),
) -> Vec<u8> {
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: GUEST_IP,
        next_header: protocol,
        payload_len: transport_len,
        hop_limit: HOP_LIMIT,
    };
    let mut frame = vec![0; ETH_HEADER + IPV4_HEADER + transport_len];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    EthernetRepr {
        src_addr: EthernetAddress(GATEWAY_MAC),
        dst_addr: guest_mac,
        ethertype: EthernetProtocol::Ipv4,
    }
    .emit(&mut eth);
    let mut packet = Ipv4Packet::new_unchecked(eth.payload_mut());
    ip.emit(&mut packet, &ChecksumCapabilities::default());
    emit(packet.payload_mut());
    frame
}

/// A UDP datagram from `src` to the guest's `dst_port` (payload at most [`crate::MAX_UDP_PAYLOAD`]).
pub(crate) fn udp_to_guest(
    guest_mac: EthernetAddress,
    src: SocketAddrV4,
    dst_port: u16,
    payload: &[u8],
) -> Vec<u8> {
    let repr = UdpRepr {
        src_port: src.port(),
        dst_port,
    };
    let len = repr.header_len() + payload.len();
    ipv4_frame(guest_mac, *src.ip(), IpProtocol::Udp, len, |buf| {
        repr.emit(
            &mut UdpPacket::new_unchecked(buf),
            &IpAddress::Ipv4(*src.ip()),
            &IpAddress::Ipv4(GUEST_IP),
            payload.len(),
            |p| p.copy_from_slice(payload),
            &ChecksumCapabilities::default(),
        );
    })
}

/// An ICMP message from `src` to the guest.
pub(crate) fn icmp_to_guest(
    guest_mac: EthernetAddress,
    src: Ipv4Addr,
    repr: &Icmpv4Repr<'_>,
) -> Vec<u8> {
    ipv4_frame(guest_mac, src, IpProtocol::Icmp, repr.buffer_len(), |buf| {
        repr.emit(
            &mut Icmpv4Packet::new_unchecked(buf),
            &ChecksumCapabilities::default(),
        );
    })
}

/// Most bytes of the offending datagram's payload quoted in an ICMP error (RFC 1812 4.3.2.3:
/// as much as fits in 576 bytes).
const ICMP_QUOTE: usize = 576 - 2 * IPV4_HEADER - 8;

/// An ICMP destination-unreachable from `src` quoting the guest's IP packet `ip` (its header
/// and at least the first 8 bytes of its payload). `None` when `ip` does not parse.
pub(crate) fn unreachable(
    guest_mac: EthernetAddress,
    src: Ipv4Addr,
    reason: Icmpv4DstUnreachable,
    ip: &[u8],
) -> Option<Vec<u8>> {
    let packet = Ipv4Packet::new_checked(ip).ok()?;
    let header = Ipv4Repr::parse(&packet, &ChecksumCapabilities::ignored()).ok()?;
    let body = packet.payload();
    let data = body.get(..body.len().min(ICMP_QUOTE))?;
    Some(icmp_to_guest(
        guest_mac,
        src,
        &Icmpv4Repr::DstUnreachable {
            reason,
            header,
            data,
        },
    ))
}

/// The reset answering the guest's segment `t` (RFC 9293 3.10.7.1).
pub(crate) fn tcp_rst(guest_mac: EthernetAddress, t: &TcpInfo) -> Vec<u8> {
    let (seq, ack) = if t.ack {
        (t.ack_number, None)
    } else {
        (
            0,
            Some(TcpSeqNumber(t.seq.wrapping_add(t.segment_len as u32) as i32)),
        )
    };
    let repr = TcpRepr {
        src_port: t.dst_port,
        dst_port: t.src_port,
        control: TcpControl::Rst,
        seq_number: TcpSeqNumber(seq as i32),
        ack_number: ack,
        window_len: 0,
        window_scale: None,
        max_seg_size: None,
        sack_permitted: false,
        sack_ranges: [None, None, None],
        timestamp: None,
        payload: &[],
    };
    ipv4_frame(
        guest_mac,
        t.dst,
        IpProtocol::Tcp,
        repr.buffer_len(),
        |buf| {
            repr.emit(
                &mut TcpPacket::new_unchecked(buf),
                &IpAddress::Ipv4(t.dst),
                &IpAddress::Ipv4(GUEST_IP),
                &ChecksumCapabilities::default(),
            );
        },
    )
}
