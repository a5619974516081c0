//! Disk parameters and plans as data; and, as root, real erofs disks mounted in a private
//! mount namespace with a real command run inside the image root.

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use voidbox_protocol::ErrorCode;

use super::*;
use crate::cmdline::BootParams;
use crate::exec::{pipe, Command, ExecEnv};
use crate::policy::Policy;

fn layout(dir: &Path) -> Layout {
    Layout {
        devices: dir.join("dev"),
        run: dir.join("run"),
        system: dir.join("sys"),
        device_wait: Duration::from_millis(100),
    }
}

#[test]
fn parses_disk_parameters() {
    let p = BootParams::parse(
        "voidbox.rootfs=vdb voidbox.user=1001:1002 voidbox.mount=vdc:/skills/py:ro \
         voidbox.mount=vdd:/opt/data:rw"
            .into(),
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let d = p.disks;
    assert_eq!(d.rootfs.as_deref(), Some("vdb"));
    assert_eq!(
        d.user,
        Some(Credentials {
            uid: 1001,
            gid: 1002
        })
    );
    assert_eq!(
        d.mounts,
        [
            SkillDisk {
                device: "vdc".into(),
                path: "/skills/py".into(),
                writable: false
            },
            SkillDisk {
                device: "vdd".into(),
                path: "/opt/data".into(),
                writable: true
            }
        ]
    );
    assert!(d.invalid.is_empty());
}

#[test]
fn bad_disk_parameters_warn_and_poison_but_a_bad_user_only_warns() {
    let p = BootParams::parse(
        "voidbox.rootfs=vda voidbox.mount=vdc:/proc/x:ro voidbox.mount=vdc:/a/../b:ro \
         voidbox.mount=vdc:/ok:rx voidbox.mount=sda:/ok:ro voidbox.mount=vdc:/ok:ro \
         voidbox.mount=vdd:/ok:rw voidbox.user=0:1000 voidbox.user=1000:0 voidbox.user=x"
            .into(),
    );
    assert_eq!(p.warnings.len(), 9, "{:#?}", p.warnings);
    let d = &p.disks;
    assert_eq!(d.invalid.len(), 6, "{:#?}", d.invalid);
    assert!(
        d.invalid[0].starts_with("voidbox.rootfs=`vda`"),
        "{}",
        d.invalid[0]
    );
    assert!(d.invalid[5].contains("mounted twice"), "{}", d.invalid[5]);
    assert_eq!(d.rootfs, None);
    assert_eq!(d.user, None);
    assert_eq!(d.mounts.len(), 1);
    assert!(!d.is_empty());
    assert!(
        p.warnings.iter().any(|w| w.contains("root")),
        "{:?}",
        p.warnings
    );
}

#[test]
fn device_user_and_path_rules() {
    for ok in ["vdb", "vdz", "vdaa"] {
        assert_eq!(parse_device(ok).as_deref(), Ok(ok));
    }
    for bad in ["vda", "vd", "vdB", "vdabc", "/dev/vdb", "sdb", ""] {
        assert!(parse_device(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_user("65534:65534").map(|c| c.uid), Ok(65534));
    for bad in [
        "0:0",
        "1000",
        "1000:",
        "-1:5",
        "+5:5",
        "4294967295:1",
        "1:2:3",
    ] {
        assert!(parse_user(bad).is_err(), "{bad}");
    }
    for ok in [
        "/skills/py",
        "/opt/a-b_c.d",
        "/workspace/skills/x",
        "/etc/skill",
    ] {
        assert_eq!(check_mount_path(ok), Ok(()), "{ok}");
    }
    let long = format!("/{}", "a".repeat(MAX_MOUNT_PATH));
    for bad in [
        "relative",
        "/",
        "/a//b",
        "/a/./b",
        "/a/..",
        "/a/",
        "/a,b",
        "/a b",
        "/a\tb",
        "/a\u{1}",
        "/proc",
        "/sys/x",
        "/dev/shm",
        "/run/voidbox",
        "/etc/voidbox/x",
        "/workspace",
        "/home",
        "/home/sandbox",
        "/tmp",
        &long,
    ] {
        assert!(check_mount_path(bad).is_err(), "{bad:?}");
    }
    assert!(check_mount_path("/proc2").is_ok() && check_mount_path("/tmp/x").is_ok());
}

#[test]
fn skill_plans() {
    let l = Layout::guest();
    let ro = SkillDisk {
        device: "vdc".into(),
        path: "/skills/py".into(),
        writable: false,
    };
    assert_eq!(
        skill_steps(&l, 0, &ro, crate::spawn::SANDBOX).unwrap(),
        [
            Step::WaitDevice("/dev/vdc".into()),
            Step::Mkdir("/skills/py".into()),
            Step::Mount {
                source: "/dev/vdc".into(),
                target: "/skills/py".into(),
                fstype: "erofs",
                flags: libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOSUID,
                data: String::new(),
            }
        ]
    );
    let rw = SkillDisk {
        writable: true,
        ..ro
    };
    let steps = skill_steps(&l, 3, &rw, crate::spawn::SANDBOX).unwrap();
    assert_eq!(
        steps.last(),
        Some(&Step::Chown("/skills/py".into(), crate::spawn::SANDBOX))
    );
    let mounts: Vec<(&Path, &Path, &str, &str)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Mount {
                source,
                target,
                fstype,
                data,
                ..
            } => Some((source.as_path(), target.as_path(), *fstype, data.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(
        mounts,
        [
            (
                Path::new("/dev/vdc"),
                Path::new("/run/voidbox/skills/3/lower"),
                "erofs",
                ""
            ),
            (
                Path::new("tmpfs"),
                Path::new("/run/voidbox/skills/3/rw"),
                "tmpfs",
                "mode=0755"
            ),
            (
                Path::new("overlay"),
                Path::new("/skills/py"),
                "overlay",
                "lowerdir=/run/voidbox/skills/3/lower,upperdir=/run/voidbox/skills/3/rw/upper,\
                 workdir=/run/voidbox/skills/3/rw/work"
            ),
        ]
    );
    // Every mount point exists before its mount, and the device is waited for first.
    assert_eq!(steps[0], Step::WaitDevice("/dev/vdc".into()));
    for (i, s) in steps.iter().enumerate() {
        if let Step::Mount { target, .. } = s {
            assert!(
                steps[..i].contains(&Step::Mkdir(target.clone())),
                "{target:?}"
            );
        }
    }
}

#[test]
fn root_plan_binds_what_the_agent_shares_and_the_skills_outside_them() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(dir.path());
    std::fs::create_dir_all(l.system_path("/etc")).unwrap();
    std::fs::write(l.system_path("/etc/hosts"), "127.0.0.1 localhost\n").unwrap();
    // The loader the runtimes disk provides (a file once that disk is mounted).
    std::fs::create_dir_all(l.system_path("/lib")).unwrap();
    std::fs::write(l.system_path(MUSL_LOADER), "").unwrap();
    let skills = [
        SkillDisk {
            device: "vdc".into(),
            path: "/skills/a".into(),
            writable: false,
        },
        SkillDisk {
            device: "vdd".into(),
            path: "/workspace/skills/b".into(),
            writable: true,
        },
    ];
    let plan = root_plan(&l, "vdb", &skills, false, false).unwrap();
    assert_eq!(plan.merged, l.run.join("rootfs/merged"));
    assert_eq!(plan.prepare[0], Step::WaitDevice(l.devices.join("vdb")));
    assert!(plan.prepare.contains(&Step::Mount {
        source: "overlay".into(),
        target: plan.merged.clone(),
        fstype: "overlay",
        flags: libc::MS_NODEV | libc::MS_NOSUID,
        data: format!(
            "lowerdir={0}/lower,upperdir={0}/rw/upper,workdir={0}/rw/work",
            l.run.join("rootfs").display()
        ),
    }));
    let summary: Vec<String> = plan
        .inside
        .iter()
        .map(|s| match s {
            Inside::Bind {
                source,
                target,
                file,
                required,
            } => format!(
                "bind {} {} {file} {required}",
                source.strip_prefix(dir.path()).unwrap_or(source).display(),
                target.display()
            ),
            Inside::Mount(Step::Mount {
                fstype,
                target,
                data,
                ..
            }) => format!("{fstype} {} {data}", target.display()),
            Inside::Mount(other) => format!("{other:?}"),
            Inside::Provide(p) => format!("provide {}", p.display()),
        })
        .collect();
    assert_eq!(
        summary,
        [
            "bind /proc /proc false true",
            "bind /dev /dev false true",
            "tmpfs /tmp mode=1777",
            "bind sys/workspace /workspace false true",
            "bind sys/home/sandbox /home/sandbox false true",
            "bind sys/etc/hosts /etc/hosts true false",
            "bind sys/skills/a /skills/a false true",
            "provide /lib/ld-musl-x86_64.so.1",
        ]
    );
    // Without skill disks (so no runtimes disk) no loader is provided.
    assert!(!root_plan(&l, "vdb", &[], false, false)
        .unwrap()
        .inside
        .iter()
        .any(|s| matches!(s, Inside::Provide(_))));
    // With network both generated files are required; without, the system root's
    // resolv.conf is never bound (the image keeps its own).
    std::fs::write(l.system_path("/etc/resolv.conf"), "").unwrap();
    let files = |net: bool| -> Vec<Inside> {
        root_plan(&l, "vdb", &[], false, net)
            .unwrap()
            .inside
            .into_iter()
            .filter(|s| matches!(s, Inside::Bind { file: true, .. }))
            .collect()
    };
    let bind = |source: PathBuf, target: &str, required: bool| Inside::Bind {
        source,
        target: target.into(),
        file: true,
        required,
    };
    assert_eq!(
        files(true),
        [
            bind(l.run.join("net/resolv.conf"), "/etc/resolv.conf", true),
            bind(l.run.join("net/hosts"), "/etc/hosts", true),
        ]
    );
    assert_eq!(
        files(false),
        [bind(l.system_path("/etc/hosts"), "/etc/hosts", false)]
    );
    let with_sys = root_plan(&l, "vdb", &[], true, false).unwrap();
    assert!(with_sys.inside.contains(&Inside::Bind {
        source: "/sys".into(),
        target: "/sys".into(),
        file: false,
        required: false,
    }));
}

// ---- as root: real disks ------------------------------------------------------------

/// Whether a root-only test may run; panics when it cannot and skipping was not asked for.
fn root_or_skip(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var("VOIDBOX_SKIP_ROOT_TESTS").as_deref() == Ok("1"),
        "{what} needs root (set VOIDBOX_SKIP_ROOT_TESTS=1 to skip it)"
    );
    eprintln!("VOIDBOX_SKIP_ROOT_TESTS=1: {what} not checked");
    false
}

/// A temporary directory with a tmpfs on it, in a mount namespace private to this test
/// thread (and the threads it starts); everything mounted below is detached on drop, and
/// the loop devices of [`Scratch::disk`] are released.
struct Scratch {
    dir: tempfile::TempDir,
    loops: std::cell::RefCell<Vec<String>>,
}

impl Scratch {
    fn new() -> Scratch {
        // SAFETY: affects only this thread (CLONE_NEWNS unshares its fs_struct too).
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare");
        mount::make_private().unwrap();
        let dir = tempfile::tempdir().unwrap();
        mount::mount(Path::new("tmpfs"), dir.path(), "tmpfs", 0, "mode=0755").unwrap();
        Scratch {
            dir,
            loops: Default::default(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Makes the image file a read-only block device (a loop device, as the guest's disks
    /// are virtio-blk devices) named `name` below `devices`.
    fn disk(&self, image: &Path, devices: &Path, name: &str) {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show", "--read-only"])
            .arg(image)
            .output()
            .expect("losetup (util-linux) is needed");
        assert!(out.status.success(), "losetup: {out:?}");
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        std::os::unix::fs::symlink(&dev, devices.join(name)).unwrap();
        self.loops.borrow_mut().push(dev);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let p = mount::cpath(self.dir.path()).unwrap();
        // SAFETY: NUL-terminated path; detaches the tmpfs and everything below it.
        unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        for dev in self.loops.borrow().iter() {
            // Still in use by a lazily detached mount: the kernel releases it afterwards.
            let _ = std::process::Command::new("losetup")
                .args(["-d", dev])
                .status();
        }
    }
}

fn busybox() -> PathBuf {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("static busybox is needed (Debian: busybox-static)")
}

/// Writes `files` (path, contents, mode) below `dir` and makes an erofs image of it.
fn erofs(dir: &Path, image: &Path, files: &[(&str, &str, u32)], busybox_links: &[&str]) {
    for (path, contents, mode) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, contents).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    if dir.join("scratch").is_dir() {
        std::fs::set_permissions(dir.join("scratch"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
    }
    if !busybox_links.is_empty() {
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::copy(busybox(), dir.join("bin/busybox")).unwrap();
        for l in busybox_links {
            std::os::unix::fs::symlink("busybox", dir.join("bin").join(l)).unwrap();
        }
    }
    let out = std::process::Command::new("mkfs.erofs")
        .arg("--quiet")
        .arg("--all-root")
        .arg(image)
        .arg(dir)
        .output()
        .expect("mkfs.erofs is needed (Debian: erofs-utils)");
    assert!(out.status.success(), "mkfs.erofs: {out:?}");
}

/// Builds the system root (workspace, home, /etc/hosts) and three disks: vdb an image with
/// busybox, vdc and vdd skills.
fn disks(s: &Scratch) -> Layout {
    let l = layout(s.path());
    std::fs::create_dir_all(&l.devices).unwrap();
    for d in ["/workspace", "/home/sandbox", "/etc"] {
        std::fs::create_dir_all(l.system_path(d)).unwrap();
    }
    std::fs::write(l.system_path("/workspace/in"), "input-from-host\n").unwrap();
    std::fs::write(l.system_path("/home/sandbox/h"), "home-file\n").unwrap();
    std::fs::write(l.system_path("/etc/hosts"), "10.0.0.1 system-hosts\n").unwrap();
    erofs(
        &s.path().join("image"),
        &s.path().join("vdb.erofs"),
        &[
            ("image-marker", "from-the-image\n", 0o644),
            ("scratch/.keep", "", 0o644),
            ("etc/hosts", "image-hosts\n", 0o644),
            (
                "opt/tool/bin/only-in-image",
                "#!/bin/sh\necho only-in-image \"$@\"\n",
                0o755,
            ),
        ],
        &[
            "sh", "cat", "id", "touch", "test", "pwd", "echo", "ls", "grep",
        ],
    );
    s.disk(&s.path().join("vdb.erofs"), &l.devices, "vdb");
    for (dev, marker) in [("vdc", "skill-c"), ("vdd", "skill-d"), ("vde", "skill-e")] {
        let image = s.path().join(format!("{dev}.erofs"));
        erofs(
            &s.path().join(dev),
            &image,
            &[("skill-marker", marker, 0o644)],
            &[],
        );
        s.disk(&image, &l.devices, dev);
    }
    l
}

/// Runs a prepared command to completion; returns (exit status, stdout + stderr).
fn run(cmd: &Command) -> (i32, String) {
    let (r, w) = pipe().unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let pid = cmd
        .plan([null.as_raw_fd(), w.as_raw_fd(), w.as_raw_fd()], false)
        .unwrap()
        .spawn()
        .map_err(|(_, e)| e)
        .unwrap();
    drop(w);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut out).unwrap();
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    (libc::WEXITSTATUS(status), out)
}

fn build(
    env: &ExecEnv,
    program: &str,
    args: &[&str],
    path: &str,
) -> Result<Command, (ErrorCode, String)> {
    build_in(env, program, args, path, None)
}

fn build_in(
    env: &ExecEnv,
    program: &str,
    args: &[&str],
    path: &str,
    workdir: Option<&str>,
) -> Result<Command, (ErrorCode, String)> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Command::build(
        program,
        &args,
        &[("PATH".into(), path.into())],
        workdir,
        &Policy::default(),
        env,
        &[],
    )
}

const SCRIPT: &str = "\
cat /image-marker; id -u; id -g; pwd; echo $HOME; cat /proc/cmdline
cat /workspace/in; echo written > /workspace/out
cat /home/sandbox/h; cat /etc/hosts
cat /skills/ro/skill-marker; echo
touch /skills/ro/x 2>/dev/null && echo ro-writable || echo ro-refused
echo new > /skills/rw/new && cat /skills/rw/new
cat /workspace/skills/w/skill-marker; echo
echo t > /tmp/t && echo tmp-ok
echo x > /scratch/new && cat /scratch/new
test -e /dev/null && echo dev-ok; test -e /proc/self/status && echo proc-ok
test -e /usr && echo system-root-visible || echo system-root-hidden
test -e /run/voidbox && echo run-visible || echo run-hidden
only-in-image arg
";

#[test]
fn image_root_runs_commands_inside_the_image_with_skills() {
    if !root_or_skip("the image-root test") {
        return;
    }
    let s = Scratch::new();
    let l = disks(&s);
    let user = Credentials {
        uid: 4321,
        gid: 4322,
    };
    let mut params = DiskParams::default();
    for (k, v) in [
        ("rootfs", "vdb"),
        ("user", "4321:4322"),
        ("mount", "vdc:/skills/ro:ro"),
        ("mount", "vdd:/skills/rw:rw"),
        ("mount", "vde:/workspace/skills/w:ro"),
    ] {
        params.apply(k, v).unwrap();
    }
    // As the agent does at boot: the secret in /proc/cmdline hidden by a bind mount, which
    // the image's /proc must keep.
    let redacted = s.path().join("cmdline");
    std::fs::write(&redacted, "voidbox.secret=<redacted>\n").unwrap();
    mount::mount(&redacted, Path::new("/proc/cmdline"), "", libc::MS_BIND, "").unwrap();
    let root = setup(&params, &l, false);
    assert!(matches!(root, ExecRoot::Image(_)), "{root:?}");
    // The workspace belongs to the image's user.
    use std::os::unix::fs::MetadataExt;
    let ws = std::fs::metadata(l.system_path("/workspace")).unwrap();
    assert_eq!((ws.uid(), ws.gid()), (4321, 4322));
    // The skills are in the system root too: read-only, and writable through the overlay.
    assert_eq!(
        std::fs::read_to_string(l.system_path("/skills/ro/skill-marker")).unwrap(),
        "skill-c"
    );
    let e = std::fs::write(l.system_path("/skills/ro/x"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    std::fs::write(l.system_path("/skills/rw/y"), "y").unwrap();

    let env = ExecEnv {
        creds: Some(user),
        base: l.system.clone(),
        root,
    };
    let cmd = build(&env, "sh", &["-c", SCRIPT], "/opt/tool/bin:/bin").unwrap();
    assert_eq!(cmd.path(), Path::new("/bin/sh"));
    let (code, out) = run(&cmd);
    assert_eq!(code, 0, "{out}");
    let expected = "from-the-image\n4321\n4322\n/workspace\n/home/sandbox\n\
        voidbox.secret=<redacted>\n\
        input-from-host\nhome-file\n10.0.0.1 system-hosts\nskill-c\nro-refused\nnew\n\
        skill-e\ntmp-ok\nx\ndev-ok\nproc-ok\nsystem-root-hidden\n\
        run-hidden\nonly-in-image arg\n";
    assert_eq!(out, expected);
    // The command's workspace is the agent's, and the image itself is unchanged.
    assert_eq!(
        std::fs::read_to_string(l.system_path("/workspace/out")).unwrap(),
        "written\n"
    );
    // PATH lookup happens in the image: a program only the image has is found there, and
    // one only the system root has is not.
    let tool = build(&env, "only-in-image", &[], "/opt/tool/bin:/bin").unwrap();
    assert_eq!(tool.path(), Path::new("/opt/tool/bin/only-in-image"));
    assert_eq!(run(&tool), (0, "only-in-image\n".into()));
    let (code, msg) = build(&env, "mkfs.erofs", &[], crate::policy::SYSTEM_PATH)
        .err()
        .unwrap();
    assert_eq!(code, ErrorCode::NotFound, "{msg}");
    // A missing working directory inside the image is made for the command user (an
    // image's `WorkingDir`, as Docker does); one that is a file is refused at build.
    let made = build_in(
        &env,
        "sh",
        &["-c", "pwd; stat -c %u:%g ."],
        "/bin",
        Some("/no/such/dir"),
    )
    .unwrap();
    assert_eq!(run(&made), (0, "/no/such/dir\n4321:4322\n".into()));
    let (code, msg) = build_in(
        &env,
        "sh",
        &["-c", "true"],
        "/bin",
        Some("/opt/tool/bin/only-in-image/x"),
    )
    .err()
    .unwrap();
    assert_eq!(code, ErrorCode::Io, "{msg}");
    assert!(
        msg.contains("only-in-image is not a directory") && msg.contains("the working directory"),
        "{msg}"
    );
}

#[test]
fn failed_disks_make_every_exec_fail_with_the_reason() {
    if !root_or_skip("the failed-disk test") {
        return;
    }
    let s = Scratch::new();
    let l = disks(&s);
    let mut params = DiskParams::default();
    params.apply("rootfs", "vdz").unwrap();
    let root = setup(&params, &l, false);
    let ExecRoot::Broken(why) = &root else {
        panic!("{root:?}");
    };
    assert!(
        why.contains("image root vdz") && why.contains("does not exist"),
        "{why}"
    );
    let env = ExecEnv {
        creds: Some(crate::spawn::SANDBOX),
        base: l.system.clone(),
        root: root.clone(),
    };
    let cmd = build(&env, "image-only-program", &[], "/bin").unwrap();
    let err = cmd.plan([0, 1, 2], false).err().unwrap();
    assert!(
        err.contains("disks failed at boot") && err.contains("vdz"),
        "{err}"
    );

    // A skill that cannot be mounted (vdb's disk is fine, but `/etc/hosts` is a file) and
    // an invalid parameter are failures too.
    let mut params = DiskParams::default();
    params.apply("mount", "vdc:/etc/hosts/x:ro").unwrap();
    assert!(params.apply("mount", "vdc:relative:ro").is_err());
    let ExecRoot::Broken(why) = setup(&params, &l, false) else {
        panic!("skill failure not reported");
    };
    assert!(why.contains("voidbox.mount=`vdc:relative:ro`"), "{why}");
    assert!(why.contains("skill vdc at /etc/hosts/x"), "{why}");

    // Skills alone leave the system root in place.
    let mut params = DiskParams::default();
    params.apply("mount", "vdd:/skills/d:ro").unwrap();
    assert!(matches!(setup(&params, &l, false), ExecRoot::System));
    assert_eq!(
        std::fs::read_to_string(l.system_path("/skills/d/skill-marker")).unwrap(),
        "skill-d"
    );
}

#[test]
fn image_root_gets_the_network_files_only_with_network() {
    if !root_or_skip("the image network-files test") {
        return;
    }
    let s = Scratch::new();
    let l = layout(s.path());
    std::fs::create_dir_all(&l.devices).unwrap();
    for d in ["/workspace", "/home/sandbox", "/etc"] {
        std::fs::create_dir_all(l.system_path(d)).unwrap();
    }
    std::fs::write(l.system_path("/etc/hosts"), "system-hosts\n").unwrap();
    std::fs::write(l.system_path("/etc/resolv.conf"), "").unwrap();
    // vdb: `/etc/resolv.conf` is a dangling link (a systemd-resolved image); vdc has its
    // own file.
    let tools = ["sh", "cat", "test", "echo"];
    let a = s.path().join("img-a");
    std::fs::create_dir_all(a.join("etc")).unwrap();
    std::os::unix::fs::symlink(
        "../run/systemd/resolve/stub-resolv.conf",
        a.join("etc/resolv.conf"),
    )
    .unwrap();
    erofs(
        &a,
        &s.path().join("a.erofs"),
        &[("etc/hosts", "image-hosts\n", 0o644)],
        &tools,
    );
    s.disk(&s.path().join("a.erofs"), &l.devices, "vdb");
    erofs(
        &s.path().join("img-b"),
        &s.path().join("b.erofs"),
        &[
            ("etc/hosts", "image-hosts\n", 0o644),
            ("etc/resolv.conf", "nameserver 192.0.2.53\n", 0o644),
        ],
        &tools,
    );
    s.disk(&s.path().join("b.erofs"), &l.devices, "vdc");
    let script = "cat /etc/resolv.conf /etc/hosts; \
        test -L /etc/resolv.conf && echo link || echo file; \
        test -e /run/systemd/resolve/stub-resolv.conf && echo followed || echo not-followed";
    let run_in = |dev: &str, net: bool| {
        let mut params = DiskParams::default();
        params.apply("rootfs", dev).unwrap();
        let root = setup(&params, &l, net);
        assert!(matches!(root, ExecRoot::Image(_)), "{root:?}");
        let env = ExecEnv {
            creds: Some(crate::spawn::SANDBOX),
            base: l.system.clone(),
            root,
        };
        run(&build(&env, "sh", &["-c", script], "/bin").unwrap())
    };

    // Without network: the image keeps its own resolv.conf (or none); hosts is the system's.
    assert_eq!(
        run_in("vdc", false),
        (
            0,
            "nameserver 192.0.2.53\nsystem-hosts\nfile\nnot-followed\n".into()
        )
    );
    let (_, out) = run_in("vdb", false);
    assert!(out.ends_with("system-hosts\nlink\nnot-followed\n"), "{out}");

    // With network: both files are the generated ones, in either image, and the link is
    // replaced rather than followed.
    let c = crate::net::NetConfig::parse("10.0.2.15/24,10.0.2.2,10.0.2.3").unwrap();
    crate::net::place_files(&l, &c, "box-1").unwrap();
    let expected = format!(
        "{}{}file\nnot-followed\n",
        c.resolv_conf(),
        c.hosts("box-1")
    );
    assert_eq!(run_in("vdb", true), (0, expected.clone()));
    assert_eq!(run_in("vdc", true), (0, expected));
}
