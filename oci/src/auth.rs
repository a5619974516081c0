//! Registry credentials: where they come from, and keeping them out of logs and errors.
//!
//! Lookup order for a registry `host[:port]`:
//! 1. The environment: `VOIDBOX_REGISTRY_USERNAME` and `VOIDBOX_REGISTRY_PASSWORD` (both or
//!    neither). They are offered to **every** registry pulled from in that process.
//! 2. Docker's config: `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`, entry
//!    `auths.<registry>` with `auth` (base64 of `user:password`) or `username` + `password`.
//!    Keys may carry a scheme and a path (`https://index.docker.io/v1/`); `docker.io`,
//!    `index.docker.io` and `registry-1.docker.io` are one registry. Entries that hold only an
//!    `identitytoken` (an OAuth refresh token) and credential helpers (`credsStore`,
//!    `credHelpers`) are not supported: such registries are tried anonymously.
//! 3. Otherwise anonymous.
//!
//! Whatever is found is used for HTTP basic auth, or presented to the registry's token server
//! when the registry answers with a bearer challenge.

use crate::error::OciError;
use base64::Engine as _;
use std::path::PathBuf;

/// Environment variable holding the registry user name.
pub const ENV_USERNAME: &str = "VOIDBOX_REGISTRY_USERNAME";
/// Environment variable holding the registry password (or access token).
pub const ENV_PASSWORD: &str = "VOIDBOX_REGISTRY_PASSWORD";

/// A user name and password. `Debug` prints the user name only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Credentials from a user name and password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Credentials {
        Credentials {
            username: username.into(),
            password: password.into(),
        }
    }

    /// Replaces every occurrence of the password (and its base64 forms) in `text` by `***`,
    /// for messages that come back from a registry or token server.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        let b64 = base64::engine::general_purpose::STANDARD;
        let pair = b64.encode(format!("{}:{}", self.username, self.password));
        for secret in [pair, b64.encode(&self.password), self.password.clone()] {
            if secret.len() >= 3 {
                out = out.replace(&secret, "***");
            }
        }
        out
    }

    pub(crate) fn to_registry_auth(&self) -> oci_client::secrets::RegistryAuth {
        oci_client::secrets::RegistryAuth::Basic(self.username.clone(), self.password.clone())
    }
}

/// The credentials to offer `registry` (`host[:port]`), per the lookup order in the module docs.
pub fn credentials_for(registry: &str) -> Result<Option<Credentials>, OciError> {
    if let Some(c) = from_env()? {
        return Ok(Some(c));
    }
    match docker_config_path() {
        Some(path) => from_docker_config(&path, registry),
        None => Ok(None),
    }
}

fn from_env() -> Result<Option<Credentials>, OciError> {
    let user = std::env::var(ENV_USERNAME).ok().filter(|s| !s.is_empty());
    let pass = std::env::var(ENV_PASSWORD).ok().filter(|s| !s.is_empty());
    match (user, pass) {
        (Some(u), Some(p)) => Ok(Some(Credentials::new(u, p))),
        (None, None) => Ok(None),
        _ => Err(OciError::Credentials(format!(
            "set both {ENV_USERNAME} and {ENV_PASSWORD}, or neither"
        ))),
    }
}

/// `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|s| !s.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// Reads the entry for `registry` from a Docker `config.json`; a missing file is no entry.
pub fn from_docker_config(
    path: &std::path::Path,
    registry: &str,
) -> Result<Option<Credentials>, OciError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(OciError::io(format!("reading {}", path.display()), e)),
    };
    // Errors name the file, never its content (which holds secrets).
    let bad = |what: &str| OciError::Credentials(format!("{}: {what}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text).map_err(|_| bad("not valid JSON"))?;
    let Some(auths) = doc.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    let want = canonical_host(registry);
    for (key, entry) in auths {
        if canonical_host(key) != want {
            continue;
        }
        if let Some(auth) = entry
            .get("auth")
            .and_then(|a| a.as_str())
            .filter(|a| !a.is_empty())
        {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|_| bad(&format!("auths.{key}.auth is not base64")))?;
            let pair = String::from_utf8(raw)
                .map_err(|_| bad(&format!("auths.{key}.auth is not UTF-8")))?;
            let Some((user, pass)) = pair.split_once(':') else {
                return Err(bad(&format!("auths.{key}.auth is not user:password")));
            };
            return Ok(Some(Credentials::new(user, pass)));
        }
        let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).map(str::to_string);
        if let (Some(user), Some(pass)) = (field("username"), field("password")) {
            return Ok(Some(Credentials::new(user, pass)));
        }
    }
    Ok(None)
}

/// `https://index.docker.io/v1/` → `docker.io`; `http://host:5000/x` → `host:5000`.
fn canonical_host(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = key.split('/').next().unwrap_or(key).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_entries_are_matched_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let b64 = base64::engine::general_purpose::STANDARD;
        let doc = serde_json::json!({"auths": {
            "https://index.docker.io/v1/": {"auth": b64.encode("hub:pw1")},
            "127.0.0.1:5000": {"auth": b64.encode("me:p:w")},
            "http://reg.example:8080/v2/": {"username": "u", "password": "p"},
            "token.example": {"identitytoken": "x"}
        }});
        std::fs::write(&path, doc.to_string()).unwrap();
        let get = |r: &str| from_docker_config(&path, r).unwrap();
        assert_eq!(get("index.docker.io"), Some(Credentials::new("hub", "pw1")));
        assert_eq!(get("127.0.0.1:5000"), Some(Credentials::new("me", "p:w")));
        assert_eq!(get("reg.example:8080"), Some(Credentials::new("u", "p")));
        assert_eq!(get("token.example"), None);
        assert_eq!(get("127.0.0.1:5001"), None);
        assert_eq!(
            from_docker_config(&dir.path().join("none"), "x").unwrap(),
            None
        );
    }

    #[test]
    fn malformed_config_errors_do_not_leak_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, r#"{"auths":{"h":{"auth":"!!secret!!"}}}"#).unwrap();
        let msg = from_docker_config(&path, "h").unwrap_err().to_string();
        assert!(msg.contains("not base64"), "{msg}");
        assert!(!msg.contains("secret"), "{msg}");
    }

    #[test]
    fn scrub_and_debug_hide_the_password() {
        let c = Credentials::new("alice", "hunter22");
        assert!(!format!("{c:?}").contains("hunter22"));
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:hunter22");
        let scrubbed = c.scrub(&format!("bad password hunter22 in {b64}"));
        assert!(
            !scrubbed.contains("hunter22") && !scrubbed.contains(&b64),
            "{scrubbed}"
        );
    }
}
