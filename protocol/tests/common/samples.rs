//! One representative message of every type (shared by tests and the corpus generator).
#![allow(dead_code)]

use voidbox_protocol::*;

/// A representative instance of every [`MessageType`], in type-byte order.
pub fn samples() -> Vec<Message> {
    let secret = SessionSecret::from_bytes([0x5a; 32]);
    let policy = GuestPolicy {
        allowlist: Some(vec!["sh".into(), "/usr/bin/python3".into()]),
        rlimits: ResourceLimits {
            nofile: Some(1024),
            nproc: Some(256),
            fsize_mb: Some(1024),
            address_space_mb: None,
        },
        default_timeout_secs: Some(30),
        max_timeout_secs: Some(600),
        max_output_bytes: Some(64 << 20),
        max_concurrent_execs: Some(16),
        allow_pty: Some(true),
    };
    let info = GuestInfo {
        agent_version: "0.1.0".into(),
        kernel: Some("6.1.0".into()),
        arch: Some("x86_64".into()),
        cpus: Some(2),
        mem_total_kb: Some(512 * 1024),
        capabilities: vec!["pty".into(), "telemetry".into()],
    };
    let env = vec![
        ("PATH".to_string(), "/usr/bin:/bin".to_string()),
        ("API_TOKEN".to_string(), "hunter2".to_string()),
    ];
    vec![
        Message::Ping(Ping::new(secret, Some(policy))),
        Message::Pong(Pong::new(RequestId(0), info)),
        Message::Shutdown(Shutdown {
            id: RequestId(1),
            action: ShutdownAction::PowerOff,
        }),
        Message::Ack(Ack { id: RequestId(2) }),
        Message::error(
            RequestId(3),
            ErrorCode::NotAllowed,
            "program not in allowlist",
        ),
        Message::Rekey(Rekey {
            id: RequestId(11),
            secret: SessionSecret::from_bytes([0xa5; 32]),
            unix_time_ns: 1_700_000_000_123_456_789,
            entropy: Zeroizing::new((0..64).collect()),
        }),
        Message::ExecRequest(ExecRequest {
            id: RequestId(4),
            program: "sh".into(),
            args: vec!["-c".into(), "echo hi; echo err >&2".into()],
            env: env.clone(),
            workdir: Some("/workspace".into()),
            stdin: b"input\n".to_vec(),
            stdin_stream: true,
            timeout_secs: Some(10),
            hold: None,
        }),
        Message::ExecOutputChunk(ExecOutputChunk {
            id: RequestId(4),
            stream: OutputStream::Stdout,
            seq: 0,
            data: b"hi\n".to_vec(),
        }),
        Message::ExecResponse(ExecResponse {
            id: RequestId(4),
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            duration_ms: 12,
            error: None,
            stdout_bytes: 3,
            stderr_bytes: 4,
            output_truncated: false,
        }),
        Message::ExecStdin(ExecStdin {
            id: RequestId(4),
            eof: true,
            data: b"more\n".to_vec(),
        }),
        Message::ExecSignal(ExecSignal {
            id: RequestId(4),
            signal: 15,
        }),
        Message::ExecAttach(ExecAttach {
            id: RequestId(12),
            name: "claude".into(),
            stdin: b"{\"type\":\"user\"}\n".to_vec(),
            stdin_stream: true,
            timeout_secs: Some(600),
        }),
        Message::HeldQuery(HeldQuery {
            id: RequestId(13),
            name: "claude".into(),
        }),
        Message::HeldInfo(HeldInfo {
            id: RequestId(13),
            pid: 321,
            cpu_ms: 1520,
            running_threads: 0,
            exited: false,
            buffered_bytes: 17,
        }),
        Message::WriteFile(WriteFile {
            id: RequestId(5),
            path: "/workspace/a.txt".into(),
            mode: Some(0o644),
            contents: b"hello".to_vec(),
            more: true,
            create_parents: true,
        }),
        Message::FileChunk(FileChunk {
            id: RequestId(5),
            offset: 5,
            last: true,
            data: b" world".to_vec(),
        }),
        Message::ReadFile(ReadFile {
            id: RequestId(6),
            path: "/workspace/a.txt".into(),
            offset: 0,
            max_len: Some(1 << 20),
            chunk_size: Some(65536),
            complete: true,
        }),
        Message::MkdirP(MkdirP {
            id: RequestId(7),
            path: "/workspace/x/y".into(),
            mode: Some(0o755),
        }),
        Message::FileStat(FileStat {
            id: RequestId(8),
            path: "/workspace/a.txt".into(),
        }),
        Message::FileStatResponse(FileStatResponse {
            id: RequestId(8),
            kind: FileKind::File,
            size: 11,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            mtime_secs: 1_700_000_000,
        }),
        Message::ListDir(ListDir {
            id: RequestId(8),
            path: "/workspace/out".into(),
        }),
        Message::DirListing(DirListing {
            id: RequestId(8),
            entries: vec![DirEntry {
                name: "a.txt".into(),
                kind: FileKind::File,
                size: 11,
            }],
            truncated: false,
        }),
        Message::MountShare(MountShare {
            id: RequestId(9),
            slot: 1,
            path: "/workspace/src".into(),
            read_only: true,
        }),
        Message::PtyOpen(PtyOpen {
            id: RequestId(9),
            program: "/bin/sh".into(),
            args: vec![],
            env,
            workdir: None,
            rows: 24,
            cols: 80,
            timeout_secs: None,
        }),
        Message::PtyData(PtyData {
            id: RequestId(9),
            data: b"ls\r".to_vec(),
        }),
        Message::PtyResize(PtyResize {
            id: RequestId(9),
            rows: 50,
            cols: 132,
        }),
        Message::PtyClose(PtyClose { id: RequestId(9) }),
        Message::TelemetryRequest(TelemetryRequest { id: RequestId(10) }),
        Message::Telemetry(Telemetry {
            id: RequestId(10),
            uptime_ms: 1234,
            cpu_user_ms: 10,
            cpu_system_ms: 5,
            cpu_idle_ms: 1000,
            mem_total_kb: 524288,
            mem_available_kb: 400000,
            load_avg_milli: [100, 50, 10],
            processes: 12,
            active_execs: 1,
        }),
        Message::ProbePorts(ProbePorts {
            id: RequestId(11),
            ports: vec![8080, 5432],
            addr: Some(std::net::Ipv4Addr::new(10, 0, 2, 15)),
        }),
        Message::PortsOpen(PortsOpen {
            id: RequestId(11),
            open: vec![8080],
        }),
    ]
}

/// The sample of message type `t`.
pub fn sample(t: MessageType) -> Message {
    samples()
        .into_iter()
        .find(|m| m.message_type() == t)
        .expect("every type has a sample")
}
