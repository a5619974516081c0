//! `--publish [ADDR:]HOST_PORT:GUEST_PORT`: a host TCP address whose connections the VM's
//! NAT relays to a guest port ([`voidbox_net::Publish`]). Without an address it listens on
//! loopback only (`127.0.0.1`); `0.0.0.0:8080:80` opens it to the network, `[::1]:8080:80`
//! is IPv6. Ports are 1..=65535 (no "any port": the address is printed as given).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};

use voidbox_net::Publish;

/// Parses one `--publish` value.
pub fn parse(v: &str) -> Result<Publish, String> {
    let bad = |why: &str| Err(format!("--publish `{v}`: {why}"));
    let Some((front, guest)) = v.rsplit_once(':') else {
        return bad("expected [ADDR:]HOST_PORT:GUEST_PORT, for example 8080:80");
    };
    let port = |p: &str, what: &str| -> Result<u16, String> {
        match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("--publish `{v}`: {what} `{p}` is not 1..=65535")),
            Ok(n) => Ok(n),
        }
    };
    let guest_port = port(guest, "guest port")?;
    let (addr, host_port) = match front.rsplit_once(':') {
        None => (IpAddr::V4(Ipv4Addr::LOCALHOST), port(front, "host port")?),
        Some((a, p)) => {
            let a = a
                .strip_prefix('[')
                .and_then(|a| a.strip_suffix(']'))
                .unwrap_or(a);
            match a.parse::<IpAddr>() {
                Ok(ip) => (ip, port(p, "host port")?),
                Err(_) => return bad(&format!("`{a}` is not an IP address")),
            }
        }
    };
    Ok(Publish {
        host: SocketAddr::new(addr, host_port),
        guest_port,
    })
}

/// Checks that every host address can be listened on now (a port in use, an address not
/// on this host), so the error comes before a VM boots; the VMM binds them again.
pub fn check_free(publish: &[Publish]) -> Result<(), String> {
    for (i, p) in publish.iter().enumerate() {
        if publish[..i].iter().any(|o| o.host == p.host) {
            return Err(format!("--publish {} is given twice", p.host));
        }
        TcpListener::bind(p.host).map_err(|e| format!("cannot publish {}: {e}", p.host))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let p = parse("8080:80").unwrap();
        assert_eq!(p.host, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(p.guest_port, 80);
        assert_eq!(
            parse("0.0.0.0:9000:9000").unwrap().host,
            "0.0.0.0:9000".parse().unwrap()
        );
        assert_eq!(
            parse("[::1]:8443:443").unwrap().host,
            "[::1]:8443".parse().unwrap()
        );
        for bad in [
            "",
            "80",
            "0:80",
            "8080:0",
            "a:80",
            "8080:70000",
            "host:1:2",
            "1.2.3:1:2",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("x:1:2").unwrap_err().contains("not an IP address"));
    }

    #[test]
    fn ports_in_use_and_duplicates_are_refused() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = Publish {
            host: taken.local_addr().unwrap(),
            guest_port: 80,
        };
        assert!(check_free(&[p]).unwrap_err().contains("cannot publish"));
        drop(taken);
        assert!(check_free(&[p, p]).unwrap_err().contains("twice"));
    }
}
