//! Disks a VM gets besides its system disk: an OCI image as the node's root filesystem
//! (`sandbox.image`) and OCI skills mounted at guest paths — and the `voidbox.*` boot
//! parameters that tell the guest agent what to do with them.
//!
//! The system disk is always `/dev/vda`; the disks here follow as `/dev/vdb`, `/dev/vdc`, …
//! in order. The guest agent mounts them at boot, before it listens, so a golden snapshot
//! taken at "agent ready" already holds the mounts (its key includes every disk's identity).

use std::path::PathBuf;

use voidbox_vmm::config::{DiskConfig, MAX_DISKS};

/// What the guest does with a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskRole {
    /// The node's root filesystem: commands run inside it (overlay with a tmpfs upper).
    Rootfs,
    /// An OCI skill mounted at an absolute guest path; `writable` puts a tmpfs overlay on it
    /// (writes succeed and are discarded with the VM).
    Skill {
        /// Absolute guest path.
        mount: String,
        /// Overlay with a tmpfs upper instead of a read-only mount.
        writable: bool,
    },
    /// The runtimes disk (the agent CLIs, [`crate::runtimes`]), read-only at its mount.
    Runtimes {
        /// Absolute guest path.
        mount: String,
    },
}

/// A read-only image disk attached to a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageDisk {
    /// The erofs file.
    pub path: PathBuf,
    /// Its identity for snapshot keys (the image's manifest digest).
    pub digest: String,
    /// What the guest does with it.
    pub role: DiskRole,
}

/// The image-related settings of one VM.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmDisks {
    /// Disks after the system disk, in guest order.
    pub images: Vec<ImageDisk>,
    /// uid:gid commands run as (the image's `User`; `None`: the sandbox user).
    pub user: Option<(u32, u32)>,
    /// Host shares go where the read-only system disk cannot take mount points
    /// ([`voidbox_protocol::guest_paths::needs_writable_root`]): the guest makes its root
    /// writable at boot. Set by [`super::SandboxConfig::set_shares`]; moot with a `Rootfs`
    /// image (commands run in the image's writable overlay).
    pub writable_root: bool,
}

impl VmDisks {
    /// True when the VM boots with the system disk only.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty() && self.user.is_none() && !self.root_param()
    }

    /// Whether the guest is asked for a writable system root.
    fn root_param(&self) -> bool {
        self.writable_root && !self.images.iter().any(|d| d.role == DiskRole::Rootfs)
    }

    /// Checks what the guest agent would refuse: too many disks, a second root, mount
    /// paths it cannot take on its command line, uid 0.
    pub fn check(&self) -> Result<(), String> {
        if self.images.len() + 1 > MAX_DISKS {
            return Err(format!(
                "{} image disks plus the system disk exceed the limit of {MAX_DISKS} disks per VM",
                self.images.len()
            ));
        }
        if self
            .images
            .iter()
            .filter(|d| d.role == DiskRole::Rootfs)
            .count()
            > 1
        {
            return Err("a VM has at most one root filesystem image".into());
        }
        for d in &self.images {
            if let DiskRole::Skill { mount, .. } | DiskRole::Runtimes { mount } = &d.role {
                check_mount_path(mount)?;
            }
        }
        if self.user.is_some_and(|(uid, gid)| uid == 0 || gid == 0) {
            return Err("commands never run as root in the guest (uid or gid 0)".into());
        }
        Ok(())
    }

    /// The VMM's disks after `system` (which becomes `/dev/vda`).
    pub fn vm_disks(&self, system: &std::path::Path) -> Vec<DiskConfig> {
        std::iter::once(DiskConfig {
            path: system.to_path_buf(),
            read_only: true,
        })
        .chain(self.images.iter().map(|d| DiskConfig {
            path: d.path.clone(),
            read_only: true,
        }))
        .collect()
    }

    /// The guest agent's boot parameters: `voidbox.rootfs=vdX`, `voidbox.mount=vdX:PATH:ro|rw`,
    /// `voidbox.user=UID:GID`.
    pub fn boot_params(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, d) in self.images.iter().enumerate() {
            let dev = device_name(i + 1);
            match &d.role {
                DiskRole::Rootfs => out.push(format!("voidbox.rootfs={dev}")),
                DiskRole::Skill { mount, writable } => out.push(format!(
                    "voidbox.mount={dev}:{mount}:{}",
                    if *writable { "rw" } else { "ro" }
                )),
                DiskRole::Runtimes { mount } => out.push(format!("voidbox.mount={dev}:{mount}:ro")),
            }
        }
        if let Some((uid, gid)) = self.user {
            out.push(format!("voidbox.user={uid}:{gid}"));
        }
        if self.root_param() {
            out.push(voidbox_protocol::guest_paths::WRITABLE_ROOT_PARAM.into());
        }
        out
    }

    /// What snapshot keys depend on: each disk's identity and role, and the user.
    pub fn key_parts(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .images
            .iter()
            .map(|d| format!("{}={:?}", d.digest, d.role))
            .collect();
        if let Some((u, g)) = self.user {
            v.push(format!("user={u}:{g}"));
        }
        if self.root_param() {
            v.push("root=rw".into());
        }
        v
    }
}

/// `vda`, `vdb`, … for disk `index` (0 = the system disk).
pub fn device_name(index: usize) -> String {
    let letter = (b'a' + (index % 26) as u8) as char;
    format!("vd{letter}")
}

/// Longest guest mount path the agent accepts.
pub const MAX_MOUNT_PATH: usize = 256;

/// A guest mount path the guest agent takes on its command line: absolute, normalised
/// (no `.`/`..`/empty components), no whitespace, `:` or `,`, not `/` itself and not inside
/// the guest's own system paths.
pub fn check_mount_path(p: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("guest mount path `{p}` {why}"));
    if !p.starts_with('/') {
        return bad("must be absolute");
    }
    if p.len() > MAX_MOUNT_PATH {
        return bad(&format!("is longer than {MAX_MOUNT_PATH} bytes"));
    }
    if p.chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == ':' || c == ',')
    {
        return bad("must not contain whitespace, `:` or `,`");
    }
    let parts: Vec<&str> = p[1..].split('/').collect();
    if parts
        .iter()
        .any(|c| c.is_empty() || *c == "." || *c == "..")
    {
        return bad("must be normalised (no empty, `.` or `..` components, no trailing `/`)");
    }
    const RESERVED: &[&str] = &["proc", "sys", "dev", "run", "workspace", "tmp"];
    if RESERVED.contains(&parts[0]) {
        return bad("must not be inside /proc, /sys, /dev, /run, /tmp or /workspace");
    }
    if p == "/home" || p == "/home/sandbox" || p == "/etc/voidbox" || p.starts_with("/etc/voidbox/")
    {
        return bad("must not be /home, /home/sandbox or inside /etc/voidbox");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(digest: &str, role: DiskRole) -> ImageDisk {
        ImageDisk {
            path: PathBuf::from(format!("/c/{digest}.erofs")),
            digest: digest.into(),
            role,
        }
    }

    #[test]
    fn params_name_devices_after_the_system_disk() {
        let d = VmDisks {
            images: vec![
                disk("sha256:a", DiskRole::Rootfs),
                disk(
                    "sha256:b",
                    DiskRole::Skill {
                        mount: "/skills/py".into(),
                        writable: false,
                    },
                ),
                disk(
                    "sha256:c",
                    DiskRole::Skill {
                        mount: "/opt/tools".into(),
                        writable: true,
                    },
                ),
            ],
            user: Some((1001, 1002)),
            // An image root is writable already: no `voidbox.root=rw`.
            writable_root: true,
        };
        d.check().unwrap();
        assert_eq!(
            d.boot_params(),
            [
                "voidbox.rootfs=vdb",
                "voidbox.mount=vdc:/skills/py:ro",
                "voidbox.mount=vdd:/opt/tools:rw",
                "voidbox.user=1001:1002"
            ]
        );
        let vm = d.vm_disks(&PathBuf::from("/img/system.erofs"));
        assert_eq!(vm.len(), 4);
        assert_eq!(vm[0].path, PathBuf::from("/img/system.erofs"));
        assert!(vm.iter().all(|d| d.read_only));
        assert_eq!(vm[2].path, PathBuf::from("/c/sha256:b.erofs"));
        // The key changes with any disk, role or user.
        let mut other = d.clone();
        other.user = Some((1001, 1001));
        assert_ne!(d.key_parts(), other.key_parts());
        let mut other = d.clone();
        other.images[1].role = DiskRole::Skill {
            mount: "/skills/py".into(),
            writable: true,
        };
        assert_ne!(d.key_parts(), other.key_parts());
        assert!(VmDisks::default().is_empty());
    }

    #[test]
    fn shares_outside_the_tmpfs_trees_ask_for_a_writable_root() {
        let d = VmDisks {
            writable_root: true,
            ..VmDisks::default()
        };
        assert!(!d.is_empty());
        assert_eq!(d.boot_params(), ["voidbox.root=rw"]);
        assert_ne!(d.key_parts(), VmDisks::default().key_parts());
    }

    #[test]
    fn refusals() {
        let two_roots = VmDisks {
            images: vec![disk("a", DiskRole::Rootfs), disk("b", DiskRole::Rootfs)],
            user: None,
            writable_root: false,
        };
        assert!(two_roots.check().unwrap_err().contains("one root"));
        let root_user = VmDisks {
            images: vec![],
            user: Some((0, 0)),
            writable_root: false,
        };
        assert!(root_user.check().unwrap_err().contains("root"));
        let many = VmDisks {
            images: (0..MAX_DISKS)
                .map(|i| {
                    disk(
                        &i.to_string(),
                        DiskRole::Skill {
                            mount: format!("/s/{i}"),
                            writable: false,
                        },
                    )
                })
                .collect(),
            user: None,
            writable_root: false,
        };
        assert!(many.check().unwrap_err().contains("limit"));
        for bad in [
            "rel/path",
            "/",
            "/a//b",
            "/a/../b",
            "/a/./b",
            "/a/",
            "/a b",
            "/a:b",
            "/a,b",
            "/proc/x",
            "/workspace",
            "/dev",
            "/home",
            "/home/sandbox",
            "/etc/voidbox/x",
        ] {
            assert!(check_mount_path(bad).is_err(), "{bad}");
        }
        for good in [
            "/skills/python",
            "/opt/x-1.2",
            "/mnt",
            "/home/other",
            "/etc/x",
        ] {
            check_mount_path(good).unwrap();
        }
        assert!(check_mount_path(&format!("/{}", "a".repeat(300))).is_err());
    }
}
