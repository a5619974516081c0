//! The `plain` guest image — the one every host with hardware KVM gets — booted through
//! voidbox on emulated hardware virtualisation, since no machine of this project has VMX/SVM:
//! QEMU in pure TCG with an SVM CPU runs Debian's stock kernel with `kvm_amd` (L1), whose
//! `/dev/kvm` is "hardware" to voidbox, which boots the plain image (L2).
//! `scripts/tcg-l1.sh` builds the L1's initramfs and runs the session; inside L1 it checks
//! the probe (hardware → plain), `doctor`, a cold `run`, a golden snapshot made and restored,
//! a layered (diff) snapshot over a golden base made, restored in a new VM and refused when
//! corrupt or without its base (`tests/src/bin/layered-probe.rs`, through the library),
//! `run --network` (the NAT's gateway to an L1 port, its DNS through a resolver on L1) and
//! `apply examples/fan-out.yaml` with its merged output.
//!
//! Needs a cached plain image built from this tree's recipe (CI builds it in
//! `scripts/test.sh`) and `qemu-system-x86`; not `/dev/kvm`. The L1 session is bounded; an
//! L1 that crashes or hangs (an emulation problem, seen now and then under TCG) is retried
//! once, a failed check never.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use voidbox::image::{build::recipe_matches, Cache, Profile};
use voidbox_tests::repo_root;

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
/// The layered-snapshot probe the L1 runs as its `layered` check.
const LAYERED_PROBE: &str = env!("CARGO_BIN_EXE_layered-probe");

/// The checks `/init` runs, in order.
const CHECKS: [&str; 8] = [
    "probe",
    "doctor",
    "cold",
    "snapshot-create",
    "snapshot-restore",
    "layered",
    "network",
    "apply",
];

/// The whole QEMU session's limit (a passing one takes ≈35 s here).
const SESSION_LIMIT_S: u64 = 140;
/// One check's limit inside L1 (each takes ≤ 10 s here): a voidbox that hangs fails its
/// check and the session still ends with `ALL DONE`, inside [`SESSION_LIMIT_S`].
const CHECK_LIMIT_S: u64 = 45;

const BUILD_HINT: &str =
    "build it with `target/release/voidbox image build --profile plain --no-runtimes` \
     (a kernel compile, minutes; scripts/test.sh does it)";

/// The newest cached plain image built from this tree's recipe.
fn plain_image() -> PathBuf {
    let cache = Cache::open(None).unwrap_or_else(|e| panic!("the image cache: {e}"));
    let (images, _broken) = cache
        .list()
        .unwrap_or_else(|e| panic!("listing {}: {e}", cache.images_dir().display()));
    images
        .into_iter()
        .find(|i| {
            i.manifest.profile == Profile::Plain
                && i.manifest.is_current_layout()
                && recipe_matches(&i.manifest.kernel_inputs)
        })
        .map(|i| i.dir)
        .unwrap_or_else(|| {
            panic!(
                "no plain guest image of this tree's recipe in {}: {BUILD_HINT}",
                cache.images_dir().display()
            )
        })
}

/// How one L1 session ended.
#[derive(Debug)]
enum Outcome {
    /// Every check passed: per-check seconds.
    Passed(BTreeMap<String, f64>),
    /// The L1 worked but a check failed: what voidbox got wrong.
    Failed(String),
    /// The L1 crashed, hung or timed out: no verdict on voidbox.
    Crashed(String),
}

struct Session {
    outcome: Outcome,
    console: String,
    wall: Duration,
}

/// One `CHECK name PASS|FAIL secs [detail]` line: (name, passed, seconds, detail).
fn check_line(line: &str) -> Option<(&str, bool, f64, &str)> {
    let rest = line.strip_prefix("CHECK ")?;
    let mut f = rest.splitn(4, ' ');
    let name = f.next()?;
    let passed = match f.next()? {
        "PASS" => true,
        "FAIL" => false,
        _ => return None,
    };
    let secs = f.next()?.strip_suffix('s')?.parse().ok()?;
    Some((name, passed, secs, f.next().unwrap_or("")))
}

/// Whether an L1 kernel line (timestamped; a guest console quoted by voidbox is indented)
/// reports a crash.
fn l1_oops(line: &str) -> bool {
    line.starts_with('[')
        && [
            "Kernel panic",
            "Oops",
            "BUG: ",
            "stack guard page was hit",
            "general protection fault",
        ]
        .iter()
        .any(|m| line.contains(m))
}

/// The fan-out's merged output in the `REPORT` line: the three branches' results in order.
fn check_report(lines: &[&str]) -> Result<(), String> {
    let line = lines
        .iter()
        .find_map(|l| l.strip_prefix("REPORT "))
        .ok_or("no REPORT line")?;
    let doc: Value =
        serde_json::from_str(line).map_err(|e| format!("REPORT is not JSON ({e}): {line}"))?;
    let want = json!([9, "THE QUICK BROWN FOX\nJUMPS OVER THE LAZY DOG", 2]);
    if doc["status"] != "succeeded" || doc["output"] != want {
        return Err(format!(
            "apply report: status {}, output {} (want {want})",
            doc["status"], doc["output"]
        ));
    }
    Ok(())
}

fn classify(console: &str, exit: Option<i32>) -> Outcome {
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    if let Some(l) = lines.iter().find(|l| l1_oops(l)) {
        return Outcome::Crashed(format!("the L1 kernel crashed: {l}"));
    }
    let checks: Vec<_> = lines.iter().filter_map(|l| check_line(l)).collect();
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.1)
        .map(|(n, _, s, d)| format!("{n} ({s} s): {d}"))
        .collect();
    // A failed check is voidbox's, even when the L1 broke later (a hung check fails after
    // the harness's per-check timeout, well inside the session's).
    if !failed.is_empty() {
        return Outcome::Failed(failed.join("\n"));
    }
    if !lines.iter().any(|l| l.starts_with("ALL DONE")) {
        return Outcome::Crashed(format!(
            "no ALL DONE and no FAIL line after {} check(s) (harness exit {exit:?}: 3 is the \
             timeout)",
            checks.len()
        ));
    }
    let passed: BTreeMap<String, f64> = checks
        .iter()
        .map(|(n, _, s, _)| (n.to_string(), *s))
        .collect();
    let missing: Vec<_> = CHECKS
        .iter()
        .filter(|c| !passed.contains_key(**c))
        .collect();
    if !missing.is_empty() {
        return Outcome::Failed(format!("checks never ran: {missing:?}"));
    }
    if let Err(e) = check_report(&lines) {
        return Outcome::Failed(e);
    }
    if exit != Some(0) {
        return Outcome::Failed(format!(
            "every check passed but the harness exited {exit:?}"
        ));
    }
    Outcome::Passed(passed)
}

fn session(image: &Path) -> Session {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("console.log");
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/tcg-l1.sh"))
        .arg(VOIDBOX)
        .arg(image)
        .arg(repo_root().join("examples/fan-out.yaml"))
        .env("TCG_L1_TIMEOUT", SESSION_LIMIT_S.to_string())
        .env("TCG_L1_CHECK_TIMEOUT", CHECK_LIMIT_S.to_string())
        .env("TCG_L1_LOG", &log)
        .env("TCG_L1_LAYERED_PROBE", LAYERED_PROBE)
        .output()
        .expect("running scripts/tcg-l1.sh");
    let wall = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(2),
        "scripts/tcg-l1.sh could not set up the L1 session:\n{stderr}"
    );
    let console = std::fs::read_to_string(&log)
        .unwrap_or_else(|_| String::from_utf8_lossy(&out.stdout).into_owned());
    Session {
        outcome: classify(&console, out.status.code()),
        console: format!("{console}\n--- harness stderr ---\n{stderr}"),
        wall,
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[test]
fn plain_image_boots_under_emulated_svm() {
    if std::env::var("VOIDBOX_SKIP_VM_TESTS").as_deref() == Ok("1") {
        eprintln!("VOIDBOX_SKIP_VM_TESTS=1: skipping the plain image under emulated SVM");
        return;
    }
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    assert!(
        qemu.is_ok_and(|o| o.status.success()),
        "qemu-system-x86_64 is missing: apt-get install -y qemu-system-x86 \
         (or set VOIDBOX_SKIP_VM_TESTS=1 to skip VM tests)"
    );
    let image = plain_image();
    eprintln!("plain image: {}", image.display());

    for attempt in 1..=2 {
        let s = session(&image);
        match s.outcome {
            Outcome::Passed(times) => {
                // (the first console line also carries the firmware's escape sequences)
                let after = |marker: &str| {
                    s.console
                        .lines()
                        .find_map(|l| l.split(marker).nth(1))
                        .map_or("?", |t| t.trim_end_matches('\r'))
                        .to_string()
                };
                eprintln!(
                    "passed (attempt {attempt}) in {:.1} s (harness: initramfs + QEMU session); \
                     L1 kernel to /init {}; L1 modules + NIC {}",
                    s.wall.as_secs_f64(),
                    after("L1 INIT at "),
                    after("L1 modules+net in ").split(';').next().unwrap_or("?"),
                );
                for c in CHECKS {
                    eprintln!("  {c:<17} {:>6.2} s", times[c]);
                }
                // the probe's steps, as `run` in /init quoted them
                for l in s.console.lines() {
                    if let Some(step) = l.trim_end_matches('\r').strip_prefix("  | layered-probe: ")
                    {
                        eprintln!("    layered {step}");
                    }
                }
                return;
            }
            // QEMU's TCG emulation of SVM now and then faults a VM that the same session
            // booted and restored fine (`triple fault at rip 0xfff0`, KVM's reset vector after
            // the shutdown): retried once; a voidbox bug faults again.
            Outcome::Failed(why) if attempt == 1 && s.console.contains("triple fault") => {
                eprintln!(
                "an L2 VM triple-faulted under the emulated SVM ({why}), retrying once; console \
                 tail:\n{}",
                tail(&s.console, 30)
            )
            }
            Outcome::Failed(why) => panic!(
                "voidbox failed in the L1 (attempt {attempt}):\n{why}\n--- console tail ---\n{}",
                tail(&s.console, 80)
            ),
            Outcome::Crashed(why) if attempt == 1 => eprintln!(
                "the L1 session broke ({why}), retrying once; console tail:\n{}",
                tail(&s.console, 30)
            ),
            Outcome::Crashed(why) => panic!(
                "the L1 session broke twice (last: {why}); an emulation problem, not a verdict \
                 on voidbox\n--- console tail ---\n{}",
                tail(&s.console, 80)
            ),
        }
    }
}

#[cfg(test)]
mod classify_tests {
    use super::*;

    fn passing() -> String {
        let mut c = String::from("[    1.0] booting\r\nL1 INIT at 4.2 s\r\n");
        for n in CHECKS {
            c.push_str(&format!("CHECK {n} PASS 1.50s\r\n"));
        }
        c.push_str(
            "REPORT {\"status\": \"succeeded\", \"output\": [9, \"THE QUICK BROWN FOX\\nJUMPS OVER THE LAZY DOG\", 2]}\r\nALL DONE at 40 s\r\n",
        );
        c
    }

    #[test]
    fn a_passing_console_passes() {
        let Outcome::Passed(t) = classify(&passing(), Some(0)) else {
            panic!("not passed")
        };
        assert_eq!(t["apply"], 1.5);
    }

    #[test]
    fn a_failed_check_is_voidbox_s_fault() {
        let c = passing().replace("CHECK cold PASS 1.50s", "CHECK cold FAIL 2.00s no cold-ok");
        assert!(matches!(classify(&c, Some(1)), Outcome::Failed(w) if w.contains("cold")));
        let c =
            "L1 INIT at 4 s\nCHECK probe PASS 0.3s\nCHECK cold FAIL 45.00s no cold-ok (exit 143)\n";
        assert!(matches!(classify(c, Some(1)), Outcome::Failed(_)));
        let c = passing().replace("[9,", "[8,");
        assert!(matches!(classify(&c, Some(0)), Outcome::Failed(_)));
    }

    #[test]
    fn an_oops_a_hang_or_a_timeout_is_an_l1_crash() {
        let c = format!("{}[   9.1] BUG: stack guard page was hit\r\n", passing());
        assert!(matches!(classify(&c, Some(3)), Outcome::Crashed(_)));
        let c = "L1 INIT at 4 s\nCHECK probe PASS 0.3s\n";
        assert!(matches!(classify(c, Some(3)), Outcome::Crashed(_)));
        assert!(matches!(classify(c, Some(0)), Outcome::Crashed(_)));
        // a guest's panic quoted by voidbox (indented) is not the L1's
        let c = format!("  ! Kernel panic - not syncing\n{}", passing());
        assert!(matches!(classify(&c, Some(0)), Outcome::Passed(_)));
    }
}
