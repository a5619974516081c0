//! How a run's service sidecars are reached. A service with `ports` and dependents gets an
//! address (`10.0.3.N`) and, per port, a Unix socket in the run's private directory: its
//! VM's NAT listens there and relays to the guest port. Each of its dependents' NATs
//! resolves the service's name to that address and connects `ADDR:PORT` to the socket,
//! whatever the dependent's own egress policy says. Nodes that do not depend on the service
//! have no route: its name does not resolve for them and its address is refused.

use std::collections::HashMap;
use std::path::Path;

use petgraph::Direction;
use voidbox_net::{PortTarget, PublishUnix, ServicePort, ServiceRoute};

use crate::plan::Plan;

/// Longest Unix socket path (`sun_path` holds 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Per node: what its NAT listens on (a service) and the services it reaches (a dependent).
#[derive(Debug, Clone, Default)]
pub struct ServiceNet {
    listen: HashMap<String, Vec<PublishUnix>>,
    /// A service's ports published on a TCP address, for dependents on other machines (a
    /// node runner's `--service-listen`).
    publish: HashMap<String, Vec<voidbox_net::Publish>>,
    routes: HashMap<String, Vec<ServiceRoute>>,
    /// Services in the foreground (no dependents, or the output step): their output streams.
    foreground: Vec<String>,
}

impl ServiceNet {
    /// The sockets and routes of `plan`'s services, with sockets under `dir` (a directory
    /// only this user can enter, created by the caller).
    pub fn new(plan: &Plan, dir: &Path) -> Result<ServiceNet, String> {
        let mut net = ServiceNet::default();
        let mut count = 0usize;
        for idx in plan.graph.node_indices() {
            let node = &plan.graph[idx];
            if node.service.is_some() && !plan.is_sidecar(idx) {
                net.foreground.push(node.name.clone());
            }
            let Some(svc) = node.service.as_ref().filter(|s| !s.ports.is_empty()) else {
                continue;
            };
            let dependents: Vec<_> = plan
                .graph
                .neighbors_directed(idx, Direction::Outgoing)
                .collect();
            if dependents.is_empty() {
                continue;
            }
            let addr = voidbox_net::service_addr(count)
                .ok_or_else(|| format!("more than {count} services with dependents in one run"))?;
            let ports = svc
                .ports
                .iter()
                .map(|&port| {
                    let path = dir.join(format!("{count}-{port}.sock"));
                    socket_path_ok(&path).map(|()| (port, path))
                })
                .collect::<Result<Vec<_>, _>>()?;
            count += 1;
            net.listen.insert(
                node.name.clone(),
                ports
                    .iter()
                    .map(|(port, path)| PublishUnix {
                        path: path.clone(),
                        guest_port: *port,
                    })
                    .collect(),
            );
            let ports: Vec<ServicePort> = ports
                .into_iter()
                .map(|(port, path)| ServicePort {
                    port,
                    to: PortTarget::Unix(path),
                })
                .collect();
            let mut seen = Vec::new();
            for d in dependents {
                if seen.contains(&d) {
                    continue;
                }
                seen.push(d);
                net.routes
                    .entry(plan.graph[d].name.clone())
                    .or_default()
                    .push(ServiceRoute {
                        name: node.name.clone(),
                        addr,
                        ports: ports.clone(),
                    });
            }
        }
        Ok(net)
    }

    /// A node runner's services across machines: the node `node` of `full` (whose runner
    /// has `self` from its one-node plan) reaches each sidecar it depends on at the address
    /// `addrs` gives for it (`--service NAME=ADDR`), on that service's ports; and, with
    /// `listen` (`--service-listen ADDR`), a service publishes its ports on that address for
    /// its dependents' runners. Every sidecar with ports must have an address, and every
    /// address must be such a sidecar's.
    pub fn across_machines(
        &mut self,
        full: &Plan,
        node: petgraph::graph::NodeIndex,
        addrs: &[(String, std::net::IpAddr)],
        listen: Option<std::net::IpAddr>,
    ) -> Result<(), String> {
        let name = &full.graph[node].name;
        let upstream = reached_services(full, node);
        for (given, _) in addrs {
            if !upstream.iter().any(|&s| &full.graph[s].name == given) {
                return Err(format!(
                    "--service {given}=…: `{name}` depends on no service `{given}` with ports"
                ));
            }
        }
        for (i, &s) in upstream.iter().enumerate() {
            let svc = &full.graph[s];
            let Some((_, ip)) = addrs.iter().find(|(n, _)| n == &svc.name) else {
                return Err(format!(
                    "--node {name} depends on the service `{}`: give its runner's address with --service {}=ADDR",
                    svc.name, svc.name
                ));
            };
            let addr = voidbox_net::service_addr(i)
                .ok_or_else(|| format!("`{name}` depends on more than {i} services"))?;
            let ports = svc
                .service
                .iter()
                .flat_map(|x| &x.ports)
                .map(|&port| ServicePort {
                    port,
                    to: PortTarget::Tcp(std::net::SocketAddr::new(*ip, port)),
                })
                .collect();
            self.routes
                .entry(name.clone())
                .or_default()
                .push(ServiceRoute {
                    name: svc.name.clone(),
                    addr,
                    ports,
                });
        }
        if let Some(ip) = listen {
            let ports = full.graph[node]
                .service
                .as_ref()
                .map(|x| x.ports.clone())
                .unwrap_or_default();
            if ports.is_empty() {
                return Err(format!(
                    "--service-listen: `{name}` is not a `mode: service` node with `ports`"
                ));
            }
            self.publish.insert(
                name.clone(),
                ports
                    .into_iter()
                    .map(|port| voidbox_net::Publish {
                        host: std::net::SocketAddr::new(ip, port),
                        guest_port: port,
                    })
                    .collect(),
            );
        }
        Ok(())
    }

    /// The sockets `node`'s NAT listens on (empty unless it is a reached service).
    pub fn listen(&self, node: &str) -> &[PublishUnix] {
        self.listen.get(node).map_or(&[], Vec::as_slice)
    }

    /// The services `node` reaches (empty unless it depends on one with `ports`).
    pub fn routes(&self, node: &str) -> &[ServiceRoute] {
        self.routes.get(node).map_or(&[], Vec::as_slice)
    }

    /// `node` is a service in the foreground: its output streams to the terminal.
    pub fn foreground(&self, node: &str) -> bool {
        self.foreground.iter().any(|n| n == node)
    }

    /// Where `node`'s readiness probe connects in its guest: the guest's NIC address when its
    /// ports are reached through its NAT (by its dependents, or `--service-listen`), as a
    /// listener bound only to that address is reached and one bound only to 127.0.0.1 is
    /// not; its loopback (`None`) when nothing reaches it from outside.
    pub fn probe_addr(&self, node: &str) -> Option<std::net::Ipv4Addr> {
        (!self.listen(node).is_empty() || self.publish.contains_key(node))
            .then_some(voidbox_net::GUEST_IP)
    }

    /// `node`'s VM needs a network device for its services even without network of its own.
    pub fn needs_nic(&self, node: &str) -> bool {
        !self.listen(node).is_empty()
            || !self.routes(node).is_empty()
            || self.publish.contains_key(node)
    }

    /// Adds `node`'s service sockets and routes to its NAT config.
    pub fn apply_to(&self, node: &str, nat: &mut voidbox_net::NatConfig) {
        nat.publish_unix = self.listen(node).to_vec();
        nat.publish = self.publish.get(node).cloned().unwrap_or_default();
        nat.services = self.routes(node).to_vec();
    }
}

/// The sidecars with `ports` that `node` depends on, in declaration order: the services it
/// reaches over the network.
pub fn reached_services(
    plan: &Plan,
    node: petgraph::graph::NodeIndex,
) -> Vec<petgraph::graph::NodeIndex> {
    plan.upstream(node)
        .into_iter()
        .filter(|&s| {
            plan.is_sidecar(s)
                && plan.graph[s]
                    .service
                    .as_ref()
                    .is_some_and(|x| !x.ports.is_empty())
        })
        .collect()
}

fn socket_path_ok(path: &Path) -> Result<(), String> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(format!(
            "service socket path {} is {len} bytes, longer than a Unix socket allows ({MAX_SOCKET_PATH}): set TMPDIR to a shorter directory",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn plan(src: &str) -> Plan {
        crate::plan::compile_for_test(src)
    }

    #[test]
    fn only_dependents_get_routes_and_only_reached_services_listen() {
        let p = plan(
            "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: web, mode: service, ports: [8080, 9090], run: {program: httpd}}\n    - {name: quiet, mode: service, run: {program: sleep}}\n    - {name: a, depends_on: [web, quiet], run: {program: wget}}\n    - {name: b, depends_on: [web], run: {program: wget}}\n    - {name: c, run: {program: wget}}\n  output_step: a\n",
        );
        let net = ServiceNet::new(&p, Path::new("/run/x")).unwrap();
        let web = net.listen("web");
        assert_eq!(web.len(), 2);
        assert_eq!(web[0].path, Path::new("/run/x/0-8080.sock"));
        assert_eq!(web[1].guest_port, 9090);
        // `quiet` has no ports: nothing listens, nothing routes to it.
        assert!(net.listen("quiet").is_empty());
        for dep in ["a", "b"] {
            let r = net.routes(dep);
            assert_eq!(r.len(), 1, "{dep}");
            assert_eq!(r[0].name, "web");
            assert_eq!(Some(r[0].addr), voidbox_net::service_addr(0));
            assert_eq!(r[0].ports.len(), 2);
            assert!(net.needs_nic(dep));
        }
        assert!(net.routes("c").is_empty());
        assert!(!net.needs_nic("c"));
        assert!(net.needs_nic("web"));
        // `quiet` is a sidecar of `a`; no service is in the foreground.
        assert!(!net.foreground("quiet") && !net.foreground("web"));
        // `web` is probed where its dependents' connections arrive; `quiet`, reached by
        // nobody, on its loopback.
        assert_eq!(net.probe_addr("web"), Some(voidbox_net::GUEST_IP));
        assert_eq!(net.probe_addr("quiet"), None);
        assert_eq!(net.probe_addr("a"), None);
    }

    #[test]
    fn a_socket_path_too_long_is_an_error() {
        let p = plan(
            "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: web, mode: service, ports: [80], run: {program: httpd}}\n    - {name: a, depends_on: [web], run: {program: wget}}\n",
        );
        let long = PathBuf::from(format!("/{}", "d".repeat(120)));
        let e = ServiceNet::new(&p, &long).unwrap_err();
        assert!(e.contains("TMPDIR"), "{e}");
    }
}
