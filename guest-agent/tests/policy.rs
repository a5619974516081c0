//! The policy the engine sends every VM (allowlist + resource limits in the authenticated
//! handshake), and inputs larger than one protocol frame, against the agent as a host
//! process.

use std::time::Duration;

use crate::common::*;
use voidbox_protocol::*;

/// What the engine sends a command box running `sh` (see `engine/src/apply/policy.rs`).
fn engine_policy(allow: &[&str], limits: ResourceLimits) -> GuestPolicy {
    GuestPolicy {
        allowlist: Some(allow.iter().map(|s| s.to_string()).collect()),
        rlimits: limits,
        ..GuestPolicy::default()
    }
}

#[test]
fn handshake_policy_refuses_other_programs_with_126_and_applies_rlimits() {
    // No boot policy, as in a VM: everything comes from the handshake.
    let agent = Agent::start();
    let mut c = agent.connect_with(Some(engine_policy(
        &["sh"],
        ResourceLimits {
            nofile: Some(256),
            nproc: Some(300),
            fsize_mb: Some(1),
            address_space_mb: Some(4096),
        },
    )));
    let r = c.exec(sh("ulimit -n; cat /proc/self/limits"));
    let out = r.out();
    assert_eq!(r.resp().exit_code, Some(0), "{out}");
    assert!(out.starts_with("256\n"), "{out}");
    assert_eq!(limit_of(&out, "Max open files"), ["256", "256"]);
    assert_eq!(limit_of(&out, "Max processes"), ["300", "300"]);
    assert_eq!(limit_of(&out, "Max file size"), ["1048576", "1048576"]);
    assert_eq!(
        limit_of(&out, "Max address space"),
        ["4294967296", "4294967296"]
    );
    // Not on the list: refused before anything runs, exit 126, the message names it.
    for program in ["ls", "/bin/ls", "no-such-program-xyz"] {
        let r = c.exec(ExecRequest {
            program: program.into(),
            args: vec!["/".into()],
            ..Default::default()
        });
        let msg = refusal(&r);
        assert!(
            msg.contains(&format!("`{program}`")) && msg.contains("allowlist"),
            "{msg}"
        );
    }
    // Children of an allowed program are not filtered by the allowlist.
    let r = c.exec(sh("echo hi | tr a-z A-Z"));
    assert_eq!((r.out().as_str(), r.resp().exit_code), ("HI\n", Some(0)));
}

#[test]
fn defaults_apply_where_the_policy_sets_no_limit_and_are_not_ceilings() {
    let agent = Agent::start();
    let mut c = agent.connect_with(Some(engine_policy(&["sh"], ResourceLimits::default())));
    let out = c.exec(sh("cat /proc/self/limits")).out();
    let d = ResourceLimits::DEFAULT;
    let n = d.nofile.unwrap().to_string();
    assert_eq!(limit_of(&out, "Max open files"), [n.clone(), n]);
    let f = d.fsize_bytes().unwrap().to_string();
    assert_eq!(limit_of(&out, "Max file size"), [f.clone(), f]);
    if !is_root() {
        eprintln!("not root: raising a limit above the default is not checked");
        return;
    }
    // A limit above the default (boot parameters set none) is applied as asked.
    let mut c = agent.connect_with(Some(engine_policy(
        &["sh"],
        ResourceLimits {
            nofile: Some(4096),
            ..Default::default()
        },
    )));
    assert_eq!(c.exec(sh("ulimit -n")).out(), "4096\n");
}

#[test]
fn a_policy_the_guest_cannot_enforce_is_refused() {
    let agent = Agent::start();
    let mut s = agent.raw();
    let bad = GuestPolicy {
        allowlist: Some(vec!["bin/sh".into()]),
        ..GuestPolicy::default()
    };
    match voidbox_protocol::blocking::client_handshake(&mut s, &secret(), Some(bad)) {
        Err(ProtocolError::Remote { code, message }) => {
            assert_eq!(code, ErrorCode::InvalidRequest);
            assert!(message.contains("bin/sh"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let bad = engine_policy(
        &["sh"],
        ResourceLimits {
            nofile: Some(1),
            ..Default::default()
        },
    );
    let mut s = agent.raw();
    assert!(voidbox_protocol::blocking::client_handshake(&mut s, &secret(), Some(bad)).is_err());
}

/// Deterministic bytes that differ at every offset of a frame.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn read_back(c: &mut Client, path: &str) -> Vec<u8> {
    let id = c.id();
    c.send(&Message::ReadFile(ReadFile {
        id,
        path: path.into(),
        ..Default::default()
    }));
    let mut out = Vec::new();
    loop {
        match c.recv() {
            Message::FileChunk(ch) => {
                assert_eq!(ch.offset, out.len() as u64);
                out.extend_from_slice(&ch.data);
                if ch.last {
                    return out;
                }
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn inputs_larger_than_a_frame_arrive_whole_as_file_and_stdin() {
    // Above MAX_MESSAGE_SIZE (64 MiB): only chunked transfers can carry it.
    let size = MAX_MESSAGE_SIZE as usize + 3 * 1024 * 1024 + 17;
    let data = pattern(size);
    let agent = Agent::start();
    let mut c = agent.connect();
    c.stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    // input.json as chunked WriteFile.
    let id = c.id();
    for m in WriteFile::chunked(id, "/workspace/input.json", None, &data, FILE_CHUNK_SIZE) {
        let m = match m {
            Message::WriteFile(mut w) => {
                w.create_parents = true;
                Message::WriteFile(w)
            }
            m => m,
        };
        c.send(&m);
    }
    assert!(matches!(c.recv(), Message::Ack(a) if a.id == id));
    assert!(read_back(&mut c, "/workspace/input.json") == data);
    // stdin as ExecStdin chunks, written from another thread while output is read here.
    let id = c.id();
    c.send(&Message::ExecRequest(ExecRequest {
        id,
        stdin_stream: true,
        // The working directory is /workspace (relocated under the agent's root here).
        ..sh("cat > stdin.copy; wc -c < stdin.copy")
    }));
    let mut w = c.stream.try_clone().unwrap();
    let feed = {
        let data = data.clone();
        std::thread::spawn(move || {
            let chunks = data.chunks(256 * 1024);
            let n = chunks.len();
            for (i, chunk) in chunks.enumerate() {
                let m = Message::ExecStdin(ExecStdin {
                    id,
                    eof: i + 1 == n,
                    data: chunk.to_vec(),
                });
                voidbox_protocol::blocking::write_message(&mut w, &m).unwrap();
            }
        })
    };
    let r = c.collect_one();
    feed.join().unwrap();
    assert_eq!(r.resp().exit_code, Some(0), "{:?}", r);
    assert_eq!(r.out().trim(), size.to_string());
    assert!(read_back(&mut c, "/workspace/stdin.copy") == data);
}
