//! LLM providers: which agent runtime a node's `llm` block selects, the upstream endpoint as
//! the host sees it, and the host credential the gateway ([`crate::gateway`]) adds to the
//! guest's requests. Nothing here reaches the guest.
//!
//! | provider | runtime | upstream default | credential (sent upstream as) |
//! |---|---|---|---|
//! | `claude` | Claude Code | `https://api.anthropic.com` | `api_key_env`, default `ANTHROPIC_API_KEY` (`x-api-key`) |
//! | `claude-personal` | Claude Code | `https://api.anthropic.com` | the host's Claude Code login (`Authorization: Bearer`, `anthropic-beta: oauth-2025-04-20`) |
//! | `codex` | Codex | `https://api.openai.com/v1` | `api_key_env`, default `OPENAI_API_KEY` (`Authorization: Bearer`) |
//! | `ollama` | Claude Code | `http://127.0.0.1:11434` | `api_key_env` if named (`Authorization: Bearer`) |
//! | `lm-studio` | Claude Code | `http://127.0.0.1:1234` | `api_key_env` if named (`Authorization: Bearer`) |
//! | `custom` | Claude Code | `base_url` (required) | `api_key_env` if named (`x-api-key`) |
//! | `mock` | mock | none | none |
//!
//! void-box's overrides replace one field each: `VOIDBOX_LLM_PROVIDER`, `VOIDBOX_LLM_MODEL`,
//! `VOIDBOX_LLM_BASE_URL`, `VOIDBOX_LLM_API_KEY_ENV` (empty means unset).
//!
//! Rules: the upstream is `https`, or `http` to a loopback host only (127.0.0.0/8, `::1`,
//! `localhost`), with no credentials, query or fragment in the URL; a non-loopback upstream
//! needs a credential; a variable named by `api_key_env` that is unset or empty is an error
//! (a default variable is only needed for a non-loopback upstream); `claude-personal` needs
//! the login in `$CLAUDE_CONFIG_DIR/.credentials.json` or `~/.claude/.credentials.json`
//! (`claudeAiOauth.accessToken`, not expired). Errors name the field and the variable, never
//! a secret.

use std::fmt;
use std::path::{Path, PathBuf};

use url::{Host, Url};

use crate::spec::model::{Llm, Provider};

/// Override of `llm.provider`.
pub const ENV_PROVIDER: &str = "VOIDBOX_LLM_PROVIDER";
/// Override of `llm.model`.
pub const ENV_MODEL: &str = "VOIDBOX_LLM_MODEL";
/// Override of `llm.base_url`.
pub const ENV_BASE_URL: &str = "VOIDBOX_LLM_BASE_URL";
/// Override of `llm.api_key_env`.
pub const ENV_API_KEY_ENV: &str = "VOIDBOX_LLM_API_KEY_ENV";
/// The `anthropic-beta` flag Anthropic's API requires with an OAuth (Claude Code login) token.
pub const OAUTH_BETA: &str = "oauth-2025-04-20";
/// Largest Claude Code credentials file read.
const MAX_LOGIN_FILE: u64 = 1 << 20;

/// The agent runtime that runs in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    /// Claude Code (Anthropic Messages API).
    ClaudeCode,
    /// OpenAI Codex CLI (OpenAI Responses API).
    Codex,
    /// The offline mock runtime (no endpoint).
    Mock,
}

/// A secret string (an API key or a login token). `Debug` and `Display` print `<redacted>`;
/// only [`Secret::expose`] gives the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret value: for the gateway's upstream header and for redaction only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The host credential the gateway sends upstream, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// An API key sent as `x-api-key` (Anthropic style).
    ApiKey(Secret),
    /// A key sent as `Authorization: Bearer` (OpenAI style, Ollama, LM Studio).
    Bearer(Secret),
    /// The host's Claude Code login: `Authorization: Bearer` plus `anthropic-beta:`
    /// [`OAUTH_BETA`].
    ClaudeLogin(Secret),
}

impl Credential {
    /// The secret, whichever way it is sent.
    pub fn secret(&self) -> &Secret {
        match self {
            Credential::ApiKey(s) | Credential::Bearer(s) | Credential::ClaudeLogin(s) => s,
        }
    }
}

/// What a node's `llm` block resolves to on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The provider after overrides.
    pub provider: Provider,
    /// The runtime to start in the guest.
    pub runtime: Runtime,
    /// The upstream API root as the host sees it (`None` for `mock`). Its path is the prefix
    /// the guest's base URL carries too (see [`Endpoint::guest_path`]).
    pub upstream: Option<Url>,
    /// The credential the gateway adds (`None`: none needed, loopback upstream).
    pub credential: Option<Credential>,
    /// Model name for the runtime.
    pub model: Option<String>,
    /// The upstream is on loopback (a local model): its cost is reported as zero.
    pub local: bool,
}

impl Endpoint {
    /// The path of the upstream URL without a trailing `/` (`""` for a root URL, `/v1` for
    /// `https://api.openai.com/v1`). The guest's base URL is `http://GATEWAY:PORT` plus this
    /// path, so request paths map 1:1 to the upstream's.
    pub fn guest_path(&self) -> &str {
        self.upstream
            .as_ref()
            .map_or("", |u| u.path().trim_end_matches('/'))
    }
}

/// An `llm` block that cannot run on this host (the CLI exits 3 before any VM starts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// `VOIDBOX_LLM_PROVIDER` names no provider.
    #[error("{var}=`{value}` is not a provider (known: {known})")]
    UnknownProvider {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The known names.
        known: String,
    },
    /// `custom` without a base URL.
    #[error("`llm.provider: custom` needs `llm.base_url` (or {ENV_BASE_URL})")]
    MissingBaseUrl,
    /// The base URL does not parse or breaks a rule.
    #[error("{field} `{url}`: {reason}")]
    BadUrl {
        /// Where the URL came from (`llm.base_url` or the override variable).
        field: &'static str,
        /// The URL, without any user information.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A variable named by `api_key_env` is not set.
    #[error("{field} names `{var}`, which is not set or empty on the host")]
    KeyVarUnset {
        /// Where the name came from (`llm.api_key_env` or the override variable).
        field: &'static str,
        /// The variable.
        var: String,
    },
    /// A variable holds something that cannot be sent in an HTTP header.
    #[error(
        "{field}: the value of `{var}` is not a valid API key (control or non-ASCII characters)"
    )]
    KeyInvalid {
        /// Where the name came from.
        field: &'static str,
        /// The variable.
        var: String,
    },
    /// A non-loopback upstream without a credential.
    #[error("`llm.provider: {provider}` needs an API key for {upstream}: {help}")]
    KeyRequired {
        /// The provider.
        provider: &'static str,
        /// The upstream URL.
        upstream: String,
        /// What to set.
        help: String,
    },
    /// `claude-personal` and no login on this host.
    #[error("`llm.provider: claude-personal` needs the host's Claude Code login, and {path} {reason}\n  help: run `claude` on the host and log in, or use `provider: claude` with an API key")]
    LoginMissing {
        /// The credentials file looked at.
        path: String,
        /// Why it is not usable (never the file's contents).
        reason: String,
    },
    /// The login's access token has expired.
    #[error("the Claude Code login in {path} has expired\n  help: run `claude` on the host once to refresh it")]
    LoginExpired {
        /// The credentials file.
        path: String,
    },
}

/// The provider of `llm`, or of the `VOIDBOX_LLM_PROVIDER` override read through `env`.
fn provider(llm: &Llm, env: &dyn Fn(&str) -> Option<String>) -> Result<Provider, ProviderError> {
    match env(ENV_PROVIDER).filter(|v| !v.is_empty()) {
        Some(name) => Provider::ALL
            .into_iter()
            .find(|p| p.as_str() == name.trim())
            .ok_or_else(|| ProviderError::UnknownProvider {
                var: ENV_PROVIDER,
                value: name.clone(),
                known: Provider::ALL.map(Provider::as_str).join(", "),
            }),
        None => Ok(llm.provider),
    }
}

/// The runtime `llm` runs on (with the provider override read through `env`), without
/// reading any credential.
pub fn runtime_of(
    llm: &Llm,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Runtime, ProviderError> {
    Ok(match provider(llm, env)? {
        Provider::Mock => Runtime::Mock,
        Provider::Codex => Runtime::Codex,
        Provider::Claude
        | Provider::ClaudePersonal
        | Provider::Ollama
        | Provider::LmStudio
        | Provider::Custom => Runtime::ClaudeCode,
    })
}

/// The host variable holding `llm`'s API key, as [`resolve`] reads it without overrides:
/// `api_key_env`, else the default of `claude` (`ANTHROPIC_API_KEY`) and `codex`
/// (`OPENAI_API_KEY`); `None` for a provider that needs no key.
pub fn key_var(llm: &Llm) -> Option<String> {
    llm.api_key_env
        .clone()
        .or_else(|| default_key_var(llm.provider).map(str::to_string))
}

/// The variable `provider` reads its key from when `api_key_env` names none.
fn default_key_var(provider: Provider) -> Option<&'static str> {
    match provider {
        Provider::Claude => Some("ANTHROPIC_API_KEY"),
        Provider::Codex => Some("OPENAI_API_KEY"),
        _ => None,
    }
}

/// Resolves `llm` with the overrides read through `env` (the process environment in the CLI:
/// `&|k| std::env::var(k).ok()`); API keys are read through `env` too, the login from disk.
pub fn resolve(llm: &Llm, env: &dyn Fn(&str) -> Option<String>) -> Result<Endpoint, ProviderError> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    let provider = provider(llm, env)?;
    let model = var(ENV_MODEL).or_else(|| llm.model.clone());
    let base_url = match var(ENV_BASE_URL) {
        Some(u) => Some((ENV_BASE_URL, u)),
        None => llm.base_url.clone().map(|u| ("llm.base_url", u)),
    };
    let key_env = match var(ENV_API_KEY_ENV) {
        Some(k) => Some((ENV_API_KEY_ENV, k)),
        None => llm.api_key_env.clone().map(|k| ("llm.api_key_env", k)),
    };

    let (runtime, default_url) = match provider {
        Provider::Mock => {
            return Ok(Endpoint {
                provider,
                runtime: Runtime::Mock,
                upstream: None,
                credential: None,
                model,
                local: true,
            })
        }
        Provider::Claude | Provider::ClaudePersonal => {
            (Runtime::ClaudeCode, Some("https://api.anthropic.com"))
        }
        Provider::Codex => (Runtime::Codex, Some("https://api.openai.com/v1")),
        Provider::Ollama => (Runtime::ClaudeCode, Some("http://127.0.0.1:11434")),
        Provider::LmStudio => (Runtime::ClaudeCode, Some("http://127.0.0.1:1234")),
        Provider::Custom => (Runtime::ClaudeCode, None),
    };
    let (field, url) = match (base_url, default_url) {
        (Some((field, url)), _) => (field, url),
        (None, Some(url)) => ("default base URL", url.to_string()),
        (None, None) => return Err(ProviderError::MissingBaseUrl),
    };
    let (upstream, local) = upstream_url(field, &url)?;

    let named_key = |how: fn(Secret) -> Credential| -> Result<Option<Credential>, ProviderError> {
        let Some((field, name)) = &key_env else {
            return Ok(None);
        };
        match var(name) {
            Some(v) => key_value(field, name, &v).map(|s| Some(how(s))),
            None => Err(ProviderError::KeyVarUnset {
                field,
                var: name.clone(),
            }),
        }
    };
    let credential = match provider {
        Provider::ClaudePersonal => Some(Credential::ClaudeLogin(claude_login(env)?)),
        Provider::Claude | Provider::Codex => {
            let how: fn(Secret) -> Credential = if provider == Provider::Codex {
                Credential::Bearer
            } else {
                Credential::ApiKey
            };
            let default_var = default_key_var(provider).unwrap_or_default();
            match named_key(how)? {
                Some(c) => Some(c),
                None => match var(default_var) {
                    Some(v) => Some(how(key_value("default key variable", default_var, &v)?)),
                    None if local => None,
                    None => {
                        return Err(ProviderError::KeyRequired {
                            provider: provider.as_str(),
                            upstream: upstream.to_string(),
                            help: format!(
                                "set {default_var} on the host, or name another variable in `llm.api_key_env`"
                            ),
                        })
                    }
                },
            }
        }
        Provider::Ollama | Provider::LmStudio => named_key(Credential::Bearer)?,
        Provider::Custom => named_key(Credential::ApiKey)?,
        Provider::Mock => None,
    };
    if credential.is_none() && !local {
        return Err(ProviderError::KeyRequired {
            provider: provider.as_str(),
            upstream: upstream.to_string(),
            help: "a non-loopback endpoint needs a key: name the host variable holding it in `llm.api_key_env`".to_string(),
        });
    }
    Ok(Endpoint {
        provider,
        runtime,
        upstream: Some(upstream),
        credential,
        model,
        local,
    })
}

/// Parses and checks an upstream URL; returns it and whether its host is loopback.
fn upstream_url(field: &'static str, text: &str) -> Result<(Url, bool), ProviderError> {
    let bad = |url: String, reason: &str| ProviderError::BadUrl {
        field,
        url,
        reason: reason.to_string(),
    };
    let url = Url::parse(text.trim()).map_err(|e| bad(strip_userinfo(text), &e.to_string()))?;
    let shown = {
        let mut u = url.clone();
        let _ = u.set_username("");
        let _ = u.set_password(None);
        u.to_string()
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad(
            shown,
            "credentials in the URL are not allowed; name the key's host variable in `llm.api_key_env`",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad(shown, "an API root has no query or fragment"));
    }
    let local = match url.host() {
        Some(Host::Ipv4(ip)) => ip.is_loopback(),
        Some(Host::Ipv6(ip)) => ip.is_loopback(),
        Some(Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => return Err(bad(shown, "no host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if local => {}
        "http" => {
            return Err(bad(
                shown,
                "plain http is allowed only to a loopback host (127.0.0.0/8, ::1, localhost); use https",
            ))
        }
        _ => return Err(bad(shown, "the scheme must be https (or http to loopback)")),
    }
    Ok((url, local))
}

/// `text` with anything between `://` and `@` removed (for messages about unparsable URLs).
fn strip_userinfo(text: &str) -> String {
    match (text.find("://"), text.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}{}", &text[..s + 3], &text[at + 1..]),
        _ => text.to_string(),
    }
}

/// A key read from `var`, trimmed; it must be visible ASCII (it goes into an HTTP header).
fn key_value(field: &'static str, var: &str, value: &str) -> Result<Secret, ProviderError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(ProviderError::KeyVarUnset {
            field,
            var: var.to_string(),
        });
    }
    if !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ProviderError::KeyInvalid {
            field,
            var: var.to_string(),
        });
    }
    Ok(Secret::new(v))
}

/// The Claude Code credentials file: `$CLAUDE_CONFIG_DIR/.credentials.json`, else
/// `$HOME/.claude/.credentials.json`.
pub fn claude_login_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(dir) = var("CLAUDE_CONFIG_DIR") {
        return Some(Path::new(&dir).join(".credentials.json"));
    }
    var("HOME").map(|h| Path::new(&h).join(".claude").join(".credentials.json"))
}

/// The access token of the host's Claude Code login.
fn claude_login(env: &dyn Fn(&str) -> Option<String>) -> Result<Secret, ProviderError> {
    let Some(path) = claude_login_path(env) else {
        return Err(ProviderError::LoginMissing {
            path: "~/.claude/.credentials.json".to_string(),
            reason: "cannot be found: neither CLAUDE_CONFIG_DIR nor HOME is set".to_string(),
        });
    };
    let shown = path.display().to_string();
    let missing = |reason: String| ProviderError::LoginMissing {
        path: shown.clone(),
        reason,
    };
    let text = read_small(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => missing("does not exist".to_string()),
        _ => missing(format!("cannot be read: {e}")),
    })?;
    // serde_json's messages give a position, never the input.
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| missing(format!("is not valid JSON ({e})")))?;
    let oauth = json.get("claudeAiOauth");
    let token = oauth
        .and_then(|o| o.get("accessToken"))
        .and_then(|t| t.as_str())
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| missing("has no `claudeAiOauth.accessToken`".to_string()))?;
    let expires_ms = oauth
        .and_then(|o| o.get("expiresAt"))
        .and_then(serde_json::Value::as_u64);
    if let Some(ms) = expires_ms {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        if u128::from(ms) <= now_ms {
            return Err(ProviderError::LoginExpired { path: shown });
        }
    }
    key_value("claudeAiOauth.accessToken", &shown, token)
        .map_err(|_| missing("holds an access token that is not valid header text".to_string()))
}

/// Reads a file of at most [`MAX_LOGIN_FILE`] bytes.
fn read_small(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut text = String::new();
    f.take(MAX_LOGIN_FILE + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_LOGIN_FILE {
        return Err(std::io::Error::other("larger than 1 MiB"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
