//! A token server for distribution 2.8's `auth.token` mode.
//!
//! Clients send `GET /token?service=S&scope=repository:NAME:pull,push` with HTTP basic
//! credentials; valid ones get `{"token": JWT}`. The JWT is ES256-signed with a key whose
//! self-signed certificate is the registry's `rootcertbundle`, and carries that certificate in
//! its `x5c` header; claims: `iss`, `sub`, `aud` (= service), `exp`, `nbf`, `iat`, `jti` and
//! `access` (`[{type, name, actions}]`). Bad or missing credentials get 401.

use super::{herr, Result};
use base64::Engine as _;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Service name the registry and the token server agree on.
pub(crate) const SERVICE: &str = "voidbox-test-registry";
/// Token issuer name.
pub(crate) const ISSUER: &str = "voidbox-test-issuer";

/// A running token server; stopped on drop.
pub(crate) struct TokenServer {
    addr: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// PEM of the signing certificate (the registry's `rootcertbundle`).
    pub cert_pem: String,
    /// Tokens issued so far.
    pub issued: Arc<AtomicU64>,
}

struct Signer {
    key: EcdsaKeyPair,
    cert_der: Vec<u8>,
    rng: SystemRandom,
    user: String,
    password: String,
    issued: Arc<AtomicU64>,
}

impl TokenServer {
    /// Starts a token server accepting `user`/`password`.
    pub(crate) fn start(user: &str, password: &str) -> Result<TokenServer> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| herr!("generating an ECDSA key"))?;
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|_| herr!("loading the ECDSA key"))?;
        let rc_key =
            rcgen::KeyPair::try_from(pkcs8.as_ref()).map_err(|e| herr!("rcgen key: {e}"))?;
        let params = rcgen::CertificateParams::new(vec![ISSUER.to_string()])
            .map_err(|e| herr!("certificate params: {e}"))?;
        let cert = params
            .self_signed(&rc_key)
            .map_err(|e| herr!("self-signing: {e}"))?;
        let issued = Arc::new(AtomicU64::new(0));
        let signer = Arc::new(Signer {
            key,
            cert_der: cert.der().to_vec(),
            rng,
            user: user.to_string(),
            password: password.to_string(),
            issued: issued.clone(),
        });
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_c = stop.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop_c.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let signer = signer.clone();
                    std::thread::spawn(move || {
                        let _ = serve(conn, &signer);
                    });
                }
            }
        });
        Ok(TokenServer {
            addr,
            stop,
            thread: Some(thread),
            cert_pem: cert.pem(),
            issued,
        })
    }

    /// The realm URL to put in the registry config.
    pub(crate) fn realm(&self) -> String {
        format!("http://{}/token", self.addr)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, signer: &Signer) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut authorization = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("authorization") {
                authorization = Some(v.trim().to_string());
            }
        }
    }
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
    let mut scopes = Vec::new();
    for pair in query.split('&') {
        if let Some(v) = pair.strip_prefix("scope=") {
            scopes.push(percent_decode(v));
        }
    }
    let (status, body) = match check_basic(authorization.as_deref(), signer) {
        false => (
            "401 Unauthorized",
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#.to_string(),
        ),
        true => match make_jwt(signer, &scopes) {
            Ok(jwt) => {
                signer.issued.fetch_add(1, Ordering::SeqCst);
                (
                    "200 OK",
                    serde_json::json!({"token": jwt, "access_token": jwt, "expires_in": 300})
                        .to_string(),
                )
            }
            Err(e) => (
                "500 Internal Server Error",
                format!("{{\"error\":\"{e}\"}}"),
            ),
        },
    };
    let mut conn = conn;
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

fn check_basic(header: Option<&str>, signer: &Signer) -> bool {
    let Some(b64) = header.and_then(|h| h.strip_prefix("Basic ")) else {
        return false;
    };
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
        return false;
    };
    raw == format!("{}:{}", signer.user, signer.password).as_bytes()
}

/// `repository:NAME:pull,push` scopes → the `access` claim (all requested actions granted).
fn access(scopes: &[String]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = scopes
        .iter()
        .flat_map(|s| s.split(' '))
        .filter_map(|s| {
            let mut parts = s.splitn(3, ':');
            let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({
                "type": kind,
                "name": name,
                "actions": actions.split(',').collect::<Vec<_>>(),
            }))
        })
        .collect();
    serde_json::Value::Array(entries)
}

fn make_jwt(signer: &Signer, scopes: &[String]) -> std::result::Result<String, String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let std_b64 = base64::engine::general_purpose::STANDARD;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let header = serde_json::json!({
        "typ": "JWT",
        "alg": "ES256",
        "x5c": [std_b64.encode(&signer.cert_der)],
    });
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": signer.user,
        "aud": SERVICE,
        "exp": now + 600,
        "nbf": now - 60,
        "iat": now - 60,
        "jti": format!("{now}-{}", signer.issued.load(Ordering::SeqCst)),
        "access": access(scopes),
    });
    let input = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let sig = signer
        .key
        .sign(&signer.rng, input.as_bytes())
        .map_err(|_| "signing failed".to_string())?;
    Ok(format!("{input}.{}", b64.encode(sig.as_ref())))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
