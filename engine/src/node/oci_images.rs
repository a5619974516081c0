//! Before any VM starts: every OCI image the plan names is pulled (or found in the cache)
//! and every user-supplied kernel and initramfs is checked, so that a registry that is down,
//! a refused login, a digest mismatch or a missing file ends the run with exit code 3 and
//! the spec location of the field — nothing half-started.
//!
//! The result, per node, is what its VM boots ([`NodeVm`]): the image disks after the system
//! disk (`sandbox.image` as the root filesystem, OCI skills at their mount paths), the
//! image's `User`, `Env` and `WorkingDir`, and a boot override for `sandbox.kernel`,
//! `sandbox.initramfs` and `sandbox.guest_image`.

use std::collections::{BTreeMap, HashMap};

use voidbox_oci::{PulledImage, RuntimeConfig};

use super::refusals::{locate, NodeField, Refusal, SpecSource};
use crate::output::ProgressMode;
use crate::plan::{Action, Plan, PlanNode};
use crate::sandbox::boot::{custom_boot, BootSource};
use crate::sandbox::disks::{DiskRole, ImageDisk, VmDisks};
use crate::sandbox::GuestImage;
use crate::spec::model::SkillEntry;

/// The sandbox user commands run as when an image names none (or names root).
pub const SANDBOX_USER: (u32, u32) = (1000, 1000);

/// What one node's VM boots and how its commands start.
#[derive(Debug, Clone, Default)]
pub struct NodeVm {
    /// Boot override (`sandbox.kernel`, `sandbox.initramfs`, `sandbox.guest_image`).
    pub image: Option<GuestImage>,
    /// Image disks and the user.
    pub disks: VmDisks,
    /// The root image's `Env` (`KEY=VALUE`), before the spec's.
    pub env: Vec<(String, String)>,
    /// The root image's `WorkingDir`.
    pub workdir: Option<String>,
    /// The root image's `Entrypoint`: with its `Cmd` (or `run.args`), what a command node
    /// without `run.program` runs ([`command_line`]).
    pub entrypoint: Vec<String>,
    /// The root image's `Cmd`.
    pub cmd: Vec<String>,
    /// Notes for the run's log (e.g. an image user mapped to the sandbox user).
    pub notices: Vec<String>,
}

/// One failed preparation, with the node and field it belongs to.
struct Failure {
    node: String,
    field: NodeField<'static>,
    message: String,
    help: &'static str,
}

const PULL_HELP: &str = "check the reference, the registry and its credentials (`voidbox pull REF` shows the same error); images pinned by digest work offline once cached";

/// Pulls what the plan needs. `Err` holds located refusals (exit 3); `src` is the spec
/// source when there is one (else the errors are located at the field names only).
pub fn prepare(
    plan: &Plan,
    base: &GuestImage,
    src: Option<&SpecSource>,
    progress: ProgressMode,
) -> Result<HashMap<String, NodeVm>, Result<Vec<Refusal>, String>> {
    let mut pulled: BTreeMap<String, Result<PulledImage, String>> = BTreeMap::new();
    let mut pull = |reference: &str| -> Result<PulledImage, String> {
        pulled
            .entry(reference.to_string())
            .or_insert_with(|| {
                crate::oci::pull_blocking(reference, &crate::oci::pull_options(), progress)
                    .map_err(|e| format!("pulling `{reference}`: {e}"))
            })
            .clone()
    };
    let mut boots: BTreeMap<String, Result<GuestImage, String>> = BTreeMap::new();
    let mut out = HashMap::new();
    let mut failures: Vec<Failure> = Vec::new();
    for n in plan.graph.node_weights() {
        match node_vm(n, base, &mut pull, &mut boots) {
            Ok(vm) => {
                out.insert(n.name.clone(), vm);
            }
            Err(f) => failures.extend(f),
        }
    }
    if failures.is_empty() {
        return Ok(out);
    }
    Err(match src {
        Some(src) => {
            let mut seen = std::collections::BTreeSet::new();
            Ok(failures
                .into_iter()
                .map(|f| locate(plan, src, &f.node, f.field, f.message, f.help))
                .filter(|r| seen.insert((r.line, r.column, r.message.clone())))
                .collect())
        }
        None => Err(failures
            .iter()
            .map(|f| format!("node `{}`: {}", f.node, f.message))
            .collect::<Vec<_>>()
            .join("\n")),
    })
}

fn node_vm(
    n: &PlanNode,
    base: &GuestImage,
    pull: &mut dyn FnMut(&str) -> Result<PulledImage, String>,
    boots: &mut BTreeMap<String, Result<GuestImage, String>>,
) -> Result<NodeVm, Vec<Failure>> {
    let mut vm = NodeVm::default();
    let mut failures = Vec::new();
    let fail = |field: NodeField<'static>, message: String, help: &'static str| Failure {
        node: n.name.clone(),
        field,
        message,
        help,
    };
    if let Some(reference) = &n.sandbox.image {
        match pull(reference).and_then(|p| root_image(&p, &mut vm)) {
            Ok(()) => {
                if let Action::Command(c) = &n.action {
                    if let Err(e) = command_line(c, Some(&vm)) {
                        failures.push(fail(
                            NodeField::Sandbox("image"),
                            format!("`{reference}`: {e}"),
                            "set `run.program`, or use an image with an Entrypoint or Cmd",
                        ));
                    }
                }
            }
            Err(e) => failures.push(fail(NodeField::Sandbox("image"), e, PULL_HELP)),
        }
    }
    if let Action::Agent(ag) = &n.action {
        for (i, s) in ag.skills.iter().enumerate() {
            let SkillEntry::Oci(skill) = s else { continue };
            match pull(&skill.image) {
                Ok(p) => vm.disks.images.push(ImageDisk {
                    path: p.rootfs_disk.clone(),
                    digest: p.manifest_digest.clone(),
                    role: DiskRole::Skill {
                        mount: skill.mount.clone(),
                        writable: !skill.readonly,
                    },
                }),
                Err(e) => failures.push(fail(NodeField::Skill(i), e, PULL_HELP)),
            }
        }
    }
    if let Err(e) = vm.disks.check() {
        failures.push(fail(
            NodeField::Sandbox("image"),
            e,
            "use fewer image skills, or other mount paths",
        ));
    }
    let source = BootSource {
        kernel: n.sandbox.kernel.clone(),
        initramfs: n.sandbox.initramfs.clone(),
        guest_image: n.sandbox.guest_image.clone(),
    };
    if !source.is_default() {
        if source.initramfs.is_some() && n.sandbox.image.is_some() {
            failures.push(fail(
                NodeField::Sandbox("initramfs"),
                "`sandbox.initramfs` and `sandbox.image` cannot be combined: with an initramfs the guest's root is the initramfs, so there is no system root to run an image root from".into(),
                "remove one of them",
            ));
        }
        let key = format!("{source:?}");
        let boot = boots
            .entry(key)
            .or_insert_with(|| {
                let files = match &source.guest_image {
                    Some(r) => crate::oci::pull_boot_files_blocking(
                        r,
                        &crate::oci::pull_options(),
                        ProgressMode::Auto,
                    )
                    .map(Some)
                    .map_err(|e| format!("pulling the guest image `{r}`: {e}")),
                    None => Ok(None),
                };
                files.and_then(|f| custom_boot(base, &source, f.as_ref()))
            })
            .clone();
        match boot {
            Ok(img) => vm.image = Some(img),
            Err(e) => {
                let field = if source.guest_image.is_some() {
                    "guest_image"
                } else if source.initramfs.is_some() {
                    "initramfs"
                } else {
                    "kernel"
                };
                failures.push(fail(
                    NodeField::Sandbox(field),
                    e,
                    "point it at a readable x86-64 kernel (vmlinux or bzImage) and an uncompressed or gzip newc initramfs",
                ));
            }
        }
    }
    if failures.is_empty() {
        Ok(vm)
    } else {
        Err(failures)
    }
}

/// Makes `p` the node's root filesystem: its disk first, its `User`, `Env` and `WorkingDir`.
fn root_image(p: &PulledImage, vm: &mut NodeVm) -> Result<(), String> {
    vm.disks.images.insert(
        0,
        ImageDisk {
            path: p.rootfs_disk.clone(),
            digest: p.manifest_digest.clone(),
            role: DiskRole::Rootfs,
        },
    );
    let (user, notice) = image_user(&p.config)?;
    vm.disks.user = Some(user);
    vm.notices.extend(notice);
    vm.env = image_env(&p.config);
    vm.workdir = p.config.working_dir.clone().filter(|w| !w.is_empty());
    vm.entrypoint = p.config.entrypoint.clone();
    vm.cmd = p.config.cmd.clone();
    Ok(())
}

/// The program and arguments of a command node: `run.program` and `run.args`, or without a
/// program the root image's `Entrypoint` followed by `run.args` when given, else by its
/// `Cmd` (Docker's rule). `Err` when there is no program and nothing to run in its place.
pub fn command_line(
    c: &crate::spec::model::Command,
    vm: Option<&NodeVm>,
) -> Result<(String, Vec<String>), String> {
    if let Some(p) = &c.program {
        return Ok((p.clone(), c.args.clone()));
    }
    let Some(vm) = vm.filter(|v| v.disks.images.iter().any(|d| d.role == DiskRole::Rootfs)) else {
        return Err("`run` names no program and the node has no image to take one from".into());
    };
    let tail = if c.args.is_empty() { &vm.cmd } else { &c.args };
    let mut argv = vm.entrypoint.iter().chain(tail).cloned();
    match argv.next().filter(|p| !p.is_empty()) {
        Some(program) => Ok((program, argv.collect())),
        None if vm.entrypoint.is_empty() && vm.cmd.is_empty() => {
            Err("the image has neither Entrypoint nor Cmd, and `run` names no program".into())
        }
        None => Err("the image's entrypoint starts with an empty program name".into()),
    }
}

/// The uid:gid commands run as for an image's `User`: the sandbox user when it names none or
/// root (workloads never run as root: the guest agent's session secret must stay out of
/// their reach); a group 0 becomes the sandbox group. A `User` the image does not define is
/// an error.
pub fn image_user(c: &RuntimeConfig) -> Result<((u32, u32), Option<String>), String> {
    let named = c.user.as_deref().filter(|u| !u.is_empty());
    match (named, c.resolved_user) {
        (None, _) => Ok((SANDBOX_USER, None)),
        (Some(u), None) => Err(format!(
            "the image's `User` `{u}` is not defined in its /etc/passwd (or /etc/group)"
        )),
        (Some(u), Some((0, _))) => Ok((
            SANDBOX_USER,
            Some(format!(
                "the image's `User` `{u}` is root; commands run as the sandbox user 1000:1000"
            )),
        )),
        (Some(_), Some((uid, 0))) => Ok(((uid, SANDBOX_USER.1), None)),
        (Some(_), Some(ug)) => Ok((ug, None)),
    }
}

/// The image's `Env` as pairs (entries without `=` are dropped, as the OCI spec says they
/// are invalid).
pub fn image_env(c: &RuntimeConfig) -> Vec<(String, String)> {
    c.env
        .iter()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(user: Option<&str>, resolved: Option<(u32, u32)>) -> RuntimeConfig {
        RuntimeConfig {
            env: vec!["PATH=/usr/bin:/bin".into(), "A=b=c".into(), "bad".into()],
            working_dir: Some("/app".into()),
            user: user.map(str::to_string),
            resolved_user: resolved,
            entrypoint: vec![],
            cmd: vec![],
        }
    }

    #[test]
    fn users_map_to_non_root() {
        assert_eq!(image_user(&cfg(None, None)).unwrap().0, SANDBOX_USER);
        assert_eq!(
            image_user(&cfg(Some("app"), Some((1001, 1002)))).unwrap().0,
            (1001, 1002)
        );
        let (u, note) = image_user(&cfg(Some("root"), Some((0, 0)))).unwrap();
        assert_eq!(u, SANDBOX_USER);
        assert!(note.unwrap().contains("root"));
        assert_eq!(
            image_user(&cfg(Some("1001:0"), Some((1001, 0)))).unwrap().0,
            (1001, 1000)
        );
        assert!(image_user(&cfg(Some("ghost"), None))
            .unwrap_err()
            .contains("ghost"));
    }

    #[test]
    fn entrypoint_and_cmd_follow_dockers_rule() {
        let cmd = |program: Option<&str>, args: &[&str]| crate::spec::model::Command {
            program: program.map(str::to_string),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: Default::default(),
            workdir: None,
        };
        let image = |entrypoint: &[&str], cmd: &[&str]| NodeVm {
            disks: VmDisks {
                images: vec![ImageDisk {
                    path: "/c/i.erofs".into(),
                    digest: "sha256:i".into(),
                    role: DiskRole::Rootfs,
                }],
                ..VmDisks::default()
            },
            entrypoint: entrypoint.iter().map(|a| a.to_string()).collect(),
            cmd: cmd.iter().map(|a| a.to_string()).collect(),
            ..NodeVm::default()
        };
        let line = |c, vm: &NodeVm| command_line(&c, Some(vm));
        let both = image(&["/bin/serve", "--quiet"], &["--port", "80"]);
        assert_eq!(
            line(cmd(None, &[]), &both).unwrap(),
            (
                "/bin/serve".into(),
                vec!["--quiet".into(), "--port".into(), "80".into()]
            )
        );
        // `args` replace `Cmd`, never the entrypoint.
        assert_eq!(
            line(cmd(None, &["--port", "8080"]), &both).unwrap(),
            (
                "/bin/serve".into(),
                vec!["--quiet".into(), "--port".into(), "8080".into()]
            )
        );
        // Without an entrypoint, `Cmd` (or `args`) is the whole command line.
        let only_cmd = image(&[], &["python3", "-m", "http.server"]);
        assert_eq!(
            line(cmd(None, &[]), &only_cmd).unwrap().0,
            "python3".to_string()
        );
        assert_eq!(
            line(cmd(None, &["sh", "-c", "true"]), &only_cmd).unwrap(),
            ("sh".into(), vec!["-c".into(), "true".into()])
        );
        // A program always wins (Docker's `--entrypoint`).
        assert_eq!(
            line(cmd(Some("env"), &[]), &both).unwrap(),
            ("env".into(), vec![])
        );
        assert!(line(cmd(None, &[]), &image(&[], &[]))
            .unwrap_err()
            .contains("neither Entrypoint nor Cmd"));
        assert!(line(cmd(None, &[]), &image(&[""], &[])).is_err());
        assert!(command_line(&cmd(None, &[]), None).is_err());
    }

    #[test]
    fn env_pairs() {
        assert_eq!(
            image_env(&cfg(None, None)),
            [
                ("PATH".to_string(), "/usr/bin:/bin".to_string()),
                ("A".to_string(), "b=c".to_string())
            ]
        );
    }
}
