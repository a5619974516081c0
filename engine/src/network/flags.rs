//! The network flags of `voidbox run`: `--network` and the policy flags (each of which
//! implies `--network`), checked with the same rules as the spec's `network:` mapping.

use ipnet::IpNet;
use voidbox_net::NetworkPolicy;

use super::{checks, CONNECTIONS_PER_SECOND_LIMIT, MAX_CONNECTIONS_LIMIT};

/// `voidbox run` network flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NetworkArgs {
    /// Give the VM a network device with the default policy (public egress; host loopback,
    /// private, link-local, CGNAT and metadata addresses denied). Any policy flag below
    /// implies it.
    #[arg(long, help_heading = "Network")]
    pub network: bool,
    /// Host loopback port the guest may reach at 10.0.2.2:PORT (repeatable).
    #[arg(long = "allow-host-port", value_name = "PORT", help_heading = "Network",
          value_parser = clap::value_parser!(u16).range(1..=65535))]
    pub allow_host_ports: Vec<u16>,
    /// Public egress only to addresses this name resolves to through the VM's own DNS
    /// (repeatable; `*.example.com` for subdomains).
    #[arg(long = "allow-domain", value_name = "NAME", help_heading = "Network",
          value_parser = domain_arg)]
    pub allow_domains: Vec<String>,
    /// Exception to the default denies, as a CIDR (repeatable).
    #[arg(long = "allow", value_name = "CIDR", help_heading = "Network",
          value_parser = cidr_arg)]
    pub allow: Vec<IpNet>,
    /// Extra deny, as a CIDR; denies win over everything (repeatable).
    #[arg(long = "deny", value_name = "CIDR", help_heading = "Network",
          value_parser = cidr_arg)]
    pub deny: Vec<IpNet>,
    /// Most concurrent connections and UDP flows (1..=65535; default 256).
    #[arg(long, value_name = "N", help_heading = "Network",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CONNECTIONS_LIMIT)))]
    pub max_connections: Option<u32>,
    /// Most new connections and UDP flows per second (1..=10000; default 100).
    #[arg(long, value_name = "N", help_heading = "Network",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(CONNECTIONS_PER_SECOND_LIMIT)))]
    pub connections_per_second: Option<u32>,
}

fn cidr_arg(s: &str) -> Result<IpNet, String> {
    checks::cidr(s).map_err(|p| p.to_string())
}

fn domain_arg(s: &str) -> Result<String, String> {
    checks::domain(s).map_err(|p| p.to_string())
}

impl NetworkArgs {
    /// The policy the flags ask for: `None` without `--network` or any policy flag.
    pub fn policy(&self) -> Result<Option<NetworkPolicy>, String> {
        let any_policy = !self.allow_host_ports.is_empty()
            || !self.allow_domains.is_empty()
            || !self.allow.is_empty()
            || !self.deny.is_empty()
            || self.max_connections.is_some()
            || self.connections_per_second.is_some();
        if !self.network && !any_policy {
            return Ok(None);
        }
        if let Some((i, _)) = checks::duplicate_ports(&self.allow_host_ports).first() {
            return Err(format!(
                "--allow-host-port {} is given twice",
                self.allow_host_ports[*i]
            ));
        }
        let d = NetworkPolicy::default();
        Ok(Some(NetworkPolicy {
            allow_host_ports: self.allow_host_ports.clone(),
            allow_domains: self.allow_domains.clone(),
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            connections_per_second: self
                .connections_per_second
                .unwrap_or(d.connections_per_second),
            public_egress: true,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct T {
        #[command(flatten)]
        n: NetworkArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<NetworkPolicy>, String> {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        T::try_parse_from(argv)
            .map_err(|e| e.to_string())
            .and_then(|t| t.n.policy())
    }

    #[test]
    fn no_flag_no_network() {
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(
            parse(&["--network"]).unwrap(),
            Some(NetworkPolicy::default())
        );
    }

    #[test]
    fn policy_flags_imply_network() {
        let p = parse(&[
            "--allow-host-port",
            "11434",
            "--allow-host-port=8080",
            "--allow-domain",
            "API.github.com",
            "--allow",
            "203.0.113.0/24",
            "--deny",
            "198.51.100.0/24",
            "--max-connections",
            "64",
            "--connections-per-second",
            "50",
        ])
        .unwrap()
        .expect("network on");
        assert_eq!(p.allow_host_ports, [11434, 8080]);
        assert_eq!(p.allow_domains, ["api.github.com"]);
        assert_eq!(p.allow[0].to_string(), "203.0.113.0/24");
        assert_eq!(p.deny[0].to_string(), "198.51.100.0/24");
        assert_eq!((p.max_connections, p.connections_per_second), (64, 50));
        let p = parse(&["--max-connections", "8"]).unwrap().expect("on");
        assert_eq!(
            p.connections_per_second,
            NetworkPolicy::default().connections_per_second
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_spec_checks() {
        let e = parse(&["--allow", "10.0.0.1/8"]).unwrap_err();
        assert!(e.contains("did you mean `10.0.0.0/8`"), "{e}");
        let e = parse(&["--deny", "10.0.0.1"]).unwrap_err();
        assert!(e.contains("`10.0.0.1/32`"), "{e}");
        let e = parse(&["--allow-domain", "https://example.com/"]).unwrap_err();
        assert!(e.contains("did you mean `example.com`"), "{e}");
        assert!(parse(&["--allow-host-port", "0"]).is_err());
        assert!(parse(&["--allow-host-port", "65536"]).is_err());
        assert!(parse(&["--max-connections", "0"]).is_err());
        assert!(parse(&["--max-connections", "65536"]).is_err());
        assert!(parse(&["--connections-per-second", "10001"]).is_err());
        let e = parse(&["--allow-host-port", "80", "--allow-host-port", "80"]).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
    }
}
