//! What a pull may do: target platform, plain-HTTP policy, progress reporting.

use crate::error::OciError;

/// Options for [`crate::Store::pull`].
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Registries (`host` or `host:port`) that may be reached over plain HTTP although they are
    /// not on loopback. Loopback registries (`localhost`, `127.0.0.0/8`, `[::1]`) always use
    /// plain HTTP; every other registry uses HTTPS.
    pub insecure_registries: Vec<String>,
    /// The platform picked from an image index; defaults to `linux/amd64`.
    pub platform: Platform,
}

/// A target platform, `os/architecture[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    pub os: String,
    /// Go's `GOARCH` spelling: `amd64`, `arm64`, …
    pub architecture: String,
    /// CPU variant (`v8`), matched only when set.
    pub variant: Option<String>,
}

impl Default for Platform {
    fn default() -> Self {
        Platform {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }
}

impl Platform {
    /// Parses `os/arch[/variant]` (`linux/arm64/v8`).
    pub fn parse(s: &str) -> Result<Platform, OciError> {
        let parts: Vec<&str> = s.split('/').collect();
        let bad = || OciError::InvalidReference {
            reference: s.to_string(),
            reason: "platform must be os/arch[/variant]".into(),
        };
        match parts.as_slice() {
            [os, arch] if !os.is_empty() && !arch.is_empty() => Ok(Platform {
                os: os.to_string(),
                architecture: normalize_arch(arch),
                variant: None,
            }),
            [os, arch, v] if !os.is_empty() && !arch.is_empty() && !v.is_empty() => Ok(Platform {
                os: os.to_string(),
                architecture: normalize_arch(arch),
                variant: Some(v.to_string()),
            }),
            _ => Err(bad()),
        }
    }

    /// Whether an index entry or image config for `os`/`arch`/`variant` runs here.
    pub fn matches(&self, os: &str, arch: &str, variant: Option<&str>) -> bool {
        os == self.os
            && normalize_arch(arch) == self.architecture
            && match (&self.variant, variant) {
                (Some(want), Some(have)) => want == have,
                (Some(_), None) => false,
                (None, _) => true,
            }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// `x86_64` → `amd64`, `aarch64` → `arm64`; other names unchanged.
fn normalize_arch(arch: &str) -> String {
    match arch {
        "x86_64" | "x86-64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        a => a.to_string(),
    }
}

/// Whether `registry` (`host[:port]`) may be spoken to over plain HTTP: loopback hosts always,
/// others only when listed in `insecure` (as `host:port`, or as `host` for any port).
pub fn plain_http_allowed(registry: &str, insecure: &[String]) -> bool {
    let host = host_of(registry);
    if is_loopback(host) {
        return true;
    }
    insecure
        .iter()
        .any(|entry| entry.eq_ignore_ascii_case(registry) || entry.eq_ignore_ascii_case(host))
}

/// The host part of `host[:port]` (brackets of an IPv6 literal kept).
fn host_of(registry: &str) -> &str {
    if registry.starts_with('[') {
        return match registry.find(']') {
            Some(end) => &registry[..=end],
            None => registry,
        };
    }
    match registry.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => registry,
    }
}

fn is_loopback(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>()
        .map(|ip| ip.is_loopback())
        .unwrap_or(false)
}

/// Receives progress of a pull; all methods may be called from any thread.
pub trait PullProgress: Send + Sync {
    /// The layers about to be downloaded: how many, and their total compressed size.
    fn layers(&self, total: usize, bytes: u64);
    /// `n` more bytes arrived.
    fn bytes(&self, n: u64);
    /// A layer finished downloading and its digest checked out.
    fn layer_done(&self, digest: &str);
    /// A phase started: `resolving`, `downloading`, `unpacking`, `converting`, `cached`.
    fn phase(&self, what: &str);
}

/// A [`PullProgress`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl PullProgress for NoProgress {
    fn layers(&self, _: usize, _: u64) {}
    fn bytes(&self, _: u64) {}
    fn layer_done(&self, _: &str) {}
    fn phase(&self, _: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_for_loopback_unless_listed() {
        for r in [
            "127.0.0.1:5000",
            "localhost",
            "localhost:80",
            "[::1]:5000",
            "127.1.2.3",
        ] {
            assert!(plain_http_allowed(r, &[]), "{r}");
        }
        for r in [
            "registry.example:5000",
            "10.0.0.1:5000",
            "docker.io",
            "[fe80::1]:5000",
        ] {
            assert!(!plain_http_allowed(r, &[]), "{r}");
        }
        let list = vec!["registry.example:5000".to_string(), "10.0.0.1".to_string()];
        assert!(plain_http_allowed("registry.example:5000", &list));
        assert!(!plain_http_allowed("registry.example:5001", &list));
        assert!(plain_http_allowed("10.0.0.1:443", &list));
        assert!(!plain_http_allowed("localhost.evil.example", &list));
    }

    #[test]
    fn platforms_parse_and_match() {
        let p = Platform::parse("linux/arm64/v8").unwrap();
        assert!(p.matches("linux", "aarch64", Some("v8")));
        assert!(!p.matches("linux", "arm64", None));
        let d = Platform::default();
        assert!(d.matches("linux", "amd64", None) && d.matches("linux", "x86_64", Some("v2")));
        assert!(!d.matches("windows", "amd64", None));
        assert!(Platform::parse("linux").is_err());
        assert_eq!(d.to_string(), "linux/amd64");
    }
}
