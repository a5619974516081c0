//! Services the guest reaches by name ([`crate::ServiceRoute`]): the DNS proxy answers their
//! names itself (A: the service's address, TTL [`TTL`]; any other type: no records, so
//! resolvers fall back to A), and a guest SYN to `ADDR:PORT` for a listed port is connected
//! to that port's target (a Unix socket, or a TCP address on another machine) ([`crate::tcp`] holds the SYN as for any host connect). Neither
//! the egress policy nor the flow caps apply; only [`crate::MAX_PENDING_CONNECTS`] does. A
//! SYN to a port the service does not list is denied
//! ([`crate::reasons::NOT_SERVICE_PORT`]); UDP and ICMP to a service address go through the
//! policy like any other flow.

use std::net::Ipv4Addr;

use hickory_proto::op::{Message, OpCode, Query};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use socket2::SockAddr;

use crate::policy::{normalize_name, reasons};
use crate::{Nat, NatError, PortTarget, ServiceRoute};

/// TTL of a service name's A record: short, so a later run's address is not cached long.
pub(crate) const TTL: u32 = 5;

/// One service, ready for lookups.
pub(crate) struct Service {
    /// Lower case, no trailing dot.
    name: String,
    addr: Ipv4Addr,
    /// Port and Unix socket address.
    ports: Vec<(u16, SockAddr)>,
}

/// The routes with normalized names and socket addresses (a path too long for a Unix socket
/// is a config error).
pub(crate) fn compile(routes: &[ServiceRoute]) -> Result<Vec<Service>, NatError> {
    routes
        .iter()
        .map(|r| {
            let ports = r
                .ports
                .iter()
                .map(|p| {
                    let addr = match &p.to {
                        PortTarget::Unix(path) => SockAddr::unix(path).map_err(|e| {
                            NatError::Config(format!(
                                "service {} port {}: socket path {}: {e}",
                                r.name,
                                p.port,
                                path.display()
                            ))
                        })?,
                        PortTarget::Tcp(a) => SockAddr::from(*a),
                    };
                    Ok((p.port, addr))
                })
                .collect::<Result<_, NatError>>()?;
            Ok(Service {
                name: normalize_name(&r.name),
                addr: r.addr,
                ports,
            })
        })
        .collect()
}

/// Where a guest SYN to a service address goes.
pub(crate) enum ServiceTarget<'a> {
    /// Not a service address.
    None,
    /// A listed port: connect this Unix socket.
    Socket(&'a SockAddr),
    /// A port the service does not list: denied for this reason.
    Denied(String),
}

/// The answer to `question` for a service at `addr`: its A record, or (any other type or
/// class) NOERROR without records.
fn reply(id: u16, question: &Query, rd: bool, addr: Ipv4Addr) -> Vec<u8> {
    let mut m = Message::response(id, OpCode::Query);
    m.metadata.recursion_desired = rd;
    m.metadata.recursion_available = true;
    m.metadata.authoritative = true;
    m.add_query(question.clone());
    if question.query_type() == RecordType::A && question.query_class() == DNSClass::IN {
        m.add_answer(Record::from_rdata(
            question.name().clone(),
            TTL,
            RData::A(A(addr)),
        ));
    }
    m.to_vec().unwrap_or_default()
}

impl Nat {
    /// The local answer for a question about a service name (`qname` normalized), if it is
    /// one.
    pub(crate) fn service_dns(
        &self,
        qname: &str,
        id: u16,
        question: &Query,
        rd: bool,
    ) -> Option<Vec<u8>> {
        let s = self.services.iter().find(|s| s.name == qname)?;
        Some(reply(id, question, rd, s.addr))
    }

    /// Where a guest SYN to `dst:port` goes if `dst` is a service address.
    pub(crate) fn service_target(&self, dst: Ipv4Addr, port: u16) -> ServiceTarget<'_> {
        let Some(s) = self.services.iter().find(|s| s.addr == dst) else {
            return ServiceTarget::None;
        };
        match s.ports.iter().find(|(p, _)| *p == port) {
            Some((_, addr)) => ServiceTarget::Socket(addr),
            None => ServiceTarget::Denied(format!("{} {}", reasons::NOT_SERVICE_PORT, s.name)),
        }
    }
}
