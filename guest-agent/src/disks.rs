//! Disks named on the kernel command line: the node's OCI image as the root filesystem of
//! its commands, and OCI skills mounted at guest paths. Set up at boot, before the agent
//! listens, so a snapshot taken at "agent ready" already holds every mount.
//!
//! The engine attaches each image as a read-only erofs virtio-blk disk (`/dev/vda` is the
//! system disk; `vdb`, `vdc`, … follow in the order it lists them) and says what to do
//! with them:
//!
//! | parameter | meaning |
//! |---|---|
//! | `voidbox.rootfs=vdX` | the node's image: an overlay (erofs lower, tmpfs upper) that every exec and PTY runs in ([`crate::rootfs`]) |
//! | `voidbox.user=UID:GID` | default identity of commands (instead of 1000:1000); uid 0 or gid 0 is refused |
//! | `voidbox.mount=vdX:/abs/path:ro\|rw` | a skill (repeatable): `ro` mounts the erofs disk read-only at the path, `rw` puts a tmpfs overlay on it (writes work and are discarded; its top directory belongs to the command user) |
//!
//! Skills are mounted in the system root, and with `voidbox.rootfs` inside the image root
//! too. A skill path is absolute, at most [`MAX_MOUNT_PATH`] bytes, without `.`/`..`/empty
//! components, `,`, `:`, whitespace or control characters, and not at or under `/proc`,
//! `/sys`, `/dev`, `/run`, `/etc/voidbox`, nor exactly `/`, `/workspace`, `/home`,
//! `/home/sandbox` or `/tmp`.
//!
//! Failures are loud: a bad `voidbox.rootfs`/`voidbox.mount` value, a missing device or a
//! failed mount is logged on the console and turns the exec root into
//! [`ExecRoot::Broken`], so every exec answers exit code 127 with that message instead of
//! running without its image or skills. A refused `voidbox.user` is only a warning
//! (commands keep running as 1000:1000).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mount;
pub use crate::rootfs::ExecRoot;
use crate::rootfs::ImageRoot;
use crate::server::AgentConfig;
use crate::spawn::Credentials;

/// Longest accepted skill mount path, in bytes.
pub const MAX_MOUNT_PATH: usize = 256;
/// Most `voidbox.mount` disks per VM.
pub const MAX_MOUNTS: usize = 16;
/// How long boot waits for a disk's device node to appear.
pub const DEVICE_WAIT: Duration = Duration::from_secs(5);

/// Mount flags of an erofs disk.
const EROFS_FLAGS: libc::c_ulong = libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOSUID;
/// Mount flags of tmpfs and overlay mounts made here.
const RW_FLAGS: libc::c_ulong = libc::MS_NODEV | libc::MS_NOSUID;

/// Paths a skill may not be mounted at or below.
const RESERVED_TREES: [&str; 5] = ["/proc", "/sys", "/dev", "/run", "/etc/voidbox"];
/// Paths a skill may not be mounted at exactly (it would hide what the agent binds there).
const RESERVED_PATHS: [&str; 5] = ["/", "/workspace", "/home", "/home/sandbox", "/tmp"];
/// Trees bound recursively into the image root: a skill below them comes along.
const BOUND_TREES: [&str; 2] = ["/workspace", "/home/sandbox"];

/// One `voidbox.mount`: an erofs disk mounted at a guest path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillDisk {
    /// Device name (`vdc`).
    pub device: String,
    /// Absolute guest path.
    pub path: String,
    /// `rw`: writable through a tmpfs overlay (writes are discarded with the VM).
    pub writable: bool,
}

/// The disk parameters of the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskParams {
    /// `voidbox.rootfs`: the device holding the node's image.
    pub rootfs: Option<String>,
    /// `voidbox.user`: identity of commands.
    pub user: Option<Credentials>,
    /// `voidbox.mount`, in command-line order.
    pub mounts: Vec<SkillDisk>,
    /// Invalid `voidbox.rootfs`/`voidbox.mount` values: they make every exec fail.
    pub invalid: Vec<String>,
}

impl DiskParams {
    /// Applies one `voidbox.<key>=<value>` (`rootfs`, `user` or `mount`). An error is a
    /// warning for the console; an invalid `rootfs` or `mount` is also kept in
    /// [`DiskParams::invalid`].
    pub fn apply(&mut self, key: &str, value: &str) -> Result<(), String> {
        let result = match key {
            "rootfs" => parse_device(value).and_then(|d| match &self.rootfs {
                Some(old) => Err(format!("given twice (`{old}` and `{d}`)")),
                None => {
                    self.rootfs = Some(d);
                    Ok(())
                }
            }),
            "mount" => parse_mount(value).and_then(|m| {
                if self.mounts.len() >= MAX_MOUNTS {
                    Err(format!("more than {MAX_MOUNTS} mounts"))
                } else if self.mounts.iter().any(|o| o.path == m.path) {
                    Err(format!("{} is mounted twice", m.path))
                } else {
                    self.mounts.push(m);
                    Ok(())
                }
            }),
            "user" => {
                return parse_user(value)
                    .map(|u| self.user = Some(u))
                    .map_err(|e| format!("{e}; commands run as 1000:1000"))
            }
            _ => return Err("unknown parameter (ignored)".into()),
        };
        result.map_err(|e| {
            let e = format!("`{value}`: {e}");
            self.invalid.push(format!("voidbox.{key}={e}"));
            e
        })
    }

    /// Whether no disk is to be set up.
    pub fn is_empty(&self) -> bool {
        self.rootfs.is_none() && self.mounts.is_empty() && self.invalid.is_empty()
    }
}

/// Parses a device name: `vd` plus one or two letters, never `vda` (the system disk).
pub fn parse_device(v: &str) -> Result<String, String> {
    let letters = v.strip_prefix("vd").unwrap_or("");
    if !(1..=2).contains(&letters.len()) || !letters.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err("not a disk name like `vdb`".into());
    }
    if v == "vda" {
        return Err("`vda` is the system disk".into());
    }
    Ok(v.to_string())
}

/// Parses `UID:GID`; root (uid or gid 0) and the invalid id `4294967295` are refused.
pub fn parse_user(v: &str) -> Result<Credentials, String> {
    let (u, g) = v.split_once(':').ok_or("expected UID:GID")?;
    let id = |s: &str| -> Result<u32, String> {
        match s.parse::<u32>() {
            Ok(n) if n != u32::MAX && !s.starts_with('+') => Ok(n),
            _ => Err(format!("bad id `{s}`")),
        }
    };
    let (uid, gid) = (id(u)?, id(g)?);
    if uid == 0 || gid == 0 {
        return Err(format!(
            "`{v}` would run commands as root, which is refused"
        ));
    }
    Ok(Credentials { uid, gid })
}

/// Parses `vdX:/abs/path:ro|rw`.
pub fn parse_mount(v: &str) -> Result<SkillDisk, String> {
    let parts: Vec<&str> = v.split(':').collect();
    let [device, path, mode] = parts[..] else {
        return Err("expected vdX:/path:ro|rw".into());
    };
    let writable = match mode {
        "ro" => false,
        "rw" => true,
        _ => return Err(format!("mode `{mode}` is neither ro nor rw")),
    };
    check_mount_path(path)?;
    Ok(SkillDisk {
        device: parse_device(device)?,
        path: path.to_string(),
        writable,
    })
}

/// Checks a skill mount path (see the module documentation for the rules).
pub fn check_mount_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("mount path `{p}` is not absolute"));
    }
    if p.len() > MAX_MOUNT_PATH {
        return Err(format!("mount path is longer than {MAX_MOUNT_PATH} bytes"));
    }
    if let Some(c) = p
        .chars()
        .find(|&c| c == ',' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(format!("mount path `{p}` contains {c:?}"));
    }
    if p != "/"
        && p[1..]
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!(
            "mount path `{p}` has an empty, `.` or `..` component"
        ));
    }
    if RESERVED_PATHS.contains(&p)
        || RESERVED_TREES
            .iter()
            .any(|t| voidbox_protocol::guest_paths::at_or_under(p, t))
    {
        return Err(format!("mount path `{p}` is reserved"));
    }
    Ok(())
}

/// Where the disk setup finds and puts things. [`Layout::guest`] is the VM's; tests
/// relocate it into a temporary directory.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Directory of the device nodes (`/dev`).
    pub devices: PathBuf,
    /// The agent's private mount area (`/run/voidbox`).
    pub run: PathBuf,
    /// Prefix of the guest paths `/workspace`, `/home/sandbox`, `/etc/hosts`,
    /// `/etc/resolv.conf` and the skill paths in the system root (`/`).
    pub system: PathBuf,
    /// How long to wait for a device node.
    pub device_wait: Duration,
}

impl Layout {
    /// The layout inside the VM.
    pub fn guest() -> Layout {
        Layout {
            devices: PathBuf::from("/dev"),
            run: PathBuf::from("/run/voidbox"),
            system: PathBuf::from("/"),
            device_wait: DEVICE_WAIT,
        }
    }

    /// A guest path in the system root.
    pub fn system_path(&self, guest: &str) -> PathBuf {
        self.system.join(guest.trim_start_matches('/'))
    }

    fn device(&self, name: &str) -> PathBuf {
        self.devices.join(name)
    }
}

/// One step of a disk setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Wait (bounded) for a device node.
    WaitDevice(PathBuf),
    /// `mkdir -p`.
    Mkdir(PathBuf),
    /// Hands a directory to the command user (the top of a writable skill).
    Chown(PathBuf, Credentials),
    /// `mount(2)`.
    Mount {
        /// Device or pseudo-source.
        source: PathBuf,
        /// Mount point.
        target: PathBuf,
        /// Filesystem type.
        fstype: &'static str,
        /// `MS_*` flags.
        flags: libc::c_ulong,
        /// Options string.
        data: String,
    },
}

impl Step {
    /// Performs the step.
    pub fn run(&self, device_wait: Duration) -> Result<(), String> {
        match self {
            Step::WaitDevice(p) => mount::wait_for(p, device_wait),
            Step::Mkdir(p) => mount::mkdir_p(p),
            Step::Chown(p, c) => std::os::unix::fs::chown(p, Some(c.uid), Some(c.gid))
                .map_err(|e| format!("chown {} to {}:{}: {e}", p.display(), c.uid, c.gid)),
            Step::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => mount::mount(source, target, fstype, *flags, data),
        }
    }
}

/// Runs steps in order, stopping at the first failure.
pub fn run_steps(steps: &[Step], device_wait: Duration) -> Result<(), String> {
    steps.iter().try_for_each(|s| s.run(device_wait))
}

fn mount_step(
    source: PathBuf,
    target: PathBuf,
    fstype: &'static str,
    flags: libc::c_ulong,
    data: String,
) -> Step {
    Step::Mount {
        source,
        target,
        fstype,
        flags,
        data,
    }
}

/// Steps mounting `device` read-only at `lower`, a tmpfs at `rw`, and an overlay of the
/// two at `target`.
fn overlay_steps(device: PathBuf, base: &Path, target: &Path) -> Result<Vec<Step>, String> {
    let (lower, rw) = (base.join("lower"), base.join("rw"));
    let (upper, work) = (rw.join("upper"), rw.join("work"));
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    if [&lower, &upper, &work]
        .iter()
        .any(|p| p.to_string_lossy().contains([',', ':']))
    {
        return Err(format!(
            "overlay paths below {} contain `,` or `:`",
            base.display()
        ));
    }
    Ok(vec![
        Step::WaitDevice(device.clone()),
        Step::Mkdir(lower.clone()),
        mount_step(device, lower, "erofs", EROFS_FLAGS, String::new()),
        Step::Mkdir(rw.clone()),
        mount_step("tmpfs".into(), rw, "tmpfs", RW_FLAGS, "mode=0755".into()),
        Step::Mkdir(upper),
        Step::Mkdir(work),
        Step::Mkdir(target.to_path_buf()),
        mount_step(
            "overlay".into(),
            target.to_path_buf(),
            "overlay",
            RW_FLAGS,
            opts,
        ),
    ])
}

/// The steps that mount skill number `index` in the system root. A writable skill's top
/// directory is handed to `user` (the command user), so commands can add files there; the
/// image's own files keep their owners and modes.
pub fn skill_steps(
    layout: &Layout,
    index: usize,
    skill: &SkillDisk,
    user: Credentials,
) -> Result<Vec<Step>, String> {
    let device = layout.device(&skill.device);
    let target = layout.system_path(&skill.path);
    if skill.writable {
        let base = layout.run.join("skills").join(index.to_string());
        let mut steps = overlay_steps(device, &base, &target)?;
        steps.push(Step::Chown(target, user));
        return Ok(steps);
    }
    Ok(vec![
        Step::WaitDevice(device.clone()),
        Step::Mkdir(target.clone()),
        mount_step(device, target, "erofs", EROFS_FLAGS, String::new()),
    ])
}

/// A mount made inside the image root, after the pivot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inside {
    /// A recursive copy of the system root's mounts at `source` (a directory, or a file
    /// when `file`), attached at `target` inside the image. An optional one that fails is
    /// skipped.
    Bind {
        /// Path in the system root (cloned before the pivot).
        source: PathBuf,
        /// Path in the image root.
        target: PathBuf,
        /// The source is a file (the mount point is created as an empty file).
        file: bool,
        /// Whether a failure fails the whole image root.
        required: bool,
    },
    /// A fresh mount (its mount point is created first).
    Mount(Step),
    /// A file of the system root (cloned before the pivot) bound at the same path inside the
    /// image only where the image has none that works: the musl loader that the agent
    /// runtimes name as their interpreter ([`MUSL_LOADER`]). Skipped when the system root
    /// has no such file (no runtimes disk) or the image has its own.
    Provide(PathBuf),
}

/// The musl dynamic loader: Claude Code's interpreter. The system disk links it to the
/// runtimes disk; an image root gets that one unless it has its own (Alpine).
pub const MUSL_LOADER: &str = "/lib/ld-musl-x86_64.so.1";

/// How the image root is built (see [`crate::rootfs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPlan {
    /// Device name, for messages.
    pub device: String,
    /// Steps in the new mount namespace before the pivot: the overlay at `merged`.
    pub prepare: Vec<Step>,
    /// The overlay that becomes `/`.
    pub merged: PathBuf,
    /// Mounts made inside it, in order.
    pub inside: Vec<Inside>,
    /// How long to wait for the device node.
    pub device_wait: Duration,
}

/// Plans the image root on `device`, with the skills of `skills` (mounted in the system
/// root beforehand) brought inside. `sysfs`: whether the system root has a sysfs at `/sys`.
/// `net`: whether the network is up, with its `/etc/resolv.conf` and `/etc/hosts` in
/// [`crate::net::files_dir`]: both are then bound over the image's (required); without
/// network only the system root's `/etc/hosts` is, if it has one, and the image keeps its
/// own `/etc/resolv.conf`.
pub fn root_plan(
    layout: &Layout,
    device: &str,
    skills: &[SkillDisk],
    sysfs: bool,
    net: bool,
) -> Result<RootPlan, String> {
    let base = layout.run.join("rootfs");
    let merged = base.join("merged");
    let prepare = overlay_steps(layout.device(device), &base, &merged)?;
    let bind = |source: PathBuf, target: &str, file: bool, required: bool| Inside::Bind {
        source,
        target: PathBuf::from(target),
        file,
        required,
    };
    let mut inside = vec![
        bind("/proc".into(), "/proc", false, true),
        bind("/dev".into(), "/dev", false, true),
    ];
    if sysfs {
        inside.push(bind("/sys".into(), "/sys", false, false));
    }
    inside.push(Inside::Mount(mount_step(
        "tmpfs".into(),
        "/tmp".into(),
        "tmpfs",
        RW_FLAGS,
        "mode=1777".into(),
    )));
    for tree in BOUND_TREES {
        inside.push(bind(layout.system_path(tree), tree, false, true));
    }
    if net {
        let dir = crate::net::files_dir(layout);
        for (file, name) in crate::net::FILES {
            inside.push(bind(dir.join(name), file, true, true));
        }
    } else {
        let source = layout.system_path("/etc/hosts");
        if source.is_file() {
            inside.push(bind(source, "/etc/hosts", true, false));
        }
    }
    for s in skills {
        if !BOUND_TREES
            .iter()
            .any(|t| voidbox_protocol::guest_paths::at_or_under(&s.path, t))
        {
            inside.push(bind(layout.system_path(&s.path), &s.path, false, true));
        }
    }
    // With the runtimes disk mounted, its loader resolves: agents run in any image.
    if !skills.is_empty() && layout.system_path(MUSL_LOADER).is_file() {
        inside.push(Inside::Provide(PathBuf::from(MUSL_LOADER)));
    }
    Ok(RootPlan {
        device: device.to_string(),
        prepare,
        merged,
        inside,
        device_wait: layout.device_wait,
    })
}

/// Sets up the disks of `params` and returns the root commands run in (logging every
/// problem on the console). With a `voidbox.user`, `/workspace` and `/home/sandbox` are
/// handed to that user. `net`: whether the network is up (see [`root_plan`]).
pub fn setup(params: &DiskParams, layout: &Layout, net: bool) -> ExecRoot {
    let started = Instant::now();
    let mut failures: Vec<String> = params.invalid.clone();
    if let Some(user) = params.user {
        for dir in ["/workspace", "/home/sandbox"] {
            let p = layout.system_path(dir);
            if let Err(e) = std::os::unix::fs::chown(&p, Some(user.uid), Some(user.gid)) {
                crate::log!(
                    "warning: chown {} to {}:{}: {e}",
                    p.display(),
                    user.uid,
                    user.gid
                );
            }
        }
    }
    let mut mounted = Vec::new();
    for (i, skill) in params.mounts.iter().enumerate() {
        let user = params.user.unwrap_or(crate::spawn::SANDBOX);
        let result = skill_steps(layout, i, skill, user)
            .and_then(|steps| run_steps(&steps, layout.device_wait));
        match result {
            Ok(()) => mounted.push(skill.clone()),
            Err(e) => failures.push(format!("skill {} at {}: {e}", skill.device, skill.path)),
        }
    }
    let mut root = ExecRoot::System;
    if let Some(device) = &params.rootfs {
        let sysfs = mount::is_sysfs(Path::new("/sys"));
        let built = root_plan(layout, device, &mounted, sysfs, net).and_then(ImageRoot::build);
        match built {
            Ok(image) => root = ExecRoot::Image(image),
            Err(e) => failures.push(format!("image root {device}: {e}")),
        }
    }
    for f in &failures {
        crate::log!("error: disk setup: {f}");
    }
    if !failures.is_empty() {
        return ExecRoot::Broken(
            format!("the node's disks failed at boot: {}", failures.join("; ")).into(),
        );
    }
    if !params.is_empty() {
        crate::log!(
            "disks ready in {} ms: {}{} skill(s)",
            started.elapsed().as_millis(),
            params
                .rootfs
                .as_ref()
                .map_or(String::new(), |d| format!("image root {d}, ")),
            mounted.len()
        );
    }
    root
}

/// Boot-time entry point (PID 1, after the base filesystems are mounted and the network
/// is configured): reads the disk parameters from `/proc/cmdline` (their warnings were
/// logged when the command line was first parsed), sets the disks up and records the exec
/// root and user in `config`. A network that failed at boot ([`crate::net::NetState`])
/// breaks the exec root too.
pub fn attach(mut config: AgentConfig) -> AgentConfig {
    match crate::cmdline::read_boot_params("/proc/cmdline") {
        Ok(p) if p.disks.is_empty() && p.disks.user.is_none() => {}
        Ok(p) => {
            config.exec_env.root = setup(&p.disks, &Layout::guest(), config.net.is_up());
            if let (Some(user), Some(_)) = (p.disks.user, config.exec_env.creds) {
                config.exec_env.creds = Some(user);
            }
        }
        Err(e) => crate::log!("error: cannot read /proc/cmdline for the disks: {e}"),
    }
    if let Some(why) = config.net.failure() {
        config.exec_env.root = config.exec_env.root.also_broken(why);
    }
    config
}

#[cfg(test)]
mod tests;
