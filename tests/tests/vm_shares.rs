//! Host directory shares (virtio-9p) on a real micro-VM restored from the golden snapshot:
//! the guest reads a read-only share and cannot write it (EROFS, enforced by the VMM too),
//! writes a read-write share whose files the host then sees with their content and owned by
//! the user running the VMM, and an unbound slot cannot be mounted.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use voidbox::sandbox::shares::Share;
use voidbox::sandbox::{Sandbox, SandboxError};
use voidbox::snapshot::{CreateOptions, Snapshots};
use voidbox_protocol::ErrorCode;
use voidbox_tests::vm::{guest_image, sandbox_config};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// Runs `script` with `sh -c`; returns (stdout, stderr, exit code).
fn sh(sb: &mut Sandbox, script: &str) -> (String, String, Option<i32>) {
    voidbox_tests::vm::sh(sb, script).unwrap_or_else(|e| panic!("exec {script:?}: {e}"))
}

#[test]
fn a_restored_vm_reads_a_read_only_share_and_writes_a_read_write_one() {
    let Some(image) = guest_image() else { return };
    let runtime = tempfile::tempdir().unwrap();
    let ro = tempfile::tempdir().unwrap();
    let rw = tempfile::tempdir().unwrap();
    std::fs::write(ro.path().join("hello.txt"), b"hello from the host\n").unwrap();
    // Made by this process: owned by the user who also runs the VMM.
    std::fs::write(rw.path().join("host-made"), b"").unwrap();

    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.runtime_dir = Some(runtime.path().to_path_buf());
    cfg.set_shares(vec![
        Share {
            host: ro.path().to_path_buf(),
            guest: "/workspace/ro".into(),
            read_only: true,
        },
        Share {
            host: rw.path().to_path_buf(),
            guest: "/workspace/rw".into(),
            read_only: false,
        },
    ]);
    // Restored from the golden snapshot (made by one cold boot on first use, shared with the
    // other VM tests): the share slots were probed at its boot, the binding is this VM's.
    let snapshots = Snapshots::new(
        true,
        CreateOptions {
            launcher: cfg.launcher.clone(),
            boot_timeout: cfg.boot_timeout,
            runtime_dir: cfg.runtime_dir.clone(),
        },
        PathBuf::from("."),
        Arc::new(|m: &str| eprintln!("{m}")),
    )
    .unwrap();
    let mut sb = snapshots
        .start(&cfg, None, &|| false)
        .unwrap_or_else(|e| panic!("starting the VM: {e}"));
    assert!(
        sb.timings().restore.is_some(),
        "the VM was not restored from the golden snapshot"
    );

    let script = "cat /workspace/ro/hello.txt; \
        if echo x > /workspace/ro/new 2>/tmp/err; then echo WROTE-RO; else cat /tmp/err >&2; fi; \
        printf 'written in the guest\\n' > /workspace/rw/made.txt && \
        mkdir /workspace/rw/sub && echo nested > /workspace/rw/sub/f && \
        stat -c '%u:%g' /workspace/rw/made.txt";
    let (out, err, code) = sh(&mut sb, script);
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"hello from the host"), "{out}");
    assert!(
        !out.contains("WROTE-RO"),
        "the read-only share took a write: {out}"
    );
    assert!(err.contains("Read-only file system"), "stderr: {err}");
    // The guest sees its own files as the command user's.
    assert_eq!(lines.last(), Some(&"1000:1000"), "{out}");

    // The host sees what the guest wrote, owned by the user running the VMM.
    let made = rw.path().join("made.txt");
    assert_eq!(std::fs::read(&made).unwrap(), b"written in the guest\n");
    assert_eq!(std::fs::read(rw.path().join("sub/f")).unwrap(), b"nested\n");
    let m = std::fs::metadata(&made).unwrap();
    let mine = std::fs::metadata(rw.path().join("host-made")).unwrap();
    assert_eq!((m.uid(), m.gid()), (mine.uid(), mine.gid()));
    // The read-only share is as it was.
    let names: Vec<_> = std::fs::read_dir(ro.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["hello.txt"]);

    // A slot this VM did not bind cannot be mounted; a mounted one not twice.
    match sb.mount_share(3, "/workspace/none", true) {
        Err(SandboxError::Guest { code, message, .. }) => {
            assert_eq!(code, ErrorCode::NotFound, "{message}")
        }
        other => panic!("mounting an unbound slot: {other:?}"),
    }
    match sb.mount_share(0, "/workspace/again", true) {
        Err(SandboxError::Guest { code, .. }) => assert_eq!(code, ErrorCode::AlreadyExists),
        other => panic!("mounting slot 0 twice: {other:?}"),
    }
    let exit = sb.stop();
    assert!(exit.code.is_some() || exit.signal.is_some(), "{exit}");
}

/// Runs the CLI in `dir`; returns (stdout, stderr, exit code).
fn voidbox(dir: &std::path::Path, args: &[&str]) -> (String, String, Option<i32>) {
    let out = std::process::Command::new(VOIDBOX)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("{VOIDBOX}: {e}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

/// Through the CLI: `voidbox run --mount` with the project directory over `/workspace`
/// (void-box's everyday `--mount /project:/workspace:rw`) and a read-only share, and
/// `voidbox apply` with `sandbox.mounts` — a read-only input and a read-write output
/// directory that does not exist yet (created when the node starts).
#[test]
fn run_and_apply_share_host_directories() {
    if guest_image().is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let project = d.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("in.txt"), "from-host\n").unwrap();

    let (out, err, code) = voidbox(
        d.path(),
        &[
            "run",
            "--mount",
            "project:/workspace:rw",
            "--",
            "sh",
            "-c",
            "cat /workspace/in.txt && echo from-guest > /workspace/out.txt && pwd",
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out, "from-host\n/workspace\n", "{err}");
    let made = project.join("out.txt");
    assert_eq!(std::fs::read_to_string(&made).unwrap(), "from-guest\n");
    assert_eq!(
        std::fs::metadata(&made).unwrap().uid(),
        // The owner of a directory this test process made: the user who also ran the VMM.
        std::fs::metadata(d.path()).unwrap().uid(),
        "owned by the invoking user"
    );

    let (out, err, code) = voidbox(
        d.path(),
        &[
            "run",
            "--mount",
            "project:/workspace/p:ro",
            "--",
            "sh",
            "-c",
            "echo x > /workspace/p/new",
        ],
    );
    assert_ne!(code, Some(0), "{out}{err}");
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(!project.join("new").exists());

    std::fs::write(
        d.path().join("copy.yaml"),
        "kind: pipeline\nname: copy\nsandbox:\n  mounts:\n    - {host: project, guest: /workspace/src}\n    - {host: results, guest: /workspace/results, mode: rw}\npipeline:\n  boxes:\n    - name: copy\n      run: {program: sh, args: [-c, 'cp /workspace/src/in.txt /workspace/results/copy.txt && echo 1']}\n",
    )
    .unwrap();
    let (out, err, code) = voidbox(d.path(), &["apply", "copy.yaml"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(d.path().join("results/copy.txt")).unwrap(),
        "from-host\n"
    );
}

/// Shares outside `/workspace` and `/home` — where the guest's read-only system disk cannot
/// take a mount point — at each kind of path `validate` accepts: below an existing
/// directory of the disk (`/mnt/rw`, `/opt/tools`), a new top-level directory (`/srv`) and
/// below one (`/data/in`). The VM boots with a writable root (`voidbox.root=rw`, its own
/// golden snapshot); reads and writes reach the host.
#[test]
fn shares_mount_at_every_allowed_prefix() {
    if guest_image().is_none() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    for dir in ["in", "tools"] {
        std::fs::create_dir(d.path().join(dir)).unwrap();
    }
    std::fs::write(d.path().join("in/data.txt"), "input\n").unwrap();
    std::fs::write(d.path().join("tools/tool.txt"), "tool\n").unwrap();
    std::fs::write(
        d.path().join("prefixes.yaml"),
        "kind: sandbox\nname: prefixes\nsandbox:\n  mounts:\n    - {host: in, guest: /data/in}\n    - {host: tools, guest: /opt/tools}\n    - {host: rw, guest: /mnt/rw, mode: rw}\n    - {host: srv, guest: /srv, mode: rw}\nrun:\n  program: sh\n  args: [-c, 'cat /data/in/data.txt /opt/tools/tool.txt > /mnt/rw/both.txt && echo served > /srv/s.txt && ls /opt/voidbox/runtimes && echo done']\n",
    )
    .unwrap();
    let (out, err, code) = voidbox(d.path(), &["validate", "prefixes.yaml"]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (out, err, code) = voidbox(d.path(), &["apply", "prefixes.yaml"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("done"), "{out}{err}");
    assert_eq!(
        std::fs::read_to_string(d.path().join("rw/both.txt")).unwrap(),
        "input\ntool\n"
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("srv/s.txt")).unwrap(),
        "served\n"
    );
}
