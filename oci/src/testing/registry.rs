//! Debian's `docker-registry` (distribution 2.8) on a free loopback port.

use super::token::{TokenServer, ISSUER, SERVICE};
use super::{herr, http_request, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How a test registry authenticates clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryAuthMode {
    /// No authentication.
    Anonymous,
    /// HTTP basic auth from an htpasswd file (bcrypt) with one user.
    Basic {
        /// The user.
        user: String,
        /// Their password.
        password: String,
    },
    /// Bearer tokens from a token server run by the harness, which accepts one user.
    Token {
        /// The user.
        user: String,
        /// Their password.
        password: String,
    },
}

/// A running registry, serving plain HTTP on `127.0.0.1:<port>` from a temporary storage
/// directory. Killed (and its storage deleted) on drop.
pub struct Registry {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    auth: RegistryAuthMode,
    token: Option<TokenServer>,
}

impl Registry {
    /// Starts an anonymous registry.
    pub fn start() -> Result<Registry> {
        Registry::start_with(RegistryAuthMode::Anonymous)
    }

    /// Starts a registry with htpasswd basic auth for `user`/`password`.
    pub fn start_with_basic_auth(user: &str, password: &str) -> Result<Registry> {
        Registry::start_with(RegistryAuthMode::Basic {
            user: user.into(),
            password: password.into(),
        })
    }

    /// Starts a registry with token auth; the harness's token server accepts `user`/`password`.
    pub fn start_with_token_auth(user: &str, password: &str) -> Result<Registry> {
        Registry::start_with(RegistryAuthMode::Token {
            user: user.into(),
            password: password.into(),
        })
    }

    /// Starts a registry authenticating as `auth` says.
    pub fn start_with(auth: RegistryAuthMode) -> Result<Registry> {
        let dir = tempfile::Builder::new()
            .prefix("voidbox-registry.")
            .tempdir()?;
        let token = match &auth {
            RegistryAuthMode::Token { user, password } => Some(TokenServer::start(user, password)?),
            _ => None,
        };
        let auth_yaml = match &auth {
            RegistryAuthMode::Anonymous => String::new(),
            RegistryAuthMode::Basic { user, password } => {
                let hash = bcrypt::hash_with_result(password, 5)
                    .map_err(|e| herr!("bcrypt: {e}"))?
                    .format_for_version(bcrypt::Version::TwoY);
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n"))?;
                format!(
                    "auth:\n  htpasswd:\n    realm: voidbox-test\n    path: {}\n",
                    htpasswd.display()
                )
            }
            RegistryAuthMode::Token { .. } => {
                let Some(t) = token.as_ref() else {
                    return Err(herr!("token server missing"));
                };
                let bundle = dir.path().join("token-cert.pem");
                std::fs::write(&bundle, &t.cert_pem)?;
                format!(
                    "auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
                    t.realm(),
                    bundle.display()
                )
            }
        };
        let storage = dir.path().join("storage");
        std::fs::create_dir(&storage)?;
        let mut last_err = herr!("registry did not start");
        for _attempt in 0..5 {
            let port = free_port()?;
            // Every response carries this instance's token: a registry of another test that
            // raced onto the same port cannot pass as this one while this one fails to bind.
            let instance = instance_token(port);
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                     http:\n  addr: 127.0.0.1:{port}\n  secret: voidbox-test-secret\n  \
                     headers:\n    {INSTANCE_HEADER}: [\"{instance}\"]\n{auth_yaml}",
                    storage.display()
                ),
            )?;
            let log_path = dir.path().join("registry.log");
            let log = std::fs::File::create(&log_path)?;
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .map_err(|e| {
                    herr!("starting docker-registry (apt-get install docker-registry): {e}")
                })?;
            match wait_ready(&mut child, port, &instance, &log_path) {
                Ok(()) => {
                    return Ok(Registry {
                        child: Some(child),
                        port,
                        dir,
                        auth,
                        token,
                    })
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_err = e;
                }
            }
        }
        Err(last_err)
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:<port>/<name_tag>`: a reference to pull.
    pub fn reference(&self, name_tag: &str) -> String {
        format!("{}/{name_tag}", self.host())
    }

    /// How it authenticates.
    pub fn auth(&self) -> &RegistryAuthMode {
        &self.auth
    }

    /// The user and password it accepts, when it authenticates.
    pub fn credentials(&self) -> Option<(String, String)> {
        match &self.auth {
            RegistryAuthMode::Anonymous => None,
            RegistryAuthMode::Basic { user, password }
            | RegistryAuthMode::Token { user, password } => Some((user.clone(), password.clone())),
        }
    }

    /// Tokens the token server has issued (0 for other modes).
    pub fn tokens_issued(&self) -> u64 {
        self.token
            .as_ref()
            .map_or(0, |t| t.issued.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The registry's storage directory.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Where the registry keeps the bytes of blob `digest` (`sha256:…`).
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(hex.get(..2).unwrap_or(""))
            .join(hex)
            .join("data")
    }

    /// The scratch directory of this registry (config, logs); tests may put files here.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the registry process (the storage stays until drop). Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the registry process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The response header naming the registry instance.
const INSTANCE_HEADER: &str = "X-Voidbox-Test-Registry";

/// A token no other registry (in this or another test process) sends.
fn instance_token(port: u16) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}-{port}", std::process::id())
}

/// Waits until this registry answers `GET /v2/` (200 or 401, with its own `instance` token).
fn wait_ready(child: &mut Child, port: u16, instance: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let host = format!("127.0.0.1:{port}");
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(herr!(
                "docker-registry exited ({status}): {}",
                log_tail(log)
            ));
        }
        if let Ok(resp) = http_request(&host, "GET", "/v2/", &[], b"") {
            if (resp.status == 200 || resp.status == 401)
                && resp.header(INSTANCE_HEADER) == Some(instance)
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(herr!(
                "docker-registry not ready after 20 s: {}",
                log_tail(log)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let start = text.len().saturating_sub(2000);
    text.get(start..).unwrap_or("").to_string()
}
