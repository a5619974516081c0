//! The OCI client's integration tests against real registries: one test binary with a module
//! per area. Run one area with `cargo test --release -p voidbox-oci --test oci -- pull::`.

use std::process::Command;

mod auth;
mod hostile;
mod pull;

/// For a test that sets process-wide state (environment variables) that the other tests of
/// this binary read: in the test run, re-runs the test `name` (its path, `module::test`) alone
/// in a fresh process of this binary, fails with that run's output unless it passed, and
/// returns `false`; in that fresh process, returns `true` (go on with the test).
fn in_own_process(name: &str) -> bool {
    const VAR: &str = "VOIDBOX_TEST_OWN_PROCESS";
    if std::env::var(VAR).as_deref() == Ok(name) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(&exe)
        .args([name, "--exact", "--test-threads", "1", "--nocapture"])
        .env(VAR, name)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in its own process: {}\n{stdout}\n{stderr}",
        out.status
    );
    false
}
