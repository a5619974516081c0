//! The node's image as the root filesystem of its commands.
//!
//! At boot a dedicated thread ("image-root") leaves the agent's mount namespace
//! (`unshare(CLONE_NEWNS)`, all mounts private), mounts the image's overlay, clones the
//! system root's `/proc`, `/dev`, `/sys`, `/workspace`, `/home/sandbox` (and `/etc/hosts`,
//! with network the generated `/etc/resolv.conf` too, and skills) as detached mount trees,
//! `pivot_root`s into the overlay and detaches the old root, then attaches the clones and a
//! fresh `/tmp` at their places inside (a file's mount point that is a symlink in the image
//! is replaced by a plain file first: [`crate::mount::file_mount_point`]). Every mount
//! point is created and resolved *after* the pivot, so a symlink in the image
//! (`/workspace -> /etc`) can only point inside the image, never at the agent's files.
//! The namespace is kept alive by an fd, and the thread stays in it to resolve
//! program names for the allowlist check ([`ImageRoot::run`]): PATH lookup happens in the
//! image.
//!
//! Each exec or PTY child then joins that namespace with `setns(CLONE_NEWNS)` before it
//! changes directory, drops privileges and executes (see [`crate::spawn`]); `setns` puts
//! its root and working directory at the image's `/`. Its children stay inside: an
//! unprivileged process cannot change its mount namespace or root. The agent itself never
//! enters the image, and its file RPCs see the same `/workspace` and `/home/sandbox`.
//!
//! Compared with an `unshare` + `pivot_root` in every child, this costs each exec one
//! system call instead of a copy of the whole mount tree, and the mounts are made once,
//! at boot, so a golden snapshot holds them.

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::Arc;

use crate::disks::{run_steps, Inside, RootPlan};
use crate::mount;

/// Where commands run.
#[derive(Clone, Default)]
pub enum ExecRoot {
    /// The agent's own root filesystem.
    #[default]
    System,
    /// The node's image.
    Image(Arc<ImageRoot>),
    /// The disks or the network failed at boot: every exec fails with this message.
    Broken(Arc<str>),
}

impl ExecRoot {
    /// This root with every exec failing with `why` as well (after the root's own reason,
    /// when it is broken already).
    pub fn also_broken(self, why: &str) -> ExecRoot {
        match self {
            ExecRoot::Broken(first) => ExecRoot::Broken(format!("{first}; {why}").into()),
            _ => ExecRoot::Broken(why.into()),
        }
    }
}

impl fmt::Debug for ExecRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecRoot::System => f.write_str("System"),
            ExecRoot::Image(i) => write!(f, "Image({})", i.device),
            ExecRoot::Broken(m) => write!(f, "Broken({m:?})"),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A mount namespace whose root is the node's image, and a thread living in it.
pub struct ImageRoot {
    device: String,
    ns: OwnedFd,
    jobs: Sender<Job>,
}

impl ImageRoot {
    /// Builds the image root following `plan` on a new thread that stays in it.
    pub fn build(plan: RootPlan) -> Result<Arc<ImageRoot>, String> {
        let (ready_tx, ready_rx) = sync_channel::<Result<OwnedFd, String>>(1);
        let (jobs_tx, jobs_rx) = channel::<Job>();
        let device = plan.device.clone();
        std::thread::Builder::new()
            .name("image-root".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let built = enter(&plan);
                let ok = built.is_ok();
                if ready_tx.send(built).is_err() || !ok {
                    return;
                }
                for job in jobs_rx {
                    if catch_unwind(AssertUnwindSafe(job)).is_err() {
                        crate::log!("a job in the image root panicked");
                    }
                }
            })
            .map_err(|e| format!("cannot start the image-root thread: {e}"))?;
        let ns = ready_rx
            .recv()
            .map_err(|_| "the image-root thread died".to_string())??;
        Ok(Arc::new(ImageRoot {
            device,
            ns,
            jobs: jobs_tx,
        }))
    }

    /// The mount namespace (for `setns(CLONE_NEWNS)` in a child).
    pub fn namespace_fd(&self) -> RawFd {
        self.ns.as_raw_fd()
    }

    /// Runs `f` on the thread inside the image root (its `/` is the image's) and returns
    /// its result.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        let (tx, rx) = sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.jobs
            .send(job)
            .map_err(|_| "the image-root thread is gone".to_string())?;
        rx.recv()
            .map_err(|_| "a job in the image root failed".to_string())
    }
}

/// On the image-root thread: a private mount namespace, the overlay, the pivot, the
/// mounts inside. Returns the namespace fd.
fn enter(plan: &RootPlan) -> Result<OwnedFd, String> {
    // SAFETY: unshare with a flag constant; it affects only this thread (CLONE_NEWNS
    // implies a private copy of its fs_struct).
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } < 0 {
        return Err(format!(
            "unshare(CLONE_NEWNS): {}",
            std::io::Error::last_os_error()
        ));
    }
    mount::make_private()?;
    let ns = std::fs::File::open("/proc/thread-self/ns/mnt")
        .map(OwnedFd::from)
        .map_err(|e| format!("opening /proc/thread-self/ns/mnt: {e}"))?;
    run_steps(&plan.prepare, plan.device_wait)?;
    // Clone what goes inside while the system root is still reachable.
    let mut clones = Vec::with_capacity(plan.inside.len());
    for step in &plan.inside {
        clones.push(match step {
            Inside::Bind {
                source, required, ..
            } => match mount::clone_tree(source) {
                Ok(fd) => Some(fd),
                Err(e) if *required => return Err(e),
                Err(e) => {
                    crate::debug!("image root: skipped: {e}");
                    None
                }
            },
            Inside::Provide(path) => match mount::clone_tree(path) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    crate::debug!("image root: {} not provided: {e}", path.display());
                    None
                }
            },
            Inside::Mount(_) => None,
        });
    }
    mount::pivot_into(&plan.merged)?;
    for (step, clone) in plan.inside.iter().zip(clones) {
        match step {
            Inside::Bind {
                target,
                file,
                required,
                ..
            } => {
                let Some(tree) = clone else { continue };
                let result = if *file {
                    mount::file_mount_point(target)
                } else {
                    mount::mkdir_p(target)
                }
                .and_then(|()| mount::attach_clone(&tree, target));
                match result {
                    Ok(()) => {}
                    Err(e) if *required => return Err(e),
                    Err(e) => crate::debug!("image root: skipped: {e}"),
                }
            }
            Inside::Provide(path) => {
                // The image's own (a file, or a link to one) stays.
                let Some(tree) = clone.filter(|_| !path.is_file()) else {
                    continue;
                };
                if let Err(e) =
                    mount::file_mount_point(path).and_then(|()| mount::attach_clone(&tree, path))
                {
                    crate::log!("image root: providing {}: {e}", path.display());
                }
            }
            Inside::Mount(m) => {
                if let crate::disks::Step::Mount { target, .. } = m {
                    mount::mkdir_p(target)?;
                }
                m.run(plan.device_wait)?;
            }
        }
    }
    std::env::set_current_dir(Path::new("/")).map_err(|e| format!("chdir /: {e}"))?;
    Ok(ns)
}
