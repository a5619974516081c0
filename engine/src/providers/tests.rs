//! Provider resolution against real files (the Claude Code login) and an explicit
//! environment.

use std::collections::HashMap;

use super::*;

fn llm(provider: Provider) -> Llm {
    Llm {
        provider,
        model: None,
        base_url: None,
        api_key_env: None,
        credential_proxy: false,
    }
}

fn env_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn resolve_with(l: &Llm, pairs: &[(&str, &str)]) -> Result<Endpoint, ProviderError> {
    let env = env_of(pairs);
    resolve(l, &|k| env.get(k).cloned())
}

const KEY: &str = "sk-ant-api03-SECRETSECRETSECRET";

/// A Claude Code credentials file in a fresh directory.
fn login_dir(json: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(".credentials.json"), json).expect("write");
    dir
}

fn far_future_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        + 3_600_000
}

#[test]
fn claude_uses_the_api_key_as_x_api_key() {
    let e = resolve_with(&llm(Provider::Claude), &[("ANTHROPIC_API_KEY", KEY)]).unwrap();
    assert_eq!(e.runtime, Runtime::ClaudeCode);
    assert_eq!(
        e.upstream.as_ref().map(Url::as_str),
        Some("https://api.anthropic.com/")
    );
    assert_eq!(e.guest_path(), "");
    assert_eq!(e.credential, Some(Credential::ApiKey(Secret::new(KEY))));
    assert!(!e.local);

    let mut l = llm(Provider::Claude);
    l.api_key_env = Some("MY_KEY".into());
    l.model = Some("claude-sonnet-4-5".into());
    let e = resolve_with(&l, &[("MY_KEY", " k2 \n"), ("ANTHROPIC_API_KEY", KEY)]).unwrap();
    assert_eq!(e.credential, Some(Credential::ApiKey(Secret::new("k2"))));
    assert_eq!(e.model.as_deref(), Some("claude-sonnet-4-5"));
}

#[test]
fn missing_keys_are_errors_that_name_the_variable() {
    let err = resolve_with(&llm(Provider::Claude), &[]).unwrap_err();
    assert!(matches!(err, ProviderError::KeyRequired { .. }), "{err:?}");
    assert!(err.to_string().contains("ANTHROPIC_API_KEY"), "{err}");
    let err = resolve_with(&llm(Provider::Codex), &[("OPENAI_API_KEY", "")]).unwrap_err();
    assert!(err.to_string().contains("OPENAI_API_KEY"), "{err}");

    let mut l = llm(Provider::Claude);
    l.api_key_env = Some("TEAM_KEY".into());
    let err = resolve_with(&l, &[("ANTHROPIC_API_KEY", KEY)]).unwrap_err();
    assert_eq!(
        err,
        ProviderError::KeyVarUnset {
            field: "llm.api_key_env",
            var: "TEAM_KEY".into()
        }
    );
    assert!(err.to_string().contains("llm.api_key_env names `TEAM_KEY`"));
    // Even for a loopback endpoint, a named variable must exist.
    let mut l = llm(Provider::Ollama);
    l.api_key_env = Some("OLLAMA_KEY".into());
    assert!(matches!(
        resolve_with(&l, &[]),
        Err(ProviderError::KeyVarUnset { .. })
    ));
    let err = resolve_with(&l, &[("OLLAMA_KEY", "bad\u{7}key")]).unwrap_err();
    assert!(matches!(err, ProviderError::KeyInvalid { .. }));
    assert!(!err.to_string().contains("bad"), "{err}");
}

#[test]
fn codex_uses_the_responses_api_root_and_a_bearer_key() {
    let e = resolve_with(&llm(Provider::Codex), &[("OPENAI_API_KEY", "sk-proj-X")]).unwrap();
    assert_eq!(e.runtime, Runtime::Codex);
    assert_eq!(
        e.upstream.as_ref().map(Url::as_str),
        Some("https://api.openai.com/v1")
    );
    assert_eq!(e.guest_path(), "/v1");
    assert_eq!(
        e.credential,
        Some(Credential::Bearer(Secret::new("sk-proj-X")))
    );
}

#[test]
fn local_providers_need_no_key() {
    for (p, url) in [
        (Provider::Ollama, "http://127.0.0.1:11434/"),
        (Provider::LmStudio, "http://127.0.0.1:1234/"),
    ] {
        let e = resolve_with(&llm(p), &[]).unwrap();
        assert_eq!(e.runtime, Runtime::ClaudeCode, "{p:?}");
        assert_eq!(e.upstream.as_ref().map(Url::as_str), Some(url));
        assert_eq!(e.credential, None);
        assert!(e.local);
    }
    // A local server with a key sends it as a bearer token.
    let mut l = llm(Provider::LmStudio);
    l.api_key_env = Some("LM_KEY".into());
    let e = resolve_with(&l, &[("LM_KEY", "lm")]).unwrap();
    assert_eq!(e.credential, Some(Credential::Bearer(Secret::new("lm"))));
    // claude and codex against a local endpoint: the default key is optional.
    let mut l = llm(Provider::Claude);
    l.base_url = Some("http://localhost:8080".into());
    let e = resolve_with(&l, &[]).unwrap();
    assert!(e.local && e.credential.is_none());
    let mut l = llm(Provider::Codex);
    l.base_url = Some("http://[::1]:9000/v1/".into());
    let e = resolve_with(&l, &[]).unwrap();
    assert!(e.local);
    assert_eq!(e.guest_path(), "/v1");
}

#[test]
fn custom_needs_a_base_url_and_a_key_when_remote() {
    assert_eq!(
        resolve_with(&llm(Provider::Custom), &[]),
        Err(ProviderError::MissingBaseUrl)
    );
    let mut l = llm(Provider::Custom);
    l.base_url = Some("https://llm.example.com/anthropic".into());
    let err = resolve_with(&l, &[]).unwrap_err();
    assert!(matches!(err, ProviderError::KeyRequired { .. }), "{err:?}");
    l.api_key_env = Some("GW_KEY".into());
    let e = resolve_with(&l, &[("GW_KEY", "gw")]).unwrap();
    assert_eq!(e.runtime, Runtime::ClaudeCode);
    assert_eq!(e.credential, Some(Credential::ApiKey(Secret::new("gw"))));
    assert_eq!(e.guest_path(), "/anthropic");
    l.base_url = Some("http://127.0.0.2:7000".into());
    l.api_key_env = None;
    let e = resolve_with(&l, &[]).unwrap();
    assert!(e.local && e.credential.is_none());
}

#[test]
fn urls_must_be_https_or_loopback_http() {
    let mut l = llm(Provider::Custom);
    l.api_key_env = Some("K".into());
    let env = [("K", "k")];
    for (url, needle) in [
        (
            "http://llm.example.com",
            "plain http is allowed only to a loopback host",
        ),
        ("http://10.0.2.2:11434", "plain http"),
        ("http://192.168.1.5:1234", "plain http"),
        ("ftp://127.0.0.1/", "scheme"),
        (
            "https://user:hunter2@llm.example.com",
            "credentials in the URL",
        ),
        ("https://llm.example.com/v1?key=1", "query"),
        ("not a url", "llm.base_url"),
    ] {
        l.base_url = Some(url.into());
        let err = resolve_with(&l, &env).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(needle), "{url}: {text}");
        assert!(text.contains("llm.base_url"), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
    l.base_url = Some("https://llm.example.com".into());
    assert!(resolve_with(&l, &env).is_ok());
}

#[test]
fn overrides_replace_one_field_each() {
    let mut l = llm(Provider::Mock);
    l.model = Some("spec-model".into());
    let e = resolve_with(
        &l,
        &[
            ("VOIDBOX_LLM_PROVIDER", "custom"),
            ("VOIDBOX_LLM_MODEL", "qwen3"),
            ("VOIDBOX_LLM_BASE_URL", "https://gw.example.com/anthropic"),
            ("VOIDBOX_LLM_API_KEY_ENV", "GW"),
            ("GW", "gw-key"),
        ],
    )
    .unwrap();
    assert_eq!(e.provider, Provider::Custom);
    assert_eq!(e.model.as_deref(), Some("qwen3"));
    assert_eq!(
        e.upstream.as_ref().map(Url::as_str),
        Some("https://gw.example.com/anthropic")
    );
    assert_eq!(
        e.credential,
        Some(Credential::ApiKey(Secret::new("gw-key")))
    );

    // Empty overrides are unset.
    let e = resolve_with(
        &l,
        &[("VOIDBOX_LLM_PROVIDER", ""), ("VOIDBOX_LLM_MODEL", "")],
    )
    .unwrap();
    assert_eq!(
        (e.runtime, e.model.as_deref()),
        (Runtime::Mock, Some("spec-model"))
    );

    let err = resolve_with(&l, &[("VOIDBOX_LLM_PROVIDER", "gpt")]).unwrap_err();
    assert!(
        err.to_string().contains("VOIDBOX_LLM_PROVIDER=`gpt`"),
        "{err}"
    );
    assert!(err.to_string().contains("lm-studio"), "{err}");

    let err = resolve_with(
        &llm(Provider::Ollama),
        &[("VOIDBOX_LLM_BASE_URL", "http://example.com:11434")],
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("VOIDBOX_LLM_BASE_URL"), "{err}");

    let err = resolve_with(
        &llm(Provider::Codex),
        &[("VOIDBOX_LLM_API_KEY_ENV", "NOPE"), ("OPENAI_API_KEY", "x")],
    )
    .unwrap_err();
    assert_eq!(
        err,
        ProviderError::KeyVarUnset {
            field: "VOIDBOX_LLM_API_KEY_ENV",
            var: "NOPE".into()
        }
    );
}

#[test]
fn mock_has_no_endpoint() {
    let e = resolve_with(&llm(Provider::Mock), &[]).unwrap();
    assert_eq!(e.runtime, Runtime::Mock);
    assert!(e.upstream.is_none() && e.credential.is_none() && e.local);
}

#[test]
fn claude_personal_reads_the_host_login() {
    let token = "sk-ant-oat01-LOGINTOKEN";
    let json = format!(
        r#"{{"claudeAiOauth":{{"accessToken":"{token}","refreshToken":"sk-ant-ort01-R","expiresAt":{},"scopes":["user:inference"],"subscriptionType":"max"}}}}"#,
        far_future_ms()
    );
    let dir = login_dir(&json);
    let path = dir.path().to_str().unwrap();
    let e = resolve_with(
        &llm(Provider::ClaudePersonal),
        &[("CLAUDE_CONFIG_DIR", path)],
    )
    .unwrap();
    assert_eq!(e.runtime, Runtime::ClaudeCode);
    assert_eq!(
        e.credential,
        Some(Credential::ClaudeLogin(Secret::new(token)))
    );

    // ~/.claude/.credentials.json when CLAUDE_CONFIG_DIR is not set.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".claude")).unwrap();
    std::fs::write(home.path().join(".claude/.credentials.json"), &json).unwrap();
    let e = resolve_with(
        &llm(Provider::ClaudePersonal),
        &[("HOME", home.path().to_str().unwrap())],
    )
    .unwrap();
    assert_eq!(
        e.credential,
        Some(Credential::ClaudeLogin(Secret::new(token)))
    );
}

#[test]
fn claude_personal_without_a_usable_login_is_an_error() {
    let p = llm(Provider::ClaudePersonal);
    let empty = tempfile::tempdir().unwrap();
    let err = resolve_with(&p, &[("HOME", empty.path().to_str().unwrap())]).unwrap_err();
    assert!(matches!(err, ProviderError::LoginMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(
        err.to_string().contains("run `claude` on the host"),
        "{err}"
    );

    let secret = "sk-ant-oat01-SHOULDNOTLEAK";
    for (json, needle) in [
        (format!("{{\"accessToken\":\"{secret}\""), "not valid JSON"),
        (
            format!("{{\"other\":{{\"accessToken\":\"{secret}\"}}}}"),
            "claudeAiOauth.accessToken",
        ),
        (
            r#"{"claudeAiOauth":{"accessToken":""}}"#.to_string(),
            "claudeAiOauth.accessToken",
        ),
        (
            format!(r#"{{"claudeAiOauth":{{"accessToken":"{secret}","expiresAt":1000}}}}"#),
            "has expired",
        ),
    ] {
        let dir = login_dir(&json);
        let err =
            resolve_with(&p, &[("CLAUDE_CONFIG_DIR", dir.path().to_str().unwrap())]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(needle), "{json}: {text}");
        assert!(!text.contains(secret) && !format!("{err:?}").contains(secret));
    }
    let err = resolve_with(&p, &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("neither CLAUDE_CONFIG_DIR nor HOME"),
        "{err}"
    );
}

#[test]
fn secrets_are_redacted_in_debug_and_display() {
    let e = resolve_with(&llm(Provider::Claude), &[("ANTHROPIC_API_KEY", KEY)]).unwrap();
    let shown = format!("{e:?} {e:#?}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(shown.contains("<redacted>"));
    let c = e.credential.unwrap();
    assert_eq!(c.secret().expose(), KEY);
    assert_eq!(format!("{}", c.secret()), "<redacted>");
    assert!(!format!("{c:?}").contains(KEY));
}

#[test]
fn every_provider_resolves_or_explains() {
    let dir = login_dir(&format!(
        r#"{{"claudeAiOauth":{{"accessToken":"t","expiresAt":{}}}}}"#,
        far_future_ms()
    ));
    let env = [
        ("ANTHROPIC_API_KEY", "a"),
        ("OPENAI_API_KEY", "o"),
        ("CLAUDE_CONFIG_DIR", dir.path().to_str().unwrap()),
    ];
    for p in Provider::ALL {
        let mut l = llm(p);
        if p == Provider::Custom {
            l.base_url = Some("http://127.0.0.1:1".into());
        }
        let e = resolve_with(&l, &env).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        assert_eq!(e.provider, p);
        let want = match p {
            Provider::Codex => Runtime::Codex,
            Provider::Mock => Runtime::Mock,
            _ => Runtime::ClaudeCode,
        };
        assert_eq!(e.runtime, want, "{p:?}");
    }
}
