//! Authentication against real registries: htpasswd basic auth and token auth, with
//! credentials from Docker's `config.json` and from the environment.
//!
//! Credentials are read from the process environment (`DOCKER_CONFIG`, `HOME`,
//! `VOIDBOX_REGISTRY_*`), so everything here runs as one test, step by step, in a process of
//! its own: the other modules of this test binary pull too, and must not see these settings.

use base64::Engine as _;
use voidbox_oci::testing::{file_image, require_tools, Registry};
use voidbox_oci::{NoProgress, OciError, PullOptions, Store};

const USER: &str = "alice";
const PASSWORD: &str = "s3cret-Passw0rd";
const WRONG: &str = "wrong-Passw0rd-xyz";

fn set_env(docker_config: Option<&std::path::Path>, env_creds: Option<(&str, &str)>) {
    match docker_config {
        Some(d) => std::env::set_var("DOCKER_CONFIG", d),
        None => std::env::remove_var("DOCKER_CONFIG"),
    }
    match env_creds {
        Some((u, p)) => {
            std::env::set_var("VOIDBOX_REGISTRY_USERNAME", u);
            std::env::set_var("VOIDBOX_REGISTRY_PASSWORD", p);
        }
        None => {
            std::env::remove_var("VOIDBOX_REGISTRY_USERNAME");
            std::env::remove_var("VOIDBOX_REGISTRY_PASSWORD");
        }
    }
}

fn write_docker_config(dir: &std::path::Path, host: &str, user: &str, password: &str) {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let doc = serde_json::json!({"auths": {host: {"auth": auth}}});
    std::fs::write(dir.join("config.json"), doc.to_string()).unwrap();
}

fn assert_refused_without_secret(err: &OciError, secret: &str) {
    assert!(matches!(err, OciError::AuthRefused { .. }), "{err}");
    eprintln!("refused: {err}");
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains(secret), "password leaked: {shown}");
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{secret}"));
    assert!(!shown.contains(&b64), "password leaked: {shown}");
}

#[tokio::test]
async fn basic_and_token_auth_with_config_json_and_environment() {
    if !crate::in_own_process("auth::basic_and_token_auth_with_config_json_and_environment") {
        return;
    }
    require_tools().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::env::set_var("HOME", home.path());
    let docker_config = tempfile::tempdir().unwrap();
    let empty_config = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = Store::open(cache.path()).unwrap();
    let opts = PullOptions::default();

    // --- htpasswd basic auth ---
    let basic = Registry::start_with_basic_auth(USER, PASSWORD).unwrap();
    let digest = file_image(&basic, "private:v1", "/private.txt", "basic\n").unwrap();
    let reference = basic.reference("private:v1");

    set_env(Some(empty_config.path()), None);
    let err = store
        .pull(&reference, &opts, &NoProgress)
        .await
        .unwrap_err();
    assert_refused_without_secret(&err, PASSWORD);

    write_docker_config(docker_config.path(), &basic.host(), USER, WRONG);
    set_env(Some(docker_config.path()), None);
    let err = store
        .pull(&reference, &opts, &NoProgress)
        .await
        .unwrap_err();
    assert_refused_without_secret(&err, WRONG);

    write_docker_config(
        docker_config.path(),
        &format!("http://{}", basic.host()),
        USER,
        PASSWORD,
    );
    let img = store.pull(&reference, &opts, &NoProgress).await.unwrap();
    assert_eq!(img.manifest_digest, digest);

    // ~/.docker/config.json when DOCKER_CONFIG is unset.
    std::fs::create_dir_all(home.path().join(".docker")).unwrap();
    write_docker_config(&home.path().join(".docker"), &basic.host(), USER, PASSWORD);
    set_env(None, None);
    let other = file_image(&basic, "private:v2", "/private.txt", "home config\n").unwrap();
    let img = store
        .pull(&basic.reference("private:v2"), &opts, &NoProgress)
        .await
        .unwrap();
    assert_eq!(img.manifest_digest, other);

    // The environment wins over config.json.
    set_env(Some(empty_config.path()), Some((USER, PASSWORD)));
    let third = file_image(&basic, "private:v3", "/private.txt", "env\n").unwrap();
    let img = store
        .pull(&basic.reference("private:v3"), &opts, &NoProgress)
        .await
        .unwrap();
    assert_eq!(img.manifest_digest, third);
    set_env(Some(empty_config.path()), Some((USER, WRONG)));
    let err = store
        .pull(&reference, &opts, &NoProgress)
        .await
        .unwrap_err();
    assert_refused_without_secret(&err, WRONG);
    std::env::remove_var("VOIDBOX_REGISTRY_PASSWORD");
    let err = store
        .pull(&reference, &opts, &NoProgress)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Credentials(_)), "{err}");
    drop(basic);

    // --- token auth ---
    let token = Registry::start_with_token_auth(USER, PASSWORD).unwrap();
    let digest = file_image(&token, "tokened:v1", "/t.txt", "token\n").unwrap();
    let reference = token.reference("tokened:v1");
    let issued_by_push = token.tokens_issued();
    assert!(issued_by_push > 0, "skopeo pushed with a token");

    set_env(Some(empty_config.path()), None);
    let err = store
        .pull(&reference, &opts, &NoProgress)
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::AuthRefused { .. }), "{err}");

    set_env(Some(empty_config.path()), Some((USER, WRONG)));
    let err = store
        .pull(&reference, &opts, &NoProgress)
        .await
        .unwrap_err();
    assert_refused_without_secret(&err, WRONG);

    write_docker_config(docker_config.path(), &token.host(), USER, PASSWORD);
    set_env(Some(docker_config.path()), None);
    let img = store.pull(&reference, &opts, &NoProgress).await.unwrap();
    assert_eq!(img.manifest_digest, digest);
    assert!(!img.cache_hit);
    assert!(
        token.tokens_issued() > issued_by_push,
        "the pull used a bearer token"
    );
    set_env(None, None);
}
