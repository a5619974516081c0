//! Reads a failed boot's console for the reason a guest kernel could not run the guest agent,
//! so that a user-supplied kernel (`sandbox.kernel`, `sandbox.guest_image`) lacking what
//! voidbox needs is named — "needs `CONFIG_EROFS_FS=y`" — instead of a bare timeout.

/// One known failure: console substrings that must all appear on one line, and the
/// explanation.
struct Known {
    all_of: &'static [&'static str],
    why: &'static str,
}

/// Most specific first: the first line matching any entry decides.
const KNOWN: &[Known] = &[
    Known {
        all_of: &[
            "Unknown kernel command line parameters",
            "virtio_mmio.device=",
        ],
        why: "the kernel does not take virtio-mmio devices from its command line: it needs \
              CONFIG_VIRTIO_MMIO=y and CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y",
    },
    Known {
        all_of: &["No filesystem could mount root"],
        why: "the kernel cannot read the system disk's file system: it needs CONFIG_EROFS_FS=y \
              (built in, not a module)",
    },
    Known {
        all_of: &["VFS: Cannot open root device"],
        why: "the kernel found no /dev/vda for the system disk: it needs CONFIG_VIRTIO_MMIO=y, \
              CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y and CONFIG_VIRTIO_BLK=y (built in, not \
              modules)",
    },
    Known {
        all_of: &["Unable to mount root fs"],
        why: "the kernel cannot mount the system disk as its root: it needs CONFIG_VIRTIO_BLK=y \
              and CONFIG_EROFS_FS=y (built in, not modules)",
    },
    Known {
        all_of: &["error -8"],
        why: "the kernel cannot execute the guest agent (a static x86-64 ELF): it needs \
              CONFIG_BINFMT_ELF=y and CONFIG_64BIT=y",
    },
    Known {
        all_of: &["No working init found"],
        why: "the kernel found no init to run: the initramfs or system disk lacks the guest \
              agent, or the kernel lacks CONFIG_BLK_DEV_INITRD=y / CONFIG_BINFMT_ELF=y",
    },
    Known {
        all_of: &["voidbox-agent", "os error 97"],
        why: "the guest kernel has no vsock: it needs CONFIG_VSOCKETS=y and \
              CONFIG_VIRTIO_VSOCKETS=y",
    },
    Known {
        all_of: &["voidbox-agent", "devtmpfs", "No such device"],
        why: "the guest kernel has no devtmpfs: it needs CONFIG_DEVTMPFS=y",
    },
    Known {
        all_of: &["voidbox-agent", "erofs", "No such device"],
        why: "the guest kernel cannot mount an image disk: it needs CONFIG_EROFS_FS=y",
    },
    Known {
        all_of: &["voidbox-agent", "overlay", "No such device"],
        why: "the guest kernel has no overlay file system: it needs CONFIG_OVERLAY_FS=y",
    },
];

/// What the console says is missing from the guest kernel, if it says so.
pub fn diagnose(console: &[String]) -> Option<&'static str> {
    if console.iter().all(|l| l.trim().is_empty()) {
        return Some(
            "the kernel printed nothing on its serial console: it must be an x86-64 vmlinux \
             (ELF) or bzImage with CONFIG_SERIAL_8250=y and CONFIG_SERIAL_8250_CONSOLE=y \
             (voidbox passes console=ttyS0)",
        );
    }
    KNOWN.iter().find_map(|k| {
        console
            .iter()
            .any(|l| k.all_of.iter().all(|s| l.contains(s)))
            .then_some(k.why)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &[&str]) -> Vec<String> {
        s.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn known_kernel_failures_are_named() {
        let cases: &[(&[&str], &str)] = &[
            (
                &[
                    "[    0.1] Unknown kernel command line parameters \"virtio_mmio.device=4K@0xd0000000:5\"",
                ],
                "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES",
            ),
            (
                &[
                    "[ 9.0] No filesystem could mount root, tried:  ext4",
                    "[ 9.0] Kernel panic - not syncing: VFS: Unable to mount root fs on unknown-block(254,0)",
                ],
                "CONFIG_EROFS_FS=y",
            ),
            (
                &["[ 9.0] VFS: Cannot open root device \"vda\" or unknown-block(0,0): error -6"],
                "CONFIG_VIRTIO_BLK=y",
            ),
            (
                &["voidbox-agent: listener failed: vsock socket: Address family not supported by protocol (os error 97)"],
                "CONFIG_VIRTIO_VSOCKETS=y",
            ),
            (
                &["voidbox-agent: mount devtmpfs on /dev: No such device (os error 19)"],
                "CONFIG_DEVTMPFS=y",
            ),
            (
                &["Kernel panic - not syncing: No working init found."],
                "no init",
            ),
        ];
        for (console, want) in cases {
            let got = diagnose(&lines(console)).unwrap_or("");
            assert!(got.contains(want), "{console:?} → {got}");
        }
    }

    #[test]
    fn silence_and_unknown_output() {
        assert!(diagnose(&[]).unwrap().contains("printed nothing"));
        assert!(diagnose(&lines(&["", "  "]))
            .unwrap()
            .contains("CONFIG_SERIAL_8250_CONSOLE"));
        assert_eq!(
            diagnose(&lines(&["[ 1.0] Linux version 6.1", "random"])),
            None
        );
    }
}
