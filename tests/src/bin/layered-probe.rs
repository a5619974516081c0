//! A layered (diff) snapshot made and restored through the `voidbox` library, for
//! `scripts/tcg-l1.sh` to run inside the TCG-SVM L1 on the cached `plain` image
//! (`tests/tests/vm_plain_tcg.rs`). In production only warm agent runtimes make diff
//! snapshots, and they need the runtimes disk, which the plain L1 image lacks.
//!
//! Usage: `layered-probe VOIDBOX [IMAGE_DIR]`: VMs are started as `VOIDBOX __vmm`; the image
//! is IMAGE_DIR, else the newest cached plain image of this build's recipe
//! (`$XDG_CACHE_HOME/voidbox/images`).
//!
//! Steps (128 MiB, 1 vCPU): a golden base snapshot (one cold boot, the production path);
//! a restore of it writes a unique marker of a few hundred KiB; a diff snapshot over the
//! base; a new VM restored from base + diff has the marker byte for byte and runs a command;
//! one restored from the base alone has no marker; a diff with a flipped byte, and one
//! without its base, are refused before any vCPU runs. One `layered-probe: STEP MS ms …`
//! line per step, then `layered-probe: ok` (exit 0) or `layered-probe: FAILED: why` (exit 1).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use voidbox::image::{Cache, Profile};
use voidbox::sandbox::{GuestImage, RestoreFrom, Sandbox, SandboxConfig, SandboxError};
use voidbox::sandbox::{VmmLauncher, VMM_SUBCOMMAND};
use voidbox::snapshot::{ensure_golden, CreateOptions, GoldenSpec, Store};

/// Where the marker goes in the guest (its memory-backed workspace).
const MARKER: &str = "/workspace/layered-probe.marker";
/// The marker's size: ~100 pages, each of them different.
const MARKER_BYTES: usize = 400 << 10;
/// How long writing one snapshot may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(120);

type Result<T, E = String> = std::result::Result<T, E>;

fn main() -> ExitCode {
    match probe() {
        Ok(()) => {
            println!("layered-probe: ok");
            ExitCode::SUCCESS
        }
        Err(why) => {
            println!("layered-probe: FAILED: {why}");
            ExitCode::from(1)
        }
    }
}

/// A scratch directory, removed with everything in it when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Times each step and prints its line.
struct Steps(Instant);

impl Steps {
    fn done(&mut self, step: &str, detail: &str) {
        println!(
            "layered-probe: {step} {} ms {detail}",
            self.0.elapsed().as_millis()
        );
        self.0 = Instant::now();
    }
}

fn probe() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let usage = "usage: layered-probe VOIDBOX [IMAGE_DIR]";
    let voidbox = PathBuf::from(args.next().ok_or(usage)?);
    let image = match args.next() {
        Some(dir) => image_in(Path::new(&dir))?,
        None => cached_plain_image()?,
    };
    if args.next().is_some() {
        return Err(usage.into());
    }
    let scratch =
        Scratch(std::env::temp_dir().join(format!("voidbox-layered-probe-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0)
        .map_err(|e| format!("creating {}: {e}", scratch.0.display()))?;
    println!(
        "layered-probe: image {} ({}), VMM `{} {VMM_SUBCOMMAND}`",
        image.hash.get(..12).unwrap_or(&image.hash),
        image.vmlinux.display(),
        voidbox.display()
    );

    let mut cfg = SandboxConfig::new(image);
    cfg.memory_mb = 128;
    cfg.vcpus = 1;
    cfg.launcher = VmmLauncher::Program {
        path: voidbox,
        args: vec![VMM_SUBCOMMAND.to_string()],
    };
    cfg.boot_timeout = Duration::from_secs(120);
    cfg.wall_limit = Some(Duration::from_secs(300));
    let mut steps = Steps(Instant::now());

    // The base: a golden snapshot, as the engine makes them (one cold boot).
    let store = Store::open(Some(&scratch.0.join("snapshots")))
        .map_err(|e| format!("the snapshot store: {e}"))?;
    let opts = CreateOptions {
        launcher: cfg.launcher.clone(),
        boot_timeout: cfg.boot_timeout,
        runtime_dir: None,
    };
    let lease = ensure_golden(&store, &GoldenSpec::of(&cfg), &opts, u64::MAX, &|_| {})
        .map_err(|e| format!("the base snapshot (cold boot + full snapshot): {e}"))?;
    let base = lease.restore.clone();
    let full_bytes = dir_bytes(&base.dir);
    steps.done(
        "base",
        &format!(
            "(cold boot + full snapshot, {} KiB on disk)",
            full_bytes >> 10
        ),
    );

    // A restore of the base writes the marker.
    let mut c = cfg.clone();
    c.restore = Some(base.clone());
    c.snapshot_control = true;
    let mut w = Sandbox::start(&c).map_err(|e| format!("restoring the base: {e}"))?;
    steps.done("restore-base", "");
    let marker = marker()?;
    w.write_file(MARKER, &marker, None)
        .map_err(|e| format!("writing the marker: {e}"))?;
    let sum = sh(&mut w, &format!("sha256sum {MARKER}"))?;
    steps.done(
        "write-marker",
        &format!("({} KiB, then an exec)", MARKER_BYTES >> 10),
    );

    let diff_dir = scratch.0.join("layered");
    let d = w
        .snapshot_diff_to(&diff_dir, &base.dir, SNAPSHOT_TIMEOUT)
        .map_err(|e| format!("the diff snapshot: {e}"))?;
    let secret = w.secret().clone();
    drop(w);
    let pages = d
        .diff_pages
        .ok_or("the diff snapshot reports no page count")?;
    let want = (MARKER_BYTES / 4096) as u64;
    if pages < want || pages * 4096 >= d.memory_bytes / 4 {
        return Err(format!(
            "the diff holds {pages} pages: not the ≥ {want} the marker wrote and < ¼ of the \
             {} KiB of memory",
            d.memory_bytes >> 10
        ));
    }
    steps.done(
        "diff-snapshot",
        &format!(
            "({pages} pages, {} KiB on disk against the base's {} KiB; VMM {} ms, pause {} µs)",
            d.disk_bytes >> 10,
            full_bytes >> 10,
            d.vmm_total.as_millis(),
            d.pause.as_micros()
        ),
    );

    // A new VM from base + diff has the marker, byte for byte, and runs commands.
    let layered = RestoreFrom {
        dir: diff_dir.clone(),
        secret,
        base: Some(base.dir.clone()),
    };
    let mut r = cfg.clone();
    r.restore = Some(layered.clone());
    let mut l = Sandbox::start(&r).map_err(|e| format!("restoring base + diff: {e}"))?;
    let vmm_restore = l.timings().restore.map_or(0, |t| t.as_millis());
    steps.done(
        "restore-layered",
        &format!("(VMM restore {vmm_restore} ms)"),
    );
    let got = l
        .read_file(MARKER, MARKER_BYTES as u64 + 1)
        .map_err(|e| format!("reading the marker after the layered restore: {e}"))?;
    if got != marker {
        return Err(format!(
            "the layered restore's marker differs: {} bytes, want the {} written",
            got.len(),
            marker.len()
        ));
    }
    let sum2 = sh(&mut l, &format!("sha256sum {MARKER}"))?;
    if sum2 != sum {
        return Err(format!(
            "the layered restore's marker sums {sum2:?}, before the snapshot {sum:?}"
        ));
    }
    drop(l);
    steps.done("check-layered", "(marker read back, an exec)");

    // The base alone never had it.
    let mut b = cfg.clone();
    b.restore = Some(base.clone());
    let mut v = Sandbox::start(&b).map_err(|e| format!("restoring the base alone: {e}"))?;
    let there = sh(
        &mut v,
        &format!("if [ -e {MARKER} ]; then echo present; else echo absent; fi"),
    )?;
    drop(v);
    if there.trim() != "absent" {
        return Err(format!(
            "a restore of the base alone has the marker: {there:?}"
        ));
    }
    steps.done("base-alone", "(restored, no marker)");

    // A flipped byte in the diff's pages: refused before any vCPU runs.
    let bad = scratch.0.join("layered-corrupt");
    copy_dir(&diff_dir, &bad)?;
    let file = bad.join("memory.diff");
    let mut data = std::fs::read(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let at = data.len().checked_sub(100).ok_or("memory.diff is tiny")?;
    data[at] ^= 0x01;
    std::fs::write(&file, &data).map_err(|e| format!("writing {}: {e}", file.display()))?;
    drop(data);
    let mut corrupt = r.clone();
    corrupt.restore = Some(RestoreFrom {
        dir: bad,
        ..layered.clone()
    });
    let why = refusal(&corrupt, "a corrupted diff")?;
    if !why.contains("checksum") {
        return Err(format!(
            "a corrupted diff was refused, but not for its checksum: {why}"
        ));
    }
    steps.done("corrupt-refused", &format!("({why})"));

    // A diff without its base: refused too.
    let mut no_base = r.clone();
    no_base.restore = Some(RestoreFrom {
        base: None,
        ..layered
    });
    let why = refusal(&no_base, "a diff without its base")?;
    if !why.contains("layered") {
        return Err(format!(
            "a diff without its base was refused, but not as layered: {why}"
        ));
    }
    steps.done("no-base-refused", &format!("({why})"));
    drop(lease);
    Ok(())
}

/// The image in `dir`, if this build boots it.
fn image_in(dir: &Path) -> Result<GuestImage> {
    let cache = Cache::open(None).map_err(|e| format!("the image cache: {e}"))?;
    let (images, _broken) = cache
        .list()
        .map_err(|e| format!("listing {}: {e}", cache.images_dir().display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    images
        .iter()
        .find(|i| i.dir.canonicalize().is_ok_and(|d| d == dir))
        .and_then(|i| GuestImage::from_cached(&i.dir, &i.manifest))
        .ok_or_else(|| {
            format!(
                "{}: not a cached image of this build's recipe in {}",
                dir.display(),
                cache.images_dir().display()
            )
        })
}

/// The newest cached plain image built from this build's recipe.
fn cached_plain_image() -> Result<GuestImage> {
    let cache = Cache::open(None).map_err(|e| format!("the image cache: {e}"))?;
    let (images, _broken) = cache
        .list()
        .map_err(|e| format!("listing {}: {e}", cache.images_dir().display()))?;
    images
        .iter()
        .filter(|i| i.manifest.profile == Profile::Plain)
        .find_map(|i| GuestImage::from_cached(&i.dir, &i.manifest))
        .ok_or_else(|| {
            format!(
                "no plain guest image of this build's recipe in {} (build one: voidbox image \
                 build --profile plain --no-runtimes)",
                cache.images_dir().display()
            )
        })
}

/// The marker: lines naming a token fresh to this run, so every page is different and no
/// earlier run's memory could pass for it.
fn marker() -> Result<Vec<u8>> {
    let mut seed = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    let token = u64::from_le_bytes(seed);
    let mut out = Vec::with_capacity(MARKER_BYTES);
    let mut i = 0u64;
    while out.len() < MARKER_BYTES {
        out.extend_from_slice(format!("layered-probe {token:016x} line {i:08}\n").as_bytes());
        i += 1;
    }
    out.truncate(MARKER_BYTES);
    Ok(out)
}

/// Runs `script` with `sh -c`; its stdout, or why it failed.
fn sh(sb: &mut Sandbox, script: &str) -> Result<String> {
    let (out, err, code) =
        voidbox_tests::vm::sh(sb, script).map_err(|e| format!("exec {script:?}: {e}"))?;
    if code != Some(0) {
        return Err(format!("exec {script:?} exited {code:?}: {}", err.trim()));
    }
    Ok(out)
}

/// Why the VMM refused to restore `cfg`'s snapshot (`what`), or an error when it did not.
fn refusal(cfg: &SandboxConfig, what: &str) -> Result<String> {
    match Sandbox::start(cfg) {
        Err(SandboxError::SnapshotRefused(why)) => Ok(why),
        Err(e) => Err(format!("{what}: expected a refused snapshot, got: {e}")),
        Ok(_) => Err(format!("{what} was restored")),
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    let rd = std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))?;
    for e in rd {
        let e = e.map_err(|e| format!("reading {}: {e}", from.display()))?;
        std::fs::copy(e.path(), to.join(e.file_name()))
            .map_err(|err| format!("copying {}: {err}", e.path().display()))?;
    }
    Ok(())
}

/// Bytes a snapshot directory takes on disk (its files are sparse).
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}
