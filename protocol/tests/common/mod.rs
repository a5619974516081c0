//! Proptest strategies shared by the integration tests.
#![allow(dead_code)]

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use voidbox_protocol::*;

pub fn id() -> impl Strategy<Value = RequestId> {
    prop_oneof![
        Just(RequestId(0)),
        Just(RequestId(u64::MAX)),
        any::<u64>().prop_map(RequestId)
    ]
}

pub fn s() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,12}",
        any::<String>().prop_map(|s| s.chars().take(24).collect())
    ]
}

pub fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..128)
}

pub fn env() -> impl Strategy<Value = Vec<(String, String)>> {
    vec((s(), s()), 0..4)
}

pub fn secret() -> impl Strategy<Value = SessionSecret> {
    any::<[u8; 32]>().prop_map(SessionSecret::from_bytes)
}

pub fn policy() -> impl Strategy<Value = GuestPolicy> {
    (
        option::of(vec(s(), 0..4)),
        (
            option::of(any::<u64>()),
            option::of(any::<u64>()),
            option::of(any::<u64>()),
            option::of(any::<u64>()),
        ),
        (
            option::of(any::<u64>()),
            option::of(any::<u64>()),
            option::of(any::<u64>()),
        ),
        option::of(any::<u32>()),
        option::of(any::<bool>()),
    )
        .prop_map(
            |(allowlist, (nofile, nproc, fsize_mb, address_space_mb), (dt, mt, mo), mc, pty)| {
                GuestPolicy {
                    allowlist,
                    rlimits: ResourceLimits {
                        nofile,
                        nproc,
                        fsize_mb,
                        address_space_mb,
                    },
                    default_timeout_secs: dt,
                    max_timeout_secs: mt,
                    max_output_bytes: mo,
                    max_concurrent_execs: mc,
                    allow_pty: pty,
                }
            },
        )
}

pub fn info() -> impl Strategy<Value = GuestInfo> {
    (
        s(),
        option::of(s()),
        option::of(s()),
        option::of(any::<u32>()),
        option::of(any::<u64>()),
        vec(s(), 0..3),
    )
        .prop_map(
            |(agent_version, kernel, arch, cpus, mem_total_kb, capabilities)| GuestInfo {
                agent_version,
                kernel,
                arch,
                cpus,
                mem_total_kb,
                capabilities,
            },
        )
}

pub fn error_code() -> impl Strategy<Value = ErrorCode> {
    prop::sample::select(vec![
        ErrorCode::Unauthorized,
        ErrorCode::VersionMismatch,
        ErrorCode::NotAllowed,
        ErrorCode::PathDenied,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PermissionDenied,
        ErrorCode::InvalidRequest,
        ErrorCode::Malformed,
        ErrorCode::UnknownType,
        ErrorCode::TooLarge,
        ErrorCode::DuplicateId,
        ErrorCode::NoSuchRequest,
        ErrorCode::ResourceLimit,
        ErrorCode::Timeout,
        ErrorCode::Io,
        ErrorCode::Unsupported,
        ErrorCode::Internal,
        ErrorCode::Busy,
        ErrorCode::Unknown,
    ])
}

pub mod samples;

pub fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (id(), any::<u32>(), secret(), option::of(policy())).prop_map(
            |(id, version, secret, policy)| Message::Ping(Ping {
                id,
                version,
                secret,
                policy
            })
        ),
        (id(), any::<u32>(), info()).prop_map(|(id, version, info)| Message::Pong(Pong {
            id,
            version,
            info
        })),
        (id(), any::<bool>()).prop_map(|(id, r)| Message::Shutdown(Shutdown {
            id,
            action: if r {
                ShutdownAction::Reboot
            } else {
                ShutdownAction::PowerOff
            }
        })),
        id().prop_map(|id| Message::Ack(Ack { id })),
        (
            id(),
            secret(),
            any::<u64>(),
            vec(any::<u8>(), REKEY_ENTROPY_MIN..=REKEY_ENTROPY_MAX)
        )
            .prop_map(|(id, secret, unix_time_ns, entropy)| Message::Rekey(Rekey {
                id,
                secret,
                unix_time_ns,
                entropy: Zeroizing::new(entropy)
            })),
        (id(), error_code(), s()).prop_map(|(id, code, message)| Message::Error(ErrorResponse {
            id,
            code,
            message
        })),
        (
            id(),
            s(),
            vec(s(), 0..4),
            env(),
            option::of(s()),
            bytes(),
            any::<bool>(),
            option::of(any::<u64>()),
            option::of(s())
        )
            .prop_map(
                |(id, program, args, env, workdir, stdin, stdin_stream, timeout_secs, hold)| {
                    Message::ExecRequest(ExecRequest {
                        id,
                        program,
                        args,
                        env,
                        workdir,
                        stdin,
                        stdin_stream,
                        timeout_secs,
                        hold,
                    })
                }
            ),
        (id(), s(), bytes(), any::<bool>(), option::of(any::<u64>())).prop_map(
            |(id, name, stdin, stdin_stream, timeout_secs)| {
                Message::ExecAttach(ExecAttach {
                    id,
                    name,
                    stdin,
                    stdin_stream,
                    timeout_secs,
                })
            }
        ),
        (id(), s()).prop_map(|(id, name)| Message::HeldQuery(HeldQuery { id, name })),
        (
            id(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>(),
            any::<u64>()
        )
            .prop_map(
                |(id, pid, cpu_ms, running_threads, exited, buffered_bytes)| {
                    Message::HeldInfo(HeldInfo {
                        id,
                        pid,
                        cpu_ms,
                        running_threads,
                        exited,
                        buffered_bytes,
                    })
                }
            ),
        (id(), any::<bool>(), any::<u64>(), bytes()).prop_map(|(id, err, seq, data)| {
            Message::ExecOutputChunk(ExecOutputChunk {
                id,
                stream: if err {
                    OutputStream::Stderr
                } else {
                    OutputStream::Stdout
                },
                seq,
                data,
            })
        }),
        (
            id(),
            option::of(any::<i32>()),
            option::of(any::<i32>()),
            any::<bool>(),
            any::<u64>(),
            option::of(s()),
            (any::<u64>(), any::<u64>(), any::<bool>())
        )
            .prop_map(
                |(id, exit_code, signal, timed_out, duration_ms, error, (o, e, t))| {
                    Message::ExecResponse(ExecResponse {
                        id,
                        exit_code,
                        signal,
                        timed_out,
                        duration_ms,
                        error,
                        stdout_bytes: o,
                        stderr_bytes: e,
                        output_truncated: t,
                    })
                }
            ),
        (id(), any::<bool>(), bytes()).prop_map(|(id, eof, data)| Message::ExecStdin(ExecStdin {
            id,
            eof,
            data
        })),
        (id(), any::<i32>())
            .prop_map(|(id, signal)| Message::ExecSignal(ExecSignal { id, signal })),
        (
            id(),
            s(),
            option::of(any::<u32>()),
            bytes(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(id, path, mode, contents, more, create_parents)| {
                Message::WriteFile(WriteFile {
                    id,
                    path,
                    mode,
                    contents,
                    more,
                    create_parents,
                })
            }),
        (id(), any::<u64>(), any::<bool>(), bytes()).prop_map(|(id, offset, last, data)| {
            Message::FileChunk(FileChunk {
                id,
                offset,
                last,
                data,
            })
        }),
        (
            id(),
            s(),
            any::<u64>(),
            option::of(any::<u64>()),
            option::of(any::<u32>()),
            any::<bool>()
        )
            .prop_map(|(id, path, offset, max_len, chunk_size, complete)| {
                Message::ReadFile(ReadFile {
                    id,
                    path,
                    offset,
                    max_len,
                    chunk_size,
                    complete,
                })
            }),
        (id(), s(), option::of(any::<u32>()))
            .prop_map(|(id, path, mode)| Message::MkdirP(MkdirP { id, path, mode })),
        (id(), any::<u8>(), s(), any::<bool>()).prop_map(|(id, slot, path, read_only)| {
            Message::MountShare(MountShare {
                id,
                slot,
                path,
                read_only,
            })
        }),
        (id(), s()).prop_map(|(id, path)| Message::FileStat(FileStat { id, path })),
        (
            id(),
            prop::sample::select(vec![
                FileKind::File,
                FileKind::Dir,
                FileKind::Symlink,
                FileKind::Other
            ]),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<i64>()
        )
            .prop_map(|(id, kind, size, mode, uid, gid, mtime_secs)| {
                Message::FileStatResponse(FileStatResponse {
                    id,
                    kind,
                    size,
                    mode,
                    uid,
                    gid,
                    mtime_secs,
                })
            }),
        (
            id(),
            s(),
            vec(s(), 0..4),
            env(),
            option::of(s()),
            any::<u16>(),
            any::<u16>(),
            option::of(any::<u64>())
        )
            .prop_map(
                |(id, program, args, env, workdir, rows, cols, timeout_secs)| {
                    Message::PtyOpen(PtyOpen {
                        id,
                        program,
                        args,
                        env,
                        workdir,
                        rows,
                        cols,
                        timeout_secs,
                    })
                }
            ),
        (id(), bytes()).prop_map(|(id, data)| Message::PtyData(PtyData { id, data })),
        (id(), any::<u16>(), any::<u16>())
            .prop_map(|(id, rows, cols)| Message::PtyResize(PtyResize { id, rows, cols })),
        id().prop_map(|id| Message::PtyClose(PtyClose { id })),
        id().prop_map(|id| Message::TelemetryRequest(TelemetryRequest { id })),
        (
            id(),
            vec(any::<u64>(), 6),
            any::<[u32; 3]>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(id, n, load_avg_milli, processes, active_execs)| {
                Message::Telemetry(Telemetry {
                    id,
                    uptime_ms: n[0],
                    cpu_user_ms: n[1],
                    cpu_system_ms: n[2],
                    cpu_idle_ms: n[3],
                    mem_total_kb: n[4],
                    mem_available_kb: n[5],
                    load_avg_milli,
                    processes,
                    active_execs,
                })
            }),
        (id(), vec(any::<u16>(), 0..8), option::of(any::<u32>())).prop_map(|(id, ports, addr)| {
            Message::ProbePorts(ProbePorts {
                id,
                ports,
                addr: addr.map(std::net::Ipv4Addr::from),
            })
        }),
        (id(), vec(any::<u16>(), 0..8))
            .prop_map(|(id, open)| Message::PortsOpen(PortsOpen { id, open })),
    ]
}
