//! Parsing of the `voidbox.*` kernel boot parameters (`/proc/cmdline`).
//!
//! Understood parameters (unknown `voidbox.*` keys produce a warning, other kernel
//! parameters are ignored):
//!
//! | parameter | meaning |
//! |---|---|
//! | `voidbox.secret=<64 hex>` | 32-byte session secret required by the handshake |
//! | `voidbox.port=<n>` | vsock port to listen on (default 1234) |
//! | `voidbox.allow=<a,b,…>` | command allowlist (bare names or absolute paths) |
//! | `voidbox.rlimit.nofile=<n>` | `RLIMIT_NOFILE` of every child |
//! | `voidbox.rlimit.nproc=<n>` | `RLIMIT_NPROC` of every child |
//! | `voidbox.rlimit.fsize=<size>` | `RLIMIT_FSIZE` (bytes, `K`/`M`/`G` suffixes; whole MiB, rounded up) |
//! | `voidbox.rlimit.as=<size>` | `RLIMIT_AS` (bytes, `K`/`M`/`G` suffixes; whole MiB, rounded up) |
//! | `voidbox.timeout=<secs>` | default exec timeout (whole seconds, rounded up) |
//! | `voidbox.timeout.max=<secs>` | largest timeout a request may ask for (same) |
//! | `voidbox.max_output=<size>` | cap on stdout+stderr bytes streamed per exec |
//! | `voidbox.max_execs=<n>` | cap on concurrently running execs/PTYs |
//! | `voidbox.pty=0\|1` | whether PTY sessions may be opened (default 1) |
//! | `voidbox.hostname=<name>` | guest hostname (default `voidbox`) |
//! | `voidbox.shutdown=reboot\|poweroff\|halt` | how Shutdown ends the VM (default `reboot`) |
//! | `voidbox.debug=1` | verbose logging on the console |
//! | `voidbox.rootfs=vdX` | the node's OCI image disk: commands run in it ([`crate::disks`]) |
//! | `voidbox.user=UID:GID` | identity of commands (default 1000:1000; root refused) |
//! | `voidbox.mount=vdX:/path:ro\|rw` | an OCI skill disk mounted at `/path` (repeatable) |
//! | `voidbox.net=ADDR/PREFIX,GATEWAY,DNS` | the network interface, route and resolver ([`crate::net`]); an invalid value fails every exec |

use std::time::Duration;

use voidbox_protocol::{valid_allow_entry, GuestPolicy, SessionSecret};

use crate::auth::{scrub_string, secret_from_hex};
use crate::disks::DiskParams;
use crate::net::NetParam;

/// Default vsock port of the agent.
pub const DEFAULT_PORT: u32 = 1234;

/// How the guest ends itself on Shutdown when running as PID 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ShutdownMode {
    /// `reboot(RB_AUTOBOOT)`: with `reboot=k` the kernel writes 0xFE to port 0x64, which
    /// the VMM sees as "guest is done" (a poweroff without ACPI only halts the vCPU).
    #[default]
    Reboot,
    /// `reboot(RB_POWER_OFF)`: for VMMs with ACPI/PSCI power-off support.
    PowerOff,
    /// `reboot(RB_HALT_SYSTEM)`.
    Halt,
}

/// Everything the agent takes from the boot parameters.
#[derive(Debug, Default)]
pub struct BootParams {
    /// Session secret (`voidbox.secret`).
    pub secret: Option<SessionSecret>,
    /// vsock port (`voidbox.port`).
    pub port: Option<u32>,
    /// Policy parts (`voidbox.allow`, `voidbox.rlimit.*`, `voidbox.timeout*`).
    pub policy: GuestPolicy,
    /// Hostname (`voidbox.hostname`).
    pub hostname: Option<String>,
    /// Shutdown behaviour (`voidbox.shutdown`).
    pub shutdown: ShutdownMode,
    /// Verbose logging (`voidbox.debug`).
    pub debug: bool,
    /// Disks (`voidbox.rootfs`, `voidbox.user`, `voidbox.mount`).
    pub disks: DiskParams,
    /// Network (`voidbox.net`). An invalid value is kept here, not in `warnings`: it is an
    /// error that boot reports ([`crate::net::boot`]).
    pub net: NetParam,
    /// Problems found while parsing (reported on the console, never fatal).
    pub warnings: Vec<String>,
}

impl BootParams {
    /// Parses a kernel command line. Consumes and scrubs the input, since it may hold
    /// the session secret.
    pub fn parse(mut cmdline: String) -> BootParams {
        let mut params = BootParams::default();
        for token in split_cmdline(&cmdline) {
            let Some(rest) = token.strip_prefix("voidbox.") else {
                continue;
            };
            let (key, value) = match rest.split_once('=') {
                Some((k, v)) => (k, v),
                None => (rest, ""),
            };
            if let Err(e) = params.apply(key, value) {
                params.warnings.push(format!("voidbox.{key}: {e}"));
            }
        }
        scrub_string(&mut cmdline);
        params
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "secret" => self.secret = Some(secret_from_hex(value.to_string())?),
            "port" => self.port = Some(value.parse().map_err(|_| format!("bad port `{value}`"))?),
            "allow" => {
                let list: Vec<String> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                if let Some(bad) = list.iter().find(|e| !valid_allow_entry(e)) {
                    return Err(format!("bad allowlist entry `{bad}`"));
                }
                self.policy.allowlist = Some(list);
            }
            "rlimit.nofile" => self.policy.rlimits.nofile = Some(parse_size(value)?),
            "rlimit.nproc" => self.policy.rlimits.nproc = Some(parse_size(value)?),
            "rlimit.fsize" => self.policy.rlimits.fsize_mb = Some(parse_mib(value)?),
            "rlimit.as" => self.policy.rlimits.address_space_mb = Some(parse_mib(value)?),
            "timeout" => self.policy.default_timeout_secs = Some(whole_secs(parse_secs(value)?)),
            "timeout.max" => self.policy.max_timeout_secs = Some(whole_secs(parse_secs(value)?)),
            "max_output" => self.policy.max_output_bytes = Some(parse_size(value)?),
            "max_execs" => {
                let n = parse_size(value)?;
                self.policy.max_concurrent_execs =
                    Some(u32::try_from(n).map_err(|_| format!("bad count `{value}`"))?);
            }
            "pty" => self.policy.allow_pty = Some(parse_bool(value)?),
            "hostname" => {
                if value.is_empty()
                    || value.len() > 64
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
                {
                    return Err(format!("bad hostname `{value}`"));
                }
                self.hostname = Some(value.to_string());
            }
            "shutdown" => {
                self.shutdown = match value {
                    "reboot" => ShutdownMode::Reboot,
                    "poweroff" => ShutdownMode::PowerOff,
                    "halt" => ShutdownMode::Halt,
                    _ => return Err(format!("unknown shutdown mode `{value}`")),
                }
            }
            "debug" => self.debug = parse_bool(value)?,
            "rootfs" | "user" | "mount" => self.disks.apply(key, value)?,
            // Acted on before anything is mounted ([`crate::init::prepare_root`]).
            "root" if value == "rw" => {}
            "root" => return Err(format!("`{value}` is not `rw` (the root stays read-only)")),
            "net" => self.net.apply(value),
            _ => return Err("unknown parameter (ignored)".into()),
        }
        Ok(())
    }
}

/// Splits a kernel command line into parameters, honouring double quotes the way the
/// kernel does (`key="a b"` is one parameter; the quotes are removed).
pub fn split_cmdline(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut started = false;
    for c in s.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                started = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if started {
                    out.push(std::mem::take(&mut cur));
                    started = false;
                }
            }
            c => {
                cur.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(cur);
    }
    out
}

/// Parses a boolean flag (`1/0`, `true/false`, `yes/no`, `on/off`; empty = true).
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("bad boolean `{v}`")),
    }
}

/// Parses a non-negative size with an optional binary `K`/`M`/`G` suffix, or
/// `unlimited`/`infinity` (→ `u64::MAX`, i.e. `RLIM_INFINITY`).
pub fn parse_size(v: &str) -> Result<u64, String> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinity") {
        return Ok(u64::MAX);
    }
    let (digits, shift) = match v.as_bytes().last() {
        Some(b'k' | b'K') => (&v[..v.len() - 1], 10),
        Some(b'm' | b'M') => (&v[..v.len() - 1], 20),
        Some(b'g' | b'G') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("bad size `{v}`"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{v}` overflows"))
}

/// [`parse_size`] in whole MiB, rounded up (`unlimited` stays unlimited: it converts back to
/// `RLIM_INFINITY`, saturating).
pub fn parse_mib(v: &str) -> Result<u64, String> {
    Ok(parse_size(v)?.div_ceil(1 << 20))
}

/// Whole seconds, rounded up.
fn whole_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Parses a number of seconds (fractions allowed), which must be positive.
pub fn parse_secs(v: &str) -> Result<Duration, String> {
    let secs: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("bad number of seconds `{v}`"))?;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("timeout `{v}` out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Reads and parses `/proc/cmdline` (or another file in host mode).
pub fn read_boot_params(path: &str) -> std::io::Result<BootParams> {
    let text = std::fs::read_to_string(path)?;
    Ok(BootParams::parse(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_parameters() {
        let secret = "ab".repeat(32);
        let line = format!(
            "console=ttyS0 reboot=k voidbox.secret={secret} voidbox.port=4000 \
             voidbox.allow=sh,ls,/usr/bin/env voidbox.rlimit.nofile=64 voidbox.rlimit.as=512M \
             voidbox.rlimit.fsize=unlimited voidbox.timeout=2.5 voidbox.hostname=box-1 \
             voidbox.shutdown=poweroff voidbox.debug voidbox.bogus=1\n"
        );
        let p = BootParams::parse(line);
        assert_eq!(p.secret.as_ref().unwrap().as_bytes(), &[0xab; 32]);
        assert_eq!(p.port, Some(4000));
        assert_eq!(
            p.policy.allowlist.as_deref(),
            Some(&["sh".to_string(), "ls".into(), "/usr/bin/env".into()][..])
        );
        assert_eq!(p.policy.rlimits.nofile, Some(64));
        assert_eq!(p.policy.rlimits.address_space_mb, Some(512));
        assert_eq!(p.policy.rlimits.fsize_bytes(), Some(u64::MAX));
        assert_eq!(p.policy.default_timeout_secs, Some(3));
        assert_eq!(p.hostname.as_deref(), Some("box-1"));
        assert_eq!(p.shutdown, ShutdownMode::PowerOff);
        assert!(p.debug);
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    }

    #[test]
    fn bad_values_warn_without_failing() {
        let p = BootParams::parse(
            "voidbox.secret=xyz voidbox.port=-1 voidbox.allow=a/b voidbox.timeout=0".into(),
        );
        assert!(p.secret.is_none() && p.port.is_none() && p.policy.allowlist.is_none());
        assert_eq!(p.warnings.len(), 4);
    }

    #[test]
    fn quotes_group_words() {
        assert_eq!(
            split_cmdline(r#"a "b c" d="e f"  g"#),
            vec!["a", "b c", "d=e f", "g"]
        );
    }
}
