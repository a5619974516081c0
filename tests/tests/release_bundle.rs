//! The release tarball and the Python wheel, installed the way users install them: unpacked
//! (or `pip install`ed into a fresh venv) outside the source tree and run by a fresh
//! unprivileged account (`useradd`, an empty HOME, no cargo on PATH, `/dev/kvm` granted to it
//! alone with an ACL for the test and taken back). `voidbox apply examples/fan-out.yaml` must
//! print the merged array from the bundled guest image: no kernel build, no apt, nothing
//! written outside that user's XDG cache.
//!
//! They need the artifacts of `scripts/release.sh` and `scripts/wheel.sh` in `dist/`
//! (scripts/test.sh makes them before `cargo test`), root (to add the account) and `setfacl`
//! (Debian's `acl`). Without them they fail loudly, unless `VOIDBOX_SKIP_VM_TESTS=1`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};
use voidbox_tests::{repo_root, Run};

fn skip() -> bool {
    if std::env::var("VOIDBOX_SKIP_VM_TESTS").as_deref() == Ok("1") {
        eprintln!("VOIDBOX_SKIP_VM_TESTS=1: skipping a real-VM test");
        return true;
    }
    false
}

/// The one file in `dist/` whose name starts with `prefix` and ends with `suffix`.
fn dist_file(prefix: &str, suffix: &str, made_by: &str) -> PathBuf {
    let dist = repo_root().join("dist");
    let found: Vec<PathBuf> = std::fs::read_dir(&dist)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            n.starts_with(prefix) && n.ends_with(suffix)
        })
        .collect();
    match found.as_slice() {
        [one] => one.clone(),
        [] => panic!(
            "no {prefix}*{suffix} in {}: run {made_by} first (scripts/test.sh does)",
            dist.display()
        ),
        many => panic!("several {prefix}*{suffix} in dist/: {many:?}"),
    }
}

fn sh(cmd: &mut Command) -> Run {
    let what = format!("{cmd:?}");
    let r: Run = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"))
        .into();
    assert_eq!(
        r.code,
        Some(0),
        "{what} failed:\n{}\n{}",
        r.stdout,
        r.stderr
    );
    r
}

/// A fresh account with an empty home under a world-readable scratch directory, allowed to
/// open `/dev/kvm` (an ACL entry for it alone) until dropped.
struct FreshUser {
    name: String,
    home: PathBuf,
    /// `getfacl` of `/dev/kvm` before the test, restored when dropped.
    acl_backup: PathBuf,
    /// One test at a time changes `/dev/kvm`'s ACL (restoring it must not drop another's).
    _serial: std::sync::MutexGuard<'static, ()>,
}

static KVM_ACL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl FreshUser {
    fn create(scratch: &Path, tag: &str) -> FreshUser {
        let user = FreshUser::create_without_kvm(scratch, tag);
        sh(Command::new("setfacl").args(["-m", &format!("u:{}:rw", user.name), "/dev/kvm"]));
        user
    }

    /// A fresh account that is given no access to `/dev/kvm` (see [`FreshUser::run_without_kvm`]).
    fn create_without_kvm(scratch: &Path, tag: &str) -> FreshUser {
        let uid = sh(Command::new("id").arg("-u")).stdout;
        assert_eq!(
            uid.trim(),
            "0",
            "this test adds a user account: run it as root (CI does)"
        );
        let serial = KVM_ACL.lock().unwrap_or_else(|e| e.into_inner());
        let name = format!("vbt{}{tag}", std::process::id() % 100_000);
        let home = scratch.join(format!("home-{tag}"));
        let acl_backup = scratch.join(format!("kvm-acl-{tag}"));
        let acl = sh(Command::new("getfacl").args(["-p", "/dev/kvm"])).stdout;
        std::fs::write(&acl_backup, acl).expect("save /dev/kvm's ACL");
        sh(Command::new("useradd")
            .args(["--user-group", "--shell", "/bin/sh", "--home-dir"])
            .arg(&home)
            .arg("--create-home")
            .arg(&name));
        FreshUser {
            name,
            home,
            acl_backup,
            _serial: serial,
        }
    }

    /// Runs `prog args` in `cwd` as this user with a clean environment: HOME, a PATH without
    /// cargo, and nothing else of ours (no XDG_CACHE_HOME, no VOIDBOX_*).
    fn run(&self, cwd: &Path, prog: &Path, args: &[&str]) -> (Run, f64) {
        self.run_in(Command::new("runuser"), cwd, prog, args)
    }

    /// [`FreshUser::run`] where `/dev/kvm` is what the issue's host had: a KVM device node of
    /// mode 0600 root:root (bind-mounted over the real one in a private mount namespace,
    /// whatever this host's node allows), with no group for the user to join.
    fn run_without_kvm(&self, scratch: &Path, prog: &Path, args: &[&str]) -> Run {
        let node = scratch.join(format!("kvm-0600-{}", self.name));
        let setup = format!(
            "set -e; rm -f '{n}'; mknod -m 600 '{n}' c 10 232; chown 0:0 '{n}'; \
             mount --bind '{n}' /dev/kvm; exec runuser \"$@\"",
            n = node.display()
        );
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &setup,
            "no-kvm",
        ]);
        self.run_in(cmd, scratch, prog, args).0
    }

    fn run_in(&self, mut cmd: Command, cwd: &Path, prog: &Path, args: &[&str]) -> (Run, f64) {
        let started = Instant::now();
        let r: Run = cmd
            .args(["-u", &self.name, "--", "env", "-i"])
            .arg(format!("HOME={}", self.home.display()))
            .args([
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "LANG=C.UTF-8",
                "NO_COLOR=1",
            ])
            .arg(prog)
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("runuser")
            .into();
        (r, started.elapsed().as_secs_f64())
    }
}

impl Drop for FreshUser {
    fn drop(&mut self) {
        let _ = Command::new("setfacl")
            .arg(format!("--restore={}", self.acl_backup.display()))
            .status();
        let _ = Command::new("pkill")
            .args(["-KILL", "-u", &self.name])
            .status();
        let _ = Command::new("userdel")
            .args(["-r", &self.name])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn scratch() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("voidbox-install-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
}

/// Copies the example spec where the fresh user can read it.
fn example(dir: &Path) -> PathBuf {
    let spec = dir.join("fan-out.yaml");
    std::fs::copy(repo_root().join("examples/fan-out.yaml"), &spec).expect("copy example");
    spec
}

/// Runs the fan-out example with `voidbox` as `user` and checks the merged output, that the
/// bundled image was used (no kernel compiled, no image built into the user's cache) and
/// that the user's cache holds its snapshots.
fn apply_fan_out(user: &FreshUser, voidbox: &Path, cwd: &Path) {
    let spec = example(cwd);
    let (r, secs) = user.run(
        cwd,
        voidbox,
        &[
            "apply",
            "--output",
            "json",
            spec.to_str().unwrap_or_default(),
        ],
    );
    assert_eq!(
        r.code,
        Some(0),
        "apply as {} failed:\n{}\n{}",
        user.name,
        r.stdout,
        r.stderr
    );
    let report: Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("report is not JSON ({e}):\n{}", r.stdout));
    assert_eq!(
        report["output"],
        json!([9, "THE QUICK BROWN FOX\nJUMPS OVER THE LAZY DOG", 2]),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("building guest image"),
        "an image was built:\n{}",
        r.stderr
    );
    let cache = user.home.join(".cache/voidbox");
    for built in ["kernels", "images"] {
        assert!(
            !cache.join(built).exists(),
            "{}/{built} exists: the bundled image was not used",
            cache.display()
        );
    }
    assert!(
        cache.join("snapshots").is_dir(),
        "no golden snapshot in the user's cache {}",
        cache.display()
    );
    eprintln!(
        "first apply of examples/fan-out.yaml as {} from {}: {secs:.1} s",
        user.name,
        voidbox.display()
    );
}

/// Unpacks the release tarball into `dir`; its one top directory.
fn unpack(tarball: &Path, dir: &Path) -> PathBuf {
    sh(Command::new("tar")
        .arg("-xzf")
        .arg(tarball)
        .arg("-C")
        .arg(dir));
    std::fs::read_dir(dir)
        .expect("read unpacked")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .expect("the tarball holds one directory")
}

/// The paths of the source tree this test (and so the tarball's binary) was built from: a
/// relocated binary must never name them (issue 34, 6.5).
/// `doctor`'s `vmm` check says VMs start with the standalone VMM at `path`, of this build.
fn assert_standalone_vmm(doctor: &Value, path: &Path) {
    let vmm = doctor["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "vmm"))
        .cloned()
        .unwrap_or_default();
    let detail = vmm["detail"].as_str().unwrap_or_default();
    assert_eq!(vmm["status"], "ok", "{vmm}");
    assert!(
        detail.contains(&path.display().to_string()) && detail.contains("standalone"),
        "{vmm}"
    );
    assert!(detail.contains(voidbox_vmm::build_id::BUILD_ID), "{vmm}");
}

fn build_tree_paths() -> Vec<String> {
    let root = repo_root();
    let mut paths = vec![root.display().to_string()];
    if let Ok(c) = root.canonicalize() {
        paths.push(c.display().to_string());
    }
    paths
}

fn assert_no_build_path(what: &str, text: &str) {
    for p in build_tree_paths() {
        assert!(
            !text.contains(&p),
            "{what} names the build machine's source tree {p}:\n{text}"
        );
    }
}

#[test]
fn the_release_tarball_runs_a_pipeline_as_a_fresh_unprivileged_user() {
    if skip() {
        return;
    }
    let tarball = dist_file("voidbox-", "-x86_64-linux.tar.gz", "scripts/release.sh");
    let dir = scratch();
    let top = unpack(&tarball, dir.path());
    for f in [
        "bin/voidbox",
        "bin/voidbox-vmm",
        "bin/voidbox-guest-agent",
        "share/doc/voidbox/README.md",
        "share/doc/voidbox/LICENSE",
        "share/doc/voidbox/THIRD-PARTY.md",
        "share/doc/voidbox/licenses/GPL-2",
    ] {
        assert!(
            top.join(f).is_file(),
            "{f} missing from {}",
            tarball.display()
        );
    }
    let profiles: Vec<String> = std::fs::read_dir(top.join("share/voidbox/images"))
        .expect("share/voidbox/images")
        .flatten()
        .map(|e| {
            let m: Value = serde_json::from_slice(
                &std::fs::read(e.path().join("manifest.json")).expect("manifest.json"),
            )
            .expect("manifest JSON");
            m["profile"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    let mut sorted = profiles.clone();
    sorted.sort();
    assert_eq!(sorted, ["compat", "plain"], "bundled images: {profiles:?}");

    let user = FreshUser::create(dir.path(), "t");
    let voidbox = top.join("bin/voidbox");
    // `image ls` shows the bundled images; `doctor` finds the image without a build.
    let (ls, _) = user.run(dir.path(), &voidbox, &["image", "ls"]);
    assert_eq!(ls.code, Some(0), "{}", ls.stderr);
    assert_eq!(ls.stdout.matches(" bundled").count(), 2, "{}", ls.stdout);
    let (doctor, _) = user.run(dir.path(), &voidbox, &["doctor", "--format", "json"]);
    assert_no_build_path("doctor", &format!("{}{}", doctor.stdout, doctor.stderr));
    let d: Value = serde_json::from_str(&doctor.stdout).expect("doctor JSON");
    assert_standalone_vmm(&d, &top.join("bin/voidbox-vmm"));
    // The guest agent a rebuild would use is the one beside the binary.
    let tools = d["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "tools-image-build"))
        .cloned()
        .unwrap_or_default();
    let beside = top.join("bin/voidbox-guest-agent").display().to_string();
    assert!(
        tools["detail"]
            .as_str()
            .unwrap_or_default()
            .contains(&beside),
        "{tools}"
    );
    let image = d["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "guest-image"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(image["status"], "ok", "{image}");
    assert!(
        image["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("bundled"),
        "{image}"
    );
    apply_fan_out(&user, &voidbox, dir.path());

    // A damaged install is refused with the file named, before any VM starts.
    for image in std::fs::read_dir(top.join("share/voidbox/images"))
        .expect("images")
        .flatten()
    {
        let disk = image.path().join("system.erofs");
        let mut bytes = std::fs::read(&disk).expect("read disk");
        bytes[4096] ^= 0xff;
        std::fs::write(&disk, bytes).expect("tamper");
    }
    let (r, _) = user.run(dir.path(), &voidbox, &["run", "--", "true"]);
    assert_ne!(r.code, Some(0), "a damaged bundled image booted");
    assert!(
        r.stderr.contains("system.erofs") && r.stderr.contains("reinstall"),
        "{}",
        r.stderr
    );
}

/// The issue's host: `/dev/kvm` root:root 0600, no `kvm` group membership for the user.
/// `doctor`, `apply`, `run` and `apply --dry-run` give the same fix (doctor's, from the
/// device's real group and mode: the udev rule, not "join the kvm group" alone), know the
/// bundled images (no "cannot be built here", no "no guest image is cached"), and never
/// name the build machine's source tree. No VM starts.
#[test]
fn without_dev_kvm_access_every_command_gives_doctor_s_fix_and_knows_the_bundled_images() {
    if skip() {
        return;
    }
    let tarball = dist_file("voidbox-", "-x86_64-linux.tar.gz", "scripts/release.sh");
    let dir = scratch();
    let top = unpack(&tarball, dir.path());
    let voidbox = top.join("bin/voidbox");
    let user = FreshUser::create_without_kvm(dir.path(), "k");
    let spec = example(dir.path());
    let spec = spec.to_str().unwrap_or_default();

    let doctor = user.run_without_kvm(dir.path(), &voidbox, &["doctor", "--format", "json"]);
    assert_no_build_path("doctor", &format!("{}{}", doctor.stdout, doctor.stderr));
    assert_eq!(doctor.code, Some(3), "{}\n{}", doctor.stdout, doctor.stderr);
    let d: Value = serde_json::from_str(&doctor.stdout).expect("doctor JSON");
    let check = |name: &str| {
        d["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} check: {d}"))
    };
    let kvm = check("kvm");
    assert_eq!(kvm["status"], "fail", "{kvm}");
    let detail = kvm["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("group root, mode 600"), "{kvm}");
    let fix = kvm["fix"].as_str().unwrap_or_default().to_string();
    assert!(fix.contains("/etc/udev/rules.d/99-kvm.rules"), "{fix}");
    let image = check("guest-image");
    assert_eq!(image["status"], "ok", "{image}");
    let image_detail = image["detail"].as_str().unwrap_or_default();
    assert!(
        image_detail.contains("bundled")
            && image_detail.contains("(plain)")
            && image_detail.contains("(compat)"),
        "{image}"
    );

    // `apply` and `run` stop before any VM with exactly doctor's finding and fix.
    for args in [vec!["apply", spec], vec!["run", "--", "true"]] {
        let r = user.run_without_kvm(dir.path(), &voidbox, &args);
        assert_eq!(r.code, Some(3), "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(detail),
            "{args:?} lacks doctor's finding:\n{}",
            r.stderr
        );
        assert!(
            r.stderr.contains(&fix),
            "{args:?} lacks doctor's fix:\n{}",
            r.stderr
        );
        for wrong in ["cannot be built", "no guest image", "kvm` group"] {
            assert!(
                !r.stderr.contains(wrong),
                "{args:?} says {wrong:?}:\n{}",
                r.stderr
            );
        }
        assert_no_build_path(args[0], &r.stderr);
    }
    // `apply --dry-run` checks the plan against a bundled image and warns with the same fix.
    let dry = user.run_without_kvm(dir.path(), &voidbox, &["apply", "--dry-run", spec]);
    assert_eq!(dry.code, Some(0), "{}", dry.stderr);
    assert!(
        dry.stderr.contains(&fix),
        "dry run lacks doctor's fix:\n{}",
        dry.stderr
    );
    assert!(
        !dry.stderr.contains("no guest image"),
        "the bundled images were not seen:\n{}",
        dry.stderr
    );
    assert!(
        dry.stdout.contains("seed"),
        "no plan printed:\n{}",
        dry.stdout
    );
    assert_no_build_path("apply --dry-run", &dry.stderr);
}

#[test]
fn the_wheel_installs_into_a_fresh_venv_and_runs_a_pipeline() {
    if skip() {
        return;
    }
    let wheel = dist_file("voidbox-", "_x86_64.whl", "scripts/wheel.sh");
    let dir = scratch();
    let user = FreshUser::create(dir.path(), "w");
    let venv = user.home.join("venv");
    let python = Path::new("/usr/bin/python3");
    let (r, _) = user.run(
        &user.home,
        python,
        &["-m", "venv", venv.to_str().unwrap_or_default()],
    );
    assert_eq!(r.code, Some(0), "venv: {}", r.stderr);
    // The wheel from a path the user can read, installed offline (it has no dependencies).
    let local = dir.path().join(wheel.file_name().expect("wheel name"));
    std::fs::copy(&wheel, &local).expect("copy wheel");
    let (r, secs) = user.run(
        &user.home,
        &venv.join("bin/pip"),
        &[
            "install",
            "--no-index",
            "--no-deps",
            "-q",
            local.to_str().unwrap_or_default(),
        ],
    );
    assert_eq!(r.code, Some(0), "pip install: {}\n{}", r.stdout, r.stderr);
    eprintln!("pip install of {}: {secs:.1} s", wheel.display());
    let images = venv.join("share/voidbox/images");
    assert_eq!(
        std::fs::read_dir(&images)
            .unwrap_or_else(|e| panic!("{}: {e}", images.display()))
            .count(),
        2,
        "both profiles' images in the venv"
    );
    apply_fan_out(&user, &venv.join("bin/voidbox"), dir.path());
    let (doctor, _) = user.run(
        dir.path(),
        &venv.join("bin/voidbox"),
        &["doctor", "--format", "json"],
    );
    let d: Value = serde_json::from_str(&doctor.stdout).expect("doctor JSON");
    assert_standalone_vmm(&d, &venv.join("bin/voidbox-vmm"));

    // `auditwheel show` agrees with the platform tag in the wheel's name.
    let name = wheel
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let tag = name
        .rsplit('-')
        .next()
        .and_then(|t| t.strip_suffix(".whl"))
        .unwrap_or_default();
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME");
    let tools = cache.join("voidbox/wheel-tools/bin");
    let twine = sh(Command::new(tools.join("twine"))
        .args(["check", "--strict"])
        .arg(&wheel));
    assert!(twine.stdout.contains("PASSED"), "{}", twine.stdout);
    let show = sh(Command::new(tools.join("auditwheel"))
        .arg("show")
        .arg(&wheel));
    let text = format!("{}{}", show.stdout, show.stderr).replace('\n', " ");
    assert!(
        text.contains(&format!("following platform tag: \"{tag}\"")),
        "auditwheel show does not report {tag}: {text}"
    );
}
