//! Command-line flags (host mode) and the start-up sequence for both modes.
//!
//! As PID 1 (guest mode) the agent takes no flags: everything comes from `/proc/cmdline`.
//! On the host (tests, debugging):
//!
//! ```text
//! voidbox-guest-agent --listen unix:PATH|vsock:PORT
//!                     (--secret-hex HEX | --secret-file PATH)
//!                     [--root DIR] [--boot-params 'voidbox.allow=sh voidbox.rlimit.nofile=64 …']
//!                     [--cmdline-file PATH] [--no-drop] [--rekey off|secret-only|system]
//!                     [--restore-page FILE] [--debug]
//! ```
//!
//! * `--root DIR` relocates the confinement roots: `/workspace` → `DIR/workspace`, etc.
//!   They are created (workspace and `home/sandbox` owned by uid 1000).
//! * `--boot-params` / `--cmdline-file` are parsed exactly like `/proc/cmdline`.
//! * Children always run as uid/gid 1000. A non-root agent cannot do that and refuses to
//!   start unless `--no-drop` is given explicitly (children then keep the agent's uid).
//! * `Rekey` is refused in host mode unless `--rekey` says otherwise: `secret-only` rotates
//!   the secret without touching the host's RNG or clock (tests; the Pong says so with the
//!   `rekey_secret_only` capability), `system` does what PID 1 always does — reseed the
//!   kernel RNG and set the clock (needs root, and changes the host's clock).
//! * `--restore-page FILE` maps FILE (at least 16 KiB) as the restore page PID 1 finds through
//!   `/dev/mem` ([`crate::restore_page`]): armed at start, read before every handshake
//!   (tests fill it as the VMM does). It needs `--rekey secret-only` or `system`.
//! * In host mode the agent is a child subreaper (it reaps orphaned grandchildren) and
//!   dies with its parent (`PR_SET_PDEATHSIG`).

use std::path::PathBuf;

use voidbox_protocol::SessionSecret;

use crate::cmdline::{BootParams, DEFAULT_PORT};
use crate::exec::ExecEnv;
use crate::net::NetState;
use crate::policy::Policy;
use crate::rekey::RekeyMode;
use crate::server::{AgentConfig, Listen};
use crate::spawn::SANDBOX;

/// Parsed host-mode flags.
#[derive(Debug, Default)]
pub struct Flags {
    /// `--listen`.
    pub listen: Option<Listen>,
    /// `--secret-hex` / `--secret-file`.
    pub secret: Option<SessionSecret>,
    /// `--root`.
    pub root: Option<PathBuf>,
    /// `--boot-params` / `--cmdline-file`.
    pub boot_params: Option<String>,
    /// `--no-drop`.
    pub no_drop: bool,
    /// `--rekey` (default off).
    pub rekey: RekeyMode,
    /// `--restore-page FILE`.
    pub restore_page: Option<PathBuf>,
    /// `--debug`.
    pub debug: bool,
}

/// Usage text.
pub const USAGE: &str = "usage: voidbox-guest-agent --listen unix:PATH|vsock:PORT \
(--secret-hex HEX | --secret-file PATH) [--root DIR] [--boot-params STRING] \
[--cmdline-file PATH] [--no-drop] [--rekey off|secret-only|system] [--restore-page FILE] [--debug]\n(as PID 1 no flags are used; see /proc/cmdline voidbox.* parameters)";

/// Parses flags (without argv[0]).
pub fn parse_flags(args: impl IntoIterator<Item = String>) -> Result<Flags, String> {
    let mut f = Flags::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--listen" => f.listen = Some(parse_listen(&value()?)?),
            "--secret-hex" => f.secret = Some(crate::auth::secret_from_hex(value()?)?),
            "--secret-file" => f.secret = Some(crate::auth::secret_from_file(&value()?)?),
            "--root" => f.root = Some(PathBuf::from(value()?)),
            "--boot-params" => f.boot_params = Some(value()?),
            "--cmdline-file" => {
                let p = value()?;
                f.boot_params =
                    Some(std::fs::read_to_string(&p).map_err(|e| format!("reading {p}: {e}"))?);
            }
            "--no-drop" => f.no_drop = true,
            "--rekey" => f.rekey = RekeyMode::parse(&value()?)?,
            "--restore-page" => f.restore_page = Some(PathBuf::from(value()?)),
            "--debug" => f.debug = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            "-V" | "--version" => {
                return Err(format!("voidbox-guest-agent {}", env!("CARGO_PKG_VERSION")))
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    Ok(f)
}

/// Parses `unix:PATH` or `vsock:PORT`.
pub fn parse_listen(s: &str) -> Result<Listen, String> {
    if let Some(p) = s.strip_prefix("unix:") {
        if p.is_empty() {
            return Err("unix: needs a path".into());
        }
        return Ok(Listen::Unix(PathBuf::from(p)));
    }
    if let Some(p) = s.strip_prefix("vsock:") {
        return p
            .parse()
            .map(Listen::Vsock)
            .map_err(|_| format!("bad vsock port `{p}`"));
    }
    Err(format!("--listen takes unix:PATH or vsock:PORT, not `{s}`"))
}

/// Builds the host-mode configuration from flags.
pub fn host_config(flags: Flags) -> Result<AgentConfig, String> {
    let params = BootParams::parse(flags.boot_params.unwrap_or_default());
    for w in &params.warnings {
        crate::log!("warning: {w}");
    }
    let secret = flags.secret.or(params.secret).ok_or(
        "no session secret: pass --secret-hex, --secret-file or voidbox.secret= in --boot-params",
    )?;
    // SAFETY: geteuid has no preconditions.
    let root_user = unsafe { libc::geteuid() } == 0;
    let creds = match (root_user, flags.no_drop) {
        (true, _) => Some(SANDBOX),
        (false, true) => {
            crate::log!("warning: --no-drop: children keep the agent's uid (testing only)");
            None
        }
        (false, false) => {
            return Err("children must run as uid 1000, which needs root; \
                        pass --no-drop to run them as the current user (testing only)"
                .into())
        }
    };
    let base = match flags.root {
        Some(dir) => {
            prepare_root(&dir, root_user)
                .map_err(|e| format!("preparing {}: {e}", dir.display()))?;
            dir
        }
        None => PathBuf::from("/"),
    };
    if params.net != crate::net::NetParam::Absent {
        crate::log!(
            "warning: voidbox.net is ignored outside a VM (the host's network is left alone)"
        );
    }
    if flags.rekey == RekeyMode::System {
        crate::log!("warning: --rekey system: a Rekey reseeds this host's RNG and sets its clock");
    }
    let restore_page = match &flags.restore_page {
        Some(_) if flags.rekey == RekeyMode::Off => {
            return Err("--restore-page needs --rekey secret-only or system".into())
        }
        Some(p) => Some(
            crate::restore_page::RestorePage::open(p, 0)
                .map_err(|e| format!("--restore-page {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let listen = flags
        .listen
        .unwrap_or(Listen::Vsock(params.port.unwrap_or(DEFAULT_PORT)));
    Ok(AgentConfig {
        listen,
        secret,
        policy: Policy::from_spec(&params.policy),
        exec_env: ExecEnv {
            creds,
            base,
            root: Default::default(),
        },
        is_init: false,
        shutdown_mode: params.shutdown,
        vsock_any_peer: true,
        rekey: flags.rekey,
        net: NetState::Off,
        restore_page,
    })
}

/// Creates `DIR/workspace`, `DIR/home/sandbox` and `DIR/etc/voidbox` for host mode.
fn prepare_root(dir: &std::path::Path, chown: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (sub, mode, sandbox_owned) in [
        ("", 0o755, false),
        ("workspace", 0o755, true),
        ("home", 0o755, false),
        ("home/sandbox", 0o700, true),
        ("etc", 0o755, false),
        ("etc/voidbox", 0o755, false),
    ] {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        if chown && sandbox_owned {
            std::os::unix::fs::chown(&p, Some(SANDBOX.uid), Some(SANDBOX.gid))?;
        }
    }
    Ok(())
}

/// Builds the guest (PID 1) configuration from `/proc/cmdline`.
pub fn guest_config() -> AgentConfig {
    crate::init::mount_filesystems();
    let raw = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if let Err(e) = crate::init::hide_cmdline_secret(&raw) {
        crate::log!("cannot hide the secret in /proc/cmdline: {e}");
    }
    let params = BootParams::parse(raw);
    crate::set_debug(params.debug);
    for w in &params.warnings {
        crate::log!("warning: {w}");
    }
    crate::init::configure(params.hostname.as_deref());
    let hostname = params
        .hostname
        .as_deref()
        .unwrap_or(crate::init::DEFAULT_HOSTNAME);
    let net = crate::net::boot(&params.net, hostname, &crate::disks::Layout::guest());
    let secret = params.secret.unwrap_or_else(|| {
        crate::log!(
            "error: no voidbox.secret= on the kernel command line; no connection can authenticate"
        );
        SessionSecret::random().unwrap_or_else(|_| SessionSecret::from_bytes([0xff; 32]))
    });
    AgentConfig {
        listen: Listen::Vsock(params.port.unwrap_or(DEFAULT_PORT)),
        secret,
        policy: Policy::from_spec(&params.policy),
        exec_env: ExecEnv {
            creds: Some(SANDBOX),
            base: PathBuf::from("/"),
            root: Default::default(),
        },
        is_init: true,
        shutdown_mode: params.shutdown,
        vsock_any_peer: false,
        // Clones of one snapshot must never keep a shared RNG state or a stale clock.
        rekey: RekeyMode::System,
        net,
        restore_page: guest_restore_page(),
    }
}

/// PID 1's restore page, mapped from `/dev/mem` and armed. Without it a snapshot of this VM
/// records no restore page, and restoring it is refused (by the VMM, with the reason).
fn guest_restore_page() -> Option<crate::restore_page::RestorePage> {
    let path = std::path::Path::new(crate::restore_page::DEV_MEM);
    match crate::restore_page::RestorePage::open(path, voidbox_protocol::restore_page::GPA) {
        Ok(p) => Some(p),
        Err(e) => {
            crate::log!(
                "no restore page ({} at {:#x}: {e}): snapshots of this VM cannot be restored",
                path.display(),
                voidbox_protocol::restore_page::GPA
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let f = parse_flags(
            [
                "--listen",
                "unix:/tmp/x.sock",
                "--secret-hex",
                &"00".repeat(32),
                "--root=/tmp/r",
                "--debug",
            ]
            .map(String::from),
        )
        .unwrap();
        assert_eq!(f.listen, Some(Listen::Unix("/tmp/x.sock".into())));
        assert!(f.secret.is_some() && f.debug && !f.no_drop);
        assert_eq!(f.rekey, RekeyMode::Off);
        assert_eq!(f.root, Some(PathBuf::from("/tmp/r")));
        let f = parse_flags(["--rekey=secret-only".to_string()]).unwrap();
        assert_eq!(f.rekey, RekeyMode::SecretOnly);
        assert!(parse_flags(["--rekey".to_string(), "maybe".to_string()]).is_err());
        assert!(parse_flags(["--bogus".to_string()]).is_err());
        assert!(parse_flags(["--listen".to_string()]).is_err());
        assert_eq!(parse_listen("vsock:1234"), Ok(Listen::Vsock(1234)));
        assert!(parse_listen("tcp:1").is_err());
    }
}
