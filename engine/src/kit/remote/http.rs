//! Fetching a repository tarball from the GitHub API: the client, the download (bounded)
//! and what a failure says.

use std::fs::File;
use std::io::Write;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION};

use crate::error_chain::error_chain;

use super::*;

/// An HTTP client for the GitHub API (rustls, ring provider).
pub(super) fn client() -> Result<reqwest::Client, String> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        ACCEPT,
        HeaderValue::from_static("application/vnd.github+json"),
    );
    headers.insert(
        "X-GitHub-Api-Version",
        HeaderValue::from_static("2022-11-28"),
    );
    // Redirects (to codeload) keep to https (http only on loopback); reqwest drops the
    // Authorization header when the host changes.
    let policy = reqwest::redirect::Policy::custom(|a| {
        if a.previous().len() >= 10 {
            a.error("more than 10 redirects")
        } else if !allowed_url(a.url()) {
            let to = format!(
                "{}://{}",
                a.url().scheme(),
                a.url().host_str().unwrap_or("")
            );
            a.error(format!("refusing a redirect to {to}"))
        } else {
            a.follow()
        }
    });
    reqwest::Client::builder()
        .user_agent(concat!("voidbox/", env!("CARGO_PKG_VERSION")))
        .default_headers(headers)
        .redirect(policy)
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(60))
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| format!("HTTP client: {}", error_chain(&e)))
}

/// Why sending to `base` failed.
pub(super) fn send_error(base: &str, e: reqwest::Error) -> String {
    let (connect, timeout) = (e.is_connect(), e.is_timeout());
    let why = error_chain(&e.without_url());
    if connect {
        format!("offline: could not reach {base}: {why}")
    } else if timeout {
        format!("timed out talking to {base}: {why}")
    } else {
        format!("fetching from {base}: {why}")
    }
}

/// The reason for an HTTP error `status` answering `url`.
pub(super) fn status_error(
    status: u16,
    r: &RemoteRef,
    url: &str,
    rate_remaining: Option<&str>,
    has_token: bool,
) -> String {
    let token_hint = if has_token {
        format!("check the token in {TOKEN_ENV} or {GITHUB_TOKEN_ENV}")
    } else {
        format!("set {GITHUB_TOKEN_ENV} (or {TOKEN_ENV}) to a GitHub token")
    };
    match status {
        404 => {
            let private = if has_token {
                String::new()
            } else {
                format!("; a private repository needs a token: {token_hint}")
            };
            format!(
                "{}/{} (or ref `{}`) not found: {url} answered HTTP 404{private}",
                r.owner,
                r.repo,
                r.reference_or_head()
            )
        }
        401 => format!("GitHub refused the token: {url} answered HTTP 401; {token_hint}"),
        403 | 429 if status == 429 || rate_remaining == Some("0") => format!(
            "GitHub's API rate limit is exhausted: {url} answered HTTP {status}; {}",
            if has_token {
                "wait for the limit to reset".to_string()
            } else {
                format!("unauthenticated requests are limited to 60 an hour: {token_hint}")
            }
        ),
        403 => format!(
            "access denied: {url} answered HTTP 403 (the API rate limit may be exhausted, or the repository needs a token); {token_hint}"
        ),
        s => format!("{url} answered HTTP {s}"),
    }
}

/// Downloads `url` into `out`, at most [`MAX_TARBALL_BYTES`].
pub(super) fn download(
    source: &RemoteSource,
    r: &RemoteRef,
    url: &str,
    out: &mut File,
) -> Result<(), String> {
    let client = client()?;
    let mut req = client.get(url);
    if let Some(t) = &source.token {
        let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
            .map_err(|_| "the GitHub token is not a valid HTTP header value".to_string())?;
        v.set_sensitive(true);
        req = req.header(AUTHORIZATION, v);
    }
    let fut = async {
        let mut resp = req.send().await.map_err(|e| send_error(&source.base, e))?;
        let status = resp.status();
        if !status.is_success() {
            let remaining = resp
                .headers()
                .get("x-ratelimit-remaining")
                .and_then(|v| v.to_str().ok());
            return Err(status_error(
                status.as_u16(),
                r,
                url,
                remaining,
                source.token.is_some(),
            ));
        }
        if let Some(n) = resp.content_length().filter(|n| *n > MAX_TARBALL_BYTES) {
            return Err(format!(
                "the tarball is {n} bytes, more than the {MAX_TARBALL_BYTES} accepted"
            ));
        }
        let mut total = 0u64;
        loop {
            let chunk = resp.chunk().await.map_err(|e| {
                format!(
                    "reading the tarball after {total} bytes: {}",
                    error_chain(&e.without_url())
                )
            })?;
            let Some(chunk) = chunk else { break };
            total += chunk.len() as u64;
            if total > MAX_TARBALL_BYTES {
                return Err(format!(
                    "the tarball is more than the {MAX_TARBALL_BYTES} bytes accepted"
                ));
            }
            out.write_all(&chunk)
                .map_err(|e| format!("writing the tarball: {e}"))?;
        }
        out.flush().map_err(|e| format!("writing the tarball: {e}"))
    };
    crate::oci::block_on(fut).map_err(|e| e.to_string())?
}
