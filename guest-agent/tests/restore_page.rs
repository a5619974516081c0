//! The restore page against the agent as a host process (`--restore-page FILE`, filled here
//! exactly as the VMM fills guest memory): the first connection after a fill is
//! authenticated under the delivered secret only, with the request pipelined behind its
//! `Ping`; the old secret is refused; a stale, torn or hostile page leaves an agent that
//! accepts no secret and says why.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::common::*;
use voidbox_protocol::blocking::read_message;
use voidbox_protocol::restore_page::{self, RestoreGrant, HEADER_LEN, LEN};
use voidbox_protocol::*;

const NOW: u64 = 1_760_000_000_000_000_000;

fn page_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("restore.page");
    std::fs::write(&p, vec![0u8; LEN]).unwrap();
    p
}

fn start(page: &Path) -> Agent {
    Agent::start_with(&[
        "--rekey",
        "secret-only",
        "--restore-page",
        page.to_str().unwrap(),
    ])
}

fn grant(secret: &SessionSecret, policy: Option<GuestPolicy>) -> RestoreGrant {
    RestoreGrant::new(secret.clone(), Zeroizing::new(vec![0x42; 64]), policy).unwrap()
}

/// Fills the armed page as the VMM does before a resume; returns the bytes written.
fn vmm_fill(page: &Path, g: &RestoreGrant) -> Vec<u8> {
    let armed = std::fs::read(page).unwrap();
    let filled = restore_page::fill(&armed, g, NOW).expect("the agent armed its page");
    overwrite(page, &filled);
    filled.to_vec()
}

/// Writes `bytes` at the start of the page file, in place (as the VMM writes guest memory).
fn overwrite(page: &Path, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(page)
        .unwrap()
        .write_all_at(bytes, 0)
        .unwrap();
}

/// One write: `Ping` under `secret`, then an exec — what the engine sends first after a
/// restore. Returns the replies: the Pong (or error) and, if served, the exec's output.
fn ping_and_exec(agent: &Agent, secret: &SessionSecret, script: &str) -> (Message, Option<String>) {
    let mut s = agent.raw();
    let mut buf = Message::Ping(Ping::new(secret.clone(), None))
        .encode()
        .unwrap();
    let mut req = sh(script);
    req.id = RequestId(1);
    buf.extend(Message::ExecRequest(req).encode().unwrap());
    // A refusing agent answers and closes without reading: the write may find it gone.
    let _ = s.write_all(&buf);
    let first = read_message(&mut s).unwrap();
    if !matches!(first, Message::Pong(_)) {
        assert!(closed_by_peer(&mut s), "refused connection left open");
        return (first, None);
    }
    let mut c = Client {
        stream: s,
        next: 2,
        pong: match &first {
            Message::Pong(p) => p.clone(),
            _ => unreachable!(),
        },
    };
    let r = c.collect_one();
    assert!(r.error.is_none(), "{:?}", r.error);
    (first, Some(r.out()))
}

fn unauthorized(m: &Message) -> String {
    match m {
        Message::Error(e) if e.code == ErrorCode::Unauthorized => e.message.clone(),
        other => panic!("expected unauthorized, got {other:?}"),
    }
}

#[test]
fn a_filled_page_replaces_the_secret_before_the_first_connection() {
    let dir = tempfile::tempdir().unwrap();
    let page = page_file(dir.path());
    let agent = start(&page);
    // Armed at start: a valid armed header, nothing else.
    let armed = std::fs::read(&page).unwrap();
    restore_page::armed_nonce(&armed).expect("armed");
    assert!(armed[HEADER_LEN..].iter().all(|b| *b == 0));
    // No restore yet: the boot secret works.
    let (pong, out) = ping_and_exec(&agent, &secret(), "echo before");
    assert!(matches!(pong, Message::Pong(_)));
    assert_eq!(out.as_deref(), Some("before\n"));

    // "Resume": the VMM fills the page. The first exchange is the exec, under the new secret.
    let new = SessionSecret::from_bytes([0x3e; 32]);
    let policy = GuestPolicy {
        allowlist: Some(vec!["sh".into(), "echo".into()]),
        ..GuestPolicy::default()
    };
    vmm_fill(&page, &grant(&new, Some(policy)));
    let (pong, out) = ping_and_exec(&agent, &new, "echo after");
    assert!(matches!(pong, Message::Pong(_)), "{pong:?}");
    assert_eq!(out.as_deref(), Some("after\n"));
    // The page was cleared and armed again: no secret left in it.
    let after = std::fs::read(&page).unwrap();
    restore_page::armed_nonce(&after).expect("re-armed");
    assert!(after[HEADER_LEN..].iter().all(|b| *b == 0));
    assert!(!after.windows(32).any(|w| w == new.as_bytes()));
    // The snapshot's secret is refused from now on; the new one keeps working.
    let (refused, _) = ping_and_exec(&agent, &secret(), "echo old");
    assert_eq!(unauthorized(&refused), "authentication failed");
    let (_, out) = ping_and_exec(&agent, &new, "echo again");
    assert_eq!(out.as_deref(), Some("again\n"));
    // The page's policy is in force: `cat` is not in its allowlist.
    let mut c = Client {
        stream: {
            let mut s = agent.raw();
            voidbox_protocol::blocking::client_handshake(&mut s, &new, None).unwrap();
            s
        },
        next: 1,
        pong: Pong::new(RequestId(0), GuestInfo::default()),
    };
    let r = c.exec(ExecRequest {
        program: "cat".into(),
        args: vec!["/dev/null".into()],
        ..Default::default()
    });
    let msg = refusal(&r);
    assert!(msg.contains("`cat`") && msg.contains("allowlist"), "{msg}");
}

#[test]
fn a_stale_page_leaves_an_agent_that_accepts_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let page = page_file(dir.path());
    let agent = start(&page);
    let new = SessionSecret::from_bytes([0x11; 32]);
    let filled = vmm_fill(&page, &grant(&new, None));
    let (pong, _) = ping_and_exec(&agent, &new, "true");
    assert!(matches!(pong, Message::Pong(_)));
    // The same page replayed (filled for the previous arming): stale.
    overwrite(&page, &filled);
    let (refused, _) = ping_and_exec(&agent, &new, "true");
    let why = unauthorized(&refused);
    assert!(
        why.contains("stale or replayed") && why.contains("accepts no secret"),
        "{why}"
    );
    // From then on nothing authenticates, and every connection is told why.
    for s in [&new, &secret()] {
        let (refused, _) = ping_and_exec(&agent, s, "true");
        assert_eq!(unauthorized(&refused), why);
    }
}

#[test]
fn a_torn_page_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let page = page_file(dir.path());
    let agent = start(&page);
    let new = SessionSecret::from_bytes([0x22; 32]);
    let mut filled = vmm_fill(&page, &grant(&new, None));
    filled[HEADER_LEN + 5] ^= 0x80;
    overwrite(&page, &filled);
    let (refused, _) = ping_and_exec(&agent, &new, "true");
    let why = unauthorized(&refused);
    assert!(why.contains("checksum mismatch"), "{why}");
    // The page was cleared: the secret the hostile page carried is not left in it.
    let after = std::fs::read(&page).unwrap();
    assert!(!after.windows(32).any(|w| w == new.as_bytes()));
}

#[test]
fn restore_page_flag_needs_rekey_and_a_whole_page() {
    let dir = tempfile::tempdir().unwrap();
    let page = page_file(dir.path());
    // The agent's refusal to start with `flags`: its stderr.
    let refused = |flags: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(agent_bin())
            .args([
                "--listen",
                "unix:/nonexistent/s",
                "--secret-hex",
                SECRET_HEX,
                "--no-drop",
            ])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(&["--restore-page".as_ref(), page.as_os_str()]);
    assert!(err.contains("--restore-page needs --rekey"), "{err}");
    let short = dir.path().join("short");
    std::fs::write(&short, [0u8; 100]).unwrap();
    let err = refused(&[
        "--rekey".as_ref(),
        "secret-only".as_ref(),
        "--restore-page".as_ref(),
        short.as_os_str(),
    ]);
    assert!(err.contains("the restore page needs 16384"), "{err}");
}
