//! Unit tests of the doctor's pure parts (classification, fixes, report shapes) and of the
//! cache checks against real, empty cache directories.

use std::path::PathBuf;

use super::cache::{self, classify_disk, FAIL_BELOW_BYTES, WARN_BELOW_BYTES};
use super::host::{self, BuildDeps, Readiness};
use super::kvm::{self, CpuFacts, Vendor};
use super::*;
use voidbox_vmm::probe::HostKvm;

const GIB: u64 = 1 << 30;

fn deps(missing: Result<Vec<&'static str>, String>, root: bool, apt: bool) -> BuildDeps {
    BuildDeps {
        missing,
        root,
        apt,
        agent: Ok("guest agent /x".into()),
    }
}

#[test]
fn report_json_shape_and_exit_code() {
    let r = Report::new(vec![
        Check::ok("a", "fine"),
        Check::warn("b", "meh", "do b"),
    ]);
    assert!(r.ok);
    assert_eq!(r.exit_code(), 0);
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(v["ok"], true);
    let checks = v["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0]["name"], "a");
    assert_eq!(checks[0]["status"], "ok");
    assert_eq!(checks[0]["detail"], "fine");
    assert!(checks[0]["fix"].is_null());
    assert_eq!(checks[1]["status"], "warn");
    assert_eq!(checks[1]["fix"], "do b");
    let keys: Vec<&String> = checks[1].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["name", "status", "detail", "fix"]);

    let r = Report::new(vec![
        Check::ok("a", "fine"),
        Check::fail("c", "bad", "do c"),
    ]);
    assert!(!r.ok);
    assert_eq!(r.exit_code(), EXIT_FAILED);
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["checks"][1]["status"], "fail");
}

#[test]
fn human_output_marks_and_fixes() {
    let r = Report::new(vec![
        Check::ok("kvm", "fine"),
        Check::warn("memory", "low", "free some"),
        Check::fail("disk-space", "full", "clean up"),
    ]);
    let h = r.to_human();
    assert!(h.contains("✓ kvm"), "{h}");
    assert!(h.contains("! memory"), "{h}");
    assert!(h.contains("✗ disk-space"), "{h}");
    assert!(h.contains("fix: clean up"), "{h}");
    assert!(h.contains("1 check(s) failed, 1 warning(s)"), "{h}");
    let ok = Report::new(vec![Check::ok("kvm", "fine")]).to_human();
    assert!(!ok.contains("fix:"));
    assert!(ok.contains("all checks passed"));
}

#[test]
fn disk_thresholds() {
    assert_eq!(classify_disk(0, 0), Status::Fail);
    assert_eq!(classify_disk(FAIL_BELOW_BYTES - 1, 0), Status::Fail);
    assert_eq!(classify_disk(FAIL_BELOW_BYTES, 0), Status::Warn);
    assert_eq!(classify_disk(WARN_BELOW_BYTES - 1, 0), Status::Warn);
    assert_eq!(classify_disk(WARN_BELOW_BYTES, 0), Status::Ok);
    // 2 GiB free is enough to run, not to build a missing image and runtimes disk.
    let pending = cache::IMAGE_BUILD_BYTES + cache::RUNTIMES_BUILD_BYTES;
    assert_eq!(classify_disk(2 * GIB, 0), Status::Warn);
    assert_eq!(classify_disk(2 * GIB, pending), Status::Fail);
    assert_eq!(classify_disk(100 * GIB, pending), Status::Ok);
    // A first build fits under the warning threshold's headroom.
    assert!(pending < WARN_BELOW_BYTES);
}

#[test]
fn memory_thresholds() {
    assert_eq!(host::memory_check(None).status, Status::Warn);
    assert_eq!(host::memory_check(Some(600)).status, Status::Fail);
    let w = host::memory_check(Some(1200));
    assert_eq!(w.status, Status::Warn);
    assert!(w.fix.unwrap().contains("sandbox.memory_mb"));
    let ok = host::memory_check(Some(16_000));
    assert_eq!(ok.status, Status::Ok);
    // (16000 - 512) / (256 + 32) = 53; / (1024 + 32) = 14
    assert!(
        ok.detail
            .contains("room for 53 default VM(s) (256 MiB) or 14 agent VM(s) (1024 MiB)"),
        "{}",
        ok.detail
    );
}

#[test]
fn cpuinfo_parsing() {
    let intel = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu vme vmx sse\n";
    let f = CpuFacts::parse(intel);
    assert_eq!(f.vendor, Vendor::Intel);
    assert!(f.virt_flag && !f.in_vm);
    let amd_vm = "vendor_id : AuthenticAMD\nflags : fpu sse hypervisor\n";
    let f = CpuFacts::parse(amd_vm);
    assert_eq!(f.vendor, Vendor::Amd);
    assert!(!f.virt_flag && f.in_vm);
    assert_eq!(CpuFacts::parse("").vendor, Vendor::Unknown);
}

#[test]
fn missing_kvm_fixes() {
    let base = CpuFacts {
        vendor: Vendor::Amd,
        ..CpuFacts::default()
    };
    let load = kvm::missing_fix(&CpuFacts {
        virt_flag: true,
        ..base.clone()
    });
    assert!(load.contains("sudo modprobe kvm_amd"), "{load}");
    let node = kvm::missing_fix(&CpuFacts {
        virt_flag: true,
        module_loaded: true,
        ..base.clone()
    });
    assert!(node.contains("udevadm trigger"), "{node}");
    let nested = kvm::missing_fix(&CpuFacts {
        in_vm: true,
        ..base.clone()
    });
    assert!(nested.contains("nested virtualization"), "{nested}");
    let firmware = kvm::missing_fix(&base);
    assert!(firmware.contains("AMD-V"), "{firmware}");
    assert!(firmware.contains("firmware"), "{firmware}");
    let container = kvm::missing_fix(&CpuFacts {
        in_container: true,
        ..base
    });
    assert!(container.contains("--device /dev/kvm"), "{container}");
}

#[test]
fn permission_fixes() {
    let add = kvm::permission_fix(Some("kvm"), false);
    assert!(add.contains("sudo usermod -aG kvm $USER"), "{add}");
    assert!(add.contains("99-kvm.rules"), "{add}");
    assert!(add.contains("GitHub Actions"), "{add}");
    let relogin = kvm::permission_fix(Some("kvm"), true);
    assert!(relogin.contains("log out and back in"), "{relogin}");
    assert!(!relogin.contains("usermod"), "{relogin}");
    let root_only = kvm::permission_fix(Some("root"), false);
    assert!(
        root_only.contains("KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0666\""),
        "{root_only}"
    );
    assert!(!root_only.contains("usermod -aG root"), "{root_only}");
    assert_eq!(kvm::permission_fix(None, false), root_only);
}

#[test]
fn group_and_user_lookup() {
    let groups = "root:x:0:\nbad:x:nan:\nkvm:x:993:alice, bob\nwheel:x:10\n";
    assert_eq!(
        kvm::group_entry(groups, 993),
        Some(("kvm".into(), vec!["alice".into(), "bob".into()]))
    );
    assert_eq!(kvm::group_entry(groups, 0), Some(("root".into(), vec![])));
    assert_eq!(kvm::group_entry(groups, 10), Some(("wheel".into(), vec![])));
    assert_eq!(kvm::group_entry(groups, 4242), None);
    let passwd = "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n";
    assert_eq!(kvm::user_name(passwd, 1000).as_deref(), Some("alice"));
    assert_eq!(kvm::user_name(passwd, 7), None);
}

#[test]
fn speed_findings() {
    let hw = kvm::speed_finding(HostKvm::Hardware, 0.4);
    assert_eq!(hw.status, Status::Ok);
    assert!(hw.fix.is_none());
    let emu = kvm::speed_finding(HostKvm::EmulatedKernelMode, 520.0);
    assert_eq!(emu.status, Status::Warn);
    assert!(emu.detail.contains("≈520 ns"), "{}", emu.detail);
    assert!(emu.detail.contains("25–36 s"), "{}", emu.detail);
    assert!(emu.fix.unwrap().contains("--no-snapshot"));
    assert_eq!(kvm::speed_skipped().status, Status::Warn);
}

#[test]
fn build_readiness() {
    assert_eq!(deps(Ok(vec![]), false, false).readiness(), Readiness::Ready);
    assert_eq!(
        deps(Ok(vec!["flex"]), true, true).readiness(),
        Readiness::AfterApt(vec!["flex"])
    );
    let Readiness::Blocked(why, fix) = deps(Ok(vec!["flex", "bc"]), false, true).readiness() else {
        panic!("a user cannot apt-get")
    };
    assert!(why.contains("flex bc"));
    assert_eq!(fix, "sudo apt-get install --no-install-recommends flex bc");
    assert!(matches!(
        deps(Err("not Debian".into()), true, true).readiness(),
        Readiness::Blocked(..)
    ));
    let no_agent = BuildDeps {
        agent: Err(("no agent".into(), "set it".into())),
        ..deps(Ok(vec![]), true, true)
    };
    assert_eq!(
        no_agent.readiness(),
        Readiness::Blocked("no agent".into(), "set it".into())
    );
    // Missing builder packages only warn once an image is cached.
    let blocked = deps(Ok(vec!["flex"]), false, false);
    assert_eq!(host::tools_image_check(&blocked, true).status, Status::Warn);
    assert_eq!(
        host::tools_image_check(&blocked, false).status,
        Status::Fail
    );
}

#[test]
fn empty_cache_image_missing_is_warn_when_buildable_fail_when_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = Ok(dir.path().to_path_buf());
    let ready = cache::image_check(
        &root,
        Some(crate::image::Profile::Plain),
        &deps(Ok(vec![]), false, false),
    );
    assert!(!ready.present);
    assert!(ready.current.is_none());
    assert_eq!(ready.check.status, Status::Warn);
    assert!(ready
        .check
        .fix
        .as_deref()
        .unwrap()
        .contains("voidbox image build"));
    assert_eq!(ready.build_bytes, cache::IMAGE_BUILD_BYTES);
    let blocked = cache::image_check(&root, None, &deps(Ok(vec!["flex"]), false, false));
    assert_eq!(blocked.check.status, Status::Fail);
    assert!(
        blocked.check.detail.contains("cannot be built"),
        "{}",
        blocked.check.detail
    );
    assert!(blocked.check.fix.unwrap().contains("apt-get install"));
    let no_root = cache::image_check(
        &Err("no HOME".into()),
        None,
        &deps(Ok(vec![]), false, false),
    );
    assert_eq!(no_root.check.status, Status::Fail);
}

#[test]
fn empty_cache_snapshots_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let root: Result<PathBuf, String> = Ok(dir.path().join("not-yet/voidbox"));
    let s = cache::snapshots_check(&root, Some("abc"));
    assert_eq!(s.status, Status::Ok, "{s:?}");
    assert!(s.detail.starts_with("0 snapshot(s)"), "{}", s.detail);
    // The cache root does not exist yet: its nearest existing ancestor is measured.
    let d = cache::disk_check(&root, 0);
    assert!(d.detail.contains("free for"), "{}", d.detail);
    assert_ne!(
        d.status,
        Status::Fail,
        "this test machine has > 1 GiB free: {d:?}"
    );
    // Nothing can need more than all the space there is.
    assert_eq!(cache::disk_check(&root, u64::MAX).status, Status::Fail);
    assert_eq!(
        cache::disk_check(&Err("no HOME".into()), 0).status,
        Status::Fail
    );
}

#[test]
fn every_check_runs_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let r = run_checks(Ok(dir.path().to_path_buf()));
    let names: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
    assert_eq!(names, CHECK_NAMES);
    for c in &r.checks {
        assert_eq!(c.fix.is_none(), c.status == Status::Ok, "{c:?}");
        assert!(!c.detail.is_empty());
    }
    assert_eq!(r.ok, r.checks.iter().all(|c| c.status != Status::Fail));
}

#[test]
fn the_cache_must_be_writable_for_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    // Not made yet, under a writable directory: fine, and probing it leaves nothing behind.
    let fresh: Result<PathBuf, String> = Ok(dir.path().join("not-yet/voidbox"));
    let ok = cache::writable_check(&fresh);
    assert_eq!(ok.status, Status::Ok, "{ok:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // A file where the cache directory should be (root cannot be kept out by a mode here).
    let file = dir.path().join("cache-file");
    std::fs::write(&file, "").unwrap();
    let blocked: Result<PathBuf, String> = Ok(file.join("voidbox"));
    let warn = cache::writable_check(&blocked);
    assert_eq!(warn.status, Status::Warn, "{warn:?}");
    assert!(warn.detail.contains("not writable"), "{}", warn.detail);
    assert!(warn.detail.contains("boots cold"), "{}", warn.detail);
    assert!(
        warn.fix
            .as_deref()
            .unwrap_or_default()
            .contains("XDG_CACHE_HOME"),
        "{warn:?}"
    );
    // The snapshot layer asks the same question.
    let (why, fix) =
        crate::snapshot::store::write_problem(&file.join("voidbox/snapshots")).unwrap();
    assert!(why.contains(&file.display().to_string()), "{why}");
    assert_eq!(Some(fix), warn.fix);
    assert_eq!(
        cache::writable_check(&Err("no HOME".into())).status,
        Status::Warn
    );
}
