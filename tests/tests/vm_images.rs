//! OCI images and user boot files on real micro-VMs, pulled from a real registry
//! (Debian's `docker-registry` on loopback, started by `voidbox_oci::testing`):
//! - `voidbox apply` of a pipeline whose two nodes run in two different images: the first
//!   node's output comes from a file that exists only in its image, the second runs as the
//!   image's `User` in its `WorkingDir` with its `Env`;
//! - OCI skills: a read-only skill readable and not writable at its mount, a writable one
//!   whose writes succeed (and stay in the VM), next to an image root;
//! - a node booting a user-supplied kernel and gzip initramfs (`sandbox.kernel`/`initramfs`);
//! - nodes without `run.program` run the image's `Entrypoint`/`Cmd` in its `WorkingDir`
//!   (created when missing); an image with neither is refused before any VM starts;
//! - a pull that fails (unknown tag) ends `apply` with exit 3 and the spec location before
//!   any VM starts;
//! - the guest image's own busybox: `wget -T` gives up on a host port that accepts and never
//!   answers, and reports a denied address as refused (Debian bookworm's busybox 1.35
//!   segfaulted on `-T`, before connecting, so the denial never happened).

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use voidbox::sandbox::disks::{DiskRole, ImageDisk, VmDisks};
use voidbox::sandbox::Sandbox;
use voidbox_oci::testing::{file_image, ImageBuilder, Layer, Registry};
use voidbox_tests::vm::{guest_image, sandbox_config};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `voidbox apply SPEC --output json`, temp files and logs in `home`.
fn apply(home: &Path, spec: &Path) -> Run {
    let out = Command::new(VOIDBOX)
        .arg("apply")
        .arg(spec)
        .args(["--output", "json", "--boot-timeout", "400", "--logs-dir"])
        .arg(home.join("logs"))
        .env("NO_COLOR", "1")
        .env("TMPDIR", home)
        .output()
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn nodes_run_inside_their_images() {
    if guest_image().is_none() {
        return;
    }
    let reg = Registry::start().expect("registry");
    file_image(
        &reg,
        "fixture-a:1",
        "/voidbox-fixture.txt",
        "only-in-image-a",
    )
    .unwrap();
    ImageBuilder::busybox()
        .unwrap()
        .layer(
            Layer::new()
                .file(
                    "etc/passwd",
                    "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002:app:/app:/bin/sh\n",
                    0o644,
                )
                .file("etc/group", "root:x:0:\napp:x:1002:\n", 0o644)
                .dir_owned("app", 0o755, 1001, 1002),
        )
        .unwrap()
        .env("GREETING=hello-from-b")
        .working_dir("/app")
        .user("app")
        .push(&reg, "fixture-b:1")
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let spec = home.path().join("images.yaml");
    std::fs::write(
        &spec,
        format!(
            "kind: pipeline\nname: images\npipeline:\n  boxes:\n    - name: a\n      sandbox: {{image: '{a}'}}\n      run: {{program: cat, args: [/voidbox-fixture.txt]}}\n    - name: b\n      sandbox: {{image: '{b}'}}\n      run:\n        program: sh\n        args: ['-c', 'echo \"$GREETING $(id -u):$(id -g) $(pwd) $(cat /workspace/input.json) $(test -e /opt/voidbox && echo system-root || echo image-root)\"']\n",
            a = reg.reference("fixture-a:1"),
            b = reg.reference("fixture-b:1"),
        ),
    )
    .unwrap();
    let r = apply(home.path(), &spec);
    assert_eq!(r.code, Some(0), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("JSON report");
    let out = doc["output"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string();
    assert_eq!(
        out, "hello-from-b 1001:1002 /app only-in-image-a image-root",
        "report: {doc}"
    );

    // A tag that does not exist: exit 3 with the field's location, before any VM.
    let bad = home.path().join("bad.yaml");
    std::fs::write(
        &bad,
        format!(
            "kind: sandbox\nname: s\nsandbox:\n  image: '{}'\nrun: {{program: echo}}\n",
            reg.reference("missing:1")
        ),
    )
    .unwrap();
    let r = apply(home.path(), &bad);
    assert_eq!(r.code, Some(3), "stderr:\n{}", r.stderr);
    assert!(r.stderr.contains("bad.yaml:4:"), "{}", r.stderr);
    assert!(r.stderr.contains("sandbox.image"), "{}", r.stderr);
    assert!(!home.path().join("logs").join("s.1.console.log").exists());
}

/// Image entrypoints: a node whose `run` names no program runs the image's `Entrypoint`
/// followed by `run.args` (replacing `Cmd`) or by `Cmd`, in its `WorkingDir` — created,
/// for the command user, when the image lacks it. An image with neither is refused with
/// exit 3 before any VM starts.
#[test]
fn nodes_without_a_program_run_the_image_entrypoint() {
    if guest_image().is_none() {
        return;
    }
    let reg = Registry::start().expect("registry");
    ImageBuilder::busybox()
        .unwrap()
        .entrypoint(&["/bin/sh", "-c"])
        .cmd(&["echo cmd-default $(pwd)"])
        .working_dir("/srv/app")
        .push(&reg, "entry:1")
        .unwrap();
    ImageBuilder::busybox()
        .unwrap()
        .push(&reg, "bare:1")
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let spec = home.path().join("entry.yaml");
    std::fs::write(
        &spec,
        format!(
            "kind: pipeline\nname: entry\nsandbox: {{image: '{e}'}}\npipeline:\n  boxes:\n    - name: args\n      run: {{args: ['echo args $(pwd) $(stat -c %u .)']}}\n    - name: cmd\n      run: {{}}\n  stages:\n    - {{type: fan_out, boxes: [args, cmd]}}\n",
            e = reg.reference("entry:1"),
        ),
    )
    .unwrap();
    let r = apply(home.path(), &spec);
    assert_eq!(r.code, Some(0), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("JSON report");
    let out: Vec<String> = doc["output"]
        .as_array()
        .unwrap_or_else(|| panic!("report: {doc}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_default().trim().to_string())
        .collect();
    assert_eq!(
        out,
        ["args /srv/app 1000", "cmd-default /srv/app"],
        "report: {doc}"
    );

    let bare = home.path().join("bare.yaml");
    std::fs::write(
        &bare,
        format!(
            "kind: sandbox\nname: s\nsandbox:\n  image: '{}'\nrun: {{env: {{A: b}}}}\n",
            reg.reference("bare:1")
        ),
    )
    .unwrap();
    let r = apply(home.path(), &bare);
    assert_eq!(r.code, Some(3), "stderr:\n{}", r.stderr);
    assert!(r.stderr.contains("bare.yaml:4:"), "{}", r.stderr);
    assert!(
        r.stderr.contains("neither Entrypoint nor Cmd"),
        "{}",
        r.stderr
    );
}

#[test]
fn oci_skills_are_mounted_read_only_or_with_a_scratch_overlay() {
    let Some(image) = guest_image() else { return };
    let reg = Registry::start().expect("registry");
    file_image(&reg, "skill:1", "/SKILL.md", "# a skill\n").unwrap();
    file_image(&reg, "root:1", "/etc/image-marker", "root-image\n").unwrap();
    let cache = tempfile::tempdir().unwrap();
    let store = voidbox_oci::Store::open(cache.path()).unwrap();
    let opts = voidbox_oci::PullOptions::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pull = |r: &str| {
        rt.block_on(store.pull(&reg.reference(r), &opts, &voidbox_oci::NoProgress))
            .unwrap()
    };
    let (skill, root) = (pull("skill:1"), pull("root:1"));
    let disk = |p: &voidbox_oci::PulledImage, role| ImageDisk {
        path: p.rootfs_disk.clone(),
        digest: p.manifest_digest.clone(),
        role,
    };
    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.disks = VmDisks {
        images: vec![
            disk(&root, DiskRole::Rootfs),
            disk(
                &skill,
                DiskRole::Skill {
                    mount: "/skills/ro".into(),
                    writable: false,
                },
            ),
            disk(
                &skill,
                DiskRole::Skill {
                    mount: "/opt/scratch".into(),
                    writable: true,
                },
            ),
        ],
        user: Some((1000, 1000)),
        writable_root: false,
    };
    let mut sb = Sandbox::start(&cfg).expect("VM with image disks");
    let script = "cat /etc/image-marker; cat /skills/ro/SKILL.md; \
                  if touch /skills/ro/x 2>/dev/null; then echo ro-writable; else echo ro-refused; fi; \
                  echo note > /opt/scratch/new && cat /opt/scratch/new; cat /opt/scratch/SKILL.md";
    let (stdout, stderr, code) = voidbox_tests::vm::sh(&mut sb, script).expect("exec");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert_eq!(
        stdout, "root-image\n# a skill\nro-refused\nnote\n# a skill\n",
        "stderr: {stderr}"
    );
    // The skill disk itself is untouched: its erofs is still the pulled file.
    assert_eq!(
        std::fs::metadata(&skill.rootfs_disk).unwrap().len(),
        skill.disk_bytes
    );
}

#[test]
fn a_user_kernel_and_gzip_initramfs_boot_with_the_agent_added() {
    let Some(image) = guest_image() else { return };
    let home = tempfile::tempdir().unwrap();
    // The "user" kernel: a copy of the built one (kernels for this host need its patches).
    let kernel = home.path().join("my-vmlinux");
    std::fs::copy(&image.vmlinux, &kernel).unwrap();
    // A gzip initramfs with busybox and a marker file.
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static");
    let mut a = voidbox::image::cpio::Archive::new();
    voidbox::image::layout::add_executable(&mut a, "bin/busybox", &busybox).unwrap();
    for applet in ["sh", "cat"] {
        a.insert(
            &format!("bin/{applet}"),
            voidbox::image::cpio::Entry {
                perm: 0o777,
                uid: 0,
                gid: 0,
                mtime: 0,
                kind: voidbox::image::cpio::Kind::Symlink("busybox".into()),
            },
        )
        .unwrap();
    }
    a.insert(
        "marker.txt",
        voidbox::image::cpio::Entry {
            perm: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            kind: voidbox::image::cpio::Kind::File(b"from-my-initramfs\n".to_vec()),
        },
    )
    .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &a.to_bytes().unwrap()).unwrap();
    let initramfs = home.path().join("my-initramfs.cpio.gz");
    std::fs::write(&initramfs, gz.finish().unwrap()).unwrap();
    let spec = home.path().join("boot.yaml");
    std::fs::write(
        &spec,
        "kind: sandbox\nname: custom-boot\nsandbox:\n  kernel: my-vmlinux\n  initramfs: my-initramfs.cpio.gz\nrun: {program: cat, args: [/marker.txt]}\n",
    )
    .unwrap();
    let r = apply(home.path(), &spec);
    assert_eq!(r.code, Some(0), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("JSON report");
    // (stdout that is not JSON is reported as text, trailing newline trimmed)
    assert_eq!(
        doc["output"].as_str().unwrap_or_default().trim_end(),
        "from-my-initramfs",
        "report: {doc}"
    );
}

/// `wget -T 2` in the guest: against a host port (allowed) whose listener accepts and never
/// answers, it times out after about 2 s with exit 1; against a private address, the NAT's
/// denial is what wget reports (exit 1, refused) and what the report's `network.denials`
/// counts. Bookworm's busybox exited 139 at once in both, with no denial recorded.
#[test]
fn the_guest_s_wget_times_out_and_reports_denials() {
    if guest_image().is_none() {
        return;
    }
    // Never accepted: the kernel completes the handshake, nothing is ever sent back.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let home = tempfile::tempdir().unwrap();
    let script = format!(
        "t() {{ cut -d' ' -f1 /proc/uptime; }}; s=$(t); \
         timeout 30 wget -q -T 2 -O- http://10.0.2.2:{port}/ 2>&1; echo \"silent=$? $s $(t)\"; \
         timeout 30 wget -q -T 2 -O- http://10.1.2.3/ 2>&1; echo \"denied=$?\""
    );
    let spec = home.path().join("wget.yaml");
    std::fs::write(
        &spec,
        format!(
            "kind: sandbox\nname: wget\nsandbox:\n  memory_mb: 128\n  network: {{allow_host_ports: [{port}]}}\nrun: {{program: sh, args: ['-c', {script:?}]}}\n"
        ),
    )
    .unwrap();
    let r = apply(home.path(), &spec);
    assert_eq!(r.code, Some(0), "stderr:\n{}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("JSON report");
    let out = doc["output"].as_str().unwrap_or_default();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "report: {doc}");
    assert_eq!(lines[0], "wget: download timed out", "report: {doc}");
    let silent_line: Vec<&str> = lines[1].split(' ').collect();
    assert_eq!(silent_line[0], "silent=1", "report: {doc}");
    let took = silent_line[2].parse::<f64>().unwrap() - silent_line[1].parse::<f64>().unwrap();
    assert!((1.9..20.0).contains(&took), "wget -T 2 took {took} s");
    assert_eq!(
        lines[2..],
        [
            "wget: can't connect to remote host (10.1.2.3): Connection refused",
            "denied=1"
        ],
        "report: {doc}"
    );
    let node = &doc["nodes"][0];
    let denied = node["network"]["denials"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["destination"] == "10.1.2.3" && d["port"] == 80 && d["protocol"] == "tcp")
        .unwrap_or_else(|| panic!("no denial of 10.1.2.3:80 in {}", node["network"]));
    assert!(denied["count"].as_u64().unwrap_or(0) >= 1, "{denied}");
    drop(silent);
}
