//! The guest's busybox.
//!
//! Debian bookworm's `busybox-static` (1:1.35.0) is built without wget's timeout support yet
//! still parses `-T` as a number written through a null pointer, so `wget -T N` segfaults
//! (exit 139) before it connects — hiding, among other things, a network denial. Debian
//! enabled `FEATURE_WGET_TIMEOUT` in 1:1.36.1-5. The image takes trixie's static build
//! ([`VERSION`]), fetched with apt into a private state directory — the host's apt sources,
//! lists and installed packages stay as they are; only its mirrors (from `apt-get
//! indextargets`), proxy settings and Debian's archive keyring are used — then checked
//! (the `.deb`'s SHA-256 when it is the pinned version, and a real `wget -T 1` against a
//! local listener that never answers) and cached under `busybox/<version>/` of the image
//! cache, so later builds need no network. Being static, it runs on any host.

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cache::Cache;
use super::deps::tail;
use super::error::ImageError;
use super::manifest::sha256_file;

/// The Debian package.
pub const PACKAGE: &str = "busybox-static";
/// The Debian release it comes from.
pub const SUITE: &str = "trixie";
/// The pinned version (a later one of [`SUITE`] is taken, with a warning, once Debian no
/// longer offers this one; either must pass [`check_wget_timeout`]).
pub const VERSION: &str = "1:1.37.0-6+b9";
/// SHA-256 of the pinned version's `.deb`.
pub const DEB_SHA256: &str = "598a3fd92bdafc34cd81196b2952ad36e910e47a4ecf162f8ce5e8e262598e53";
/// The first Debian version whose wget has `-T` (`FEATURE_WGET_TIMEOUT`).
pub const FIRST_FIXED: &str = "1:1.36.1-5";
/// Debian's archive keyring (it carries trixie's keys from bookworm's 2023.3+deb12u1 on).
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A checked static busybox for the guest.
#[derive(Debug, Clone)]
pub struct GuestBusybox {
    /// The binary (named `busybox`, so it dispatches applets by `argv[1]`).
    pub path: PathBuf,
    /// Its Debian version.
    pub version: String,
}

/// The cached guest busybox, fetched (and checked) first when it is not cached yet;
/// `log` receives a line per step.
pub fn ensure(cache: &Cache, log: &mut dyn FnMut(&str)) -> Result<GuestBusybox, ImageError> {
    if let Some(b) = cached(cache, VERSION) {
        return Ok(b);
    }
    let _lock = cache.lock("busybox", &mut || {
        log("another process is fetching busybox; waiting for it")
    })?;
    if let Some(b) = cached(cache, VERSION) {
        return Ok(b);
    }
    log(&format!(
        "fetching {PACKAGE} {VERSION} from Debian {SUITE} (apt-get, private state) for the guest"
    ));
    let work = cache
        .tmp_dir()?
        .join(format!("busybox-{}", std::process::id()));
    if work.exists() {
        fs::remove_dir_all(&work).map_err(ImageError::io(&work))?;
    }
    let result = fetch(cache, &work, log);
    let _ = fs::remove_dir_all(&work);
    result
}

fn cached(cache: &Cache, version: &str) -> Option<GuestBusybox> {
    let dir = version_dir(cache, version);
    let path = dir.join("busybox");
    let recorded = fs::read_to_string(dir.join("version")).ok()?;
    (path.is_file() && recorded.trim() == version).then(|| GuestBusybox {
        path,
        version: version.to_string(),
    })
}

/// `busybox/<version>/` (the epoch's `:` is not path-friendly: `1:1.37.0-6` → `1_1.37.0-6`).
fn version_dir(cache: &Cache, version: &str) -> PathBuf {
    let name: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+.-~".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    cache.root().join("busybox").join(name)
}

fn fetch(
    cache: &Cache,
    work: &Path,
    log: &mut dyn FnMut(&str),
) -> Result<GuestBusybox, ImageError> {
    let apt = PrivateApt::create(work)?;
    apt.run(&["update"], work)?;
    let dl = work.join("dl");
    mkdir(&dl)?;
    if let Err(pinned) = apt.run(&["download", &format!("{PACKAGE}={VERSION}")], &dl) {
        // Debian keeps only a release's current version: take it, it is checked below.
        log(&format!(
            "warning: {PACKAGE} {VERSION} is no longer in Debian {SUITE} ({}); taking its current version — \
             update engine/src/image/busybox.rs's pin",
            pinned.to_string().lines().last().unwrap_or_default().trim()
        ));
        apt.run(&["download", PACKAGE], &dl)?;
    }
    let deb = fs::read_dir(&dl)
        .map_err(ImageError::io(&dl))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| {
            ImageError::Environment(format!("apt-get download {PACKAGE} left no .deb"))
        })?;
    let version = command_out(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(&deb)
            .arg("Version"),
        "dpkg-deb -f",
    )?
    .trim()
    .to_string();
    let sha = sha256_file(&deb)?;
    if version == VERSION && sha != DEB_SHA256 {
        return Err(ImageError::Environment(format!(
            "{}: SHA-256 {sha}, but {PACKAGE} {VERSION} is pinned as {DEB_SHA256}",
            deb.display()
        )));
    }
    if !at_least(&version, FIRST_FIXED) {
        return Err(ImageError::Environment(format!(
            "Debian {SUITE} offers {PACKAGE} {version}, older than {FIRST_FIXED} (whose wget has -T)"
        )));
    }
    let root = work.join("root");
    command_out(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        "dpkg-deb -x",
    )?;
    let binary = ["usr/bin/busybox", "bin/busybox"]
        .iter()
        .map(|p| root.join(p))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            ImageError::Environment(format!("{} holds no busybox binary", deb.display()))
        })?;
    let stage = work.join("stage");
    mkdir(&stage)?;
    let path = stage.join("busybox");
    fs::copy(&binary, &path).map_err(ImageError::io(&path))?;
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(ImageError::io(&path))?;
    }
    check_wget_timeout(&path).map_err(|e| {
        ImageError::Environment(format!("{PACKAGE} {version} from Debian {SUITE}: {e}"))
    })?;
    let vfile = stage.join("version");
    fs::write(&vfile, format!("{version}\n")).map_err(ImageError::io(&vfile))?;
    let dsha = stage.join("deb.sha256");
    fs::write(&dsha, format!("{sha}\n")).map_err(ImageError::io(&dsha))?;
    let dest = version_dir(cache, &version);
    if let Some(parent) = dest.parent() {
        mkdir(parent)?;
    }
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(ImageError::io(&dest))?;
    }
    fs::rename(&stage, &dest).map_err(ImageError::io(&dest))?;
    log(&format!("{PACKAGE} {version}: wget -T checked"));
    Ok(GuestBusybox {
        path: dest.join("busybox"),
        version,
    })
}

/// apt with its own sources list (trixie from the host's Debian mirrors), lists, cache and
/// (no) preferences.
struct PrivateApt {
    options: Vec<String>,
}

impl PrivateApt {
    fn create(work: &Path) -> Result<PrivateApt, ImageError> {
        let targets = command_out(
            Command::new("apt-get").args([
                "indextargets",
                "--format",
                "$(REPO_URI)\t$(RELEASE)\t$(LABEL)",
                "Identifier: Packages",
            ]),
            "apt-get indextargets",
        )?;
        let codename = os_release_codename();
        let sources = sources_list(&targets, codename.as_deref(), Path::new(KEYRING).is_file())
            .ok_or_else(|| {
                ImageError::Environment(
                    "apt's sources name no Debian archive to fetch the guest's busybox from \
                     (a Debian host with `deb` sources is needed; run `apt-get update` first)"
                        .into(),
                )
            })?;
        for d in [
            "lists/partial",
            "cache/archives/partial",
            "sources.list.d",
            "preferences.d",
        ] {
            mkdir(&work.join(d))?;
        }
        let list = work.join("sources.list");
        fs::write(&list, sources).map_err(ImageError::io(&list))?;
        let opt = |k: &str, v: &Path| format!("{k}={}", v.display());
        let mut options = vec![
            opt("Dir::Etc::SourceList", &list),
            opt("Dir::Etc::SourceParts", &work.join("sources.list.d")),
            opt("Dir::State::Lists", &work.join("lists")),
            opt("Dir::Cache", &work.join("cache")),
            opt("Dir::Etc::Preferences", &work.join("preferences")),
            opt("Dir::Etc::PreferencesParts", &work.join("preferences.d")),
        ];
        options.extend(
            [
                "Acquire::Languages=none",
                "APT::Architectures=amd64",
                "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
                "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false",
                "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false",
            ]
            .map(String::from),
        );
        Ok(PrivateApt { options })
    }

    fn run(&self, args: &[&str], cwd: &Path) -> Result<String, ImageError> {
        let mut c = Command::new("apt-get");
        c.arg("-q").current_dir(cwd);
        for o in &self.options {
            c.arg("-o").arg(o);
        }
        c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        command_out(&mut c, &format!("apt-get {}", args.join(" ")))
    }
}

/// The sources list for [`SUITE`] from `apt-get indextargets` lines (`URI\tRELEASE\tLABEL`):
/// the host's Debian archive (label `Debian`, or the suite named after this host's codename)
/// and its security archive (`Debian-Security`, or `<codename>-security`).
fn sources_list(targets: &str, codename: Option<&str>, keyring: bool) -> Option<String> {
    let (mut main, mut security) = (None, None);
    for line in targets.lines() {
        let mut f = line.split('\t');
        let (Some(uri), Some(release), label) = (f.next(), f.next(), f.next().unwrap_or("")) else {
            continue;
        };
        let uri = uri.trim();
        if uri.is_empty() {
            continue;
        }
        let is_main = label == "Debian" || (label.is_empty() && Some(release) == codename);
        let is_security = label == "Debian-Security"
            || (label.is_empty() && codename.is_some_and(|c| release == format!("{c}-security")));
        if is_main && main.is_none() && !release.contains('-') {
            main = Some(uri.to_string());
        } else if is_security && security.is_none() {
            security = Some(uri.to_string());
        }
    }
    let signed = if keyring {
        format!(" [signed-by={KEYRING}]")
    } else {
        String::new()
    };
    let mut out = format!("deb{signed} {} {SUITE} main\n", main?);
    if let Some(s) = security {
        out.push_str(&format!("deb{signed} {s} {SUITE}-security main\n"));
    }
    Some(out)
}

fn os_release_codename() -> Option<String> {
    let text = fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

fn mkdir(p: &Path) -> Result<(), ImageError> {
    fs::create_dir_all(p).map_err(ImageError::io(p))
}

fn command_out(c: &mut Command, step: &str) -> Result<String, ImageError> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ImageError::Environment(format!("running {step}: {e}")))?;
    if !out.status.success() {
        return Err(ImageError::Step {
            step: step.to_string(),
            log_tail: tail(
                &format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
                10,
            ),
            log: None,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `busybox wget -T 1` against a local listener that accepts (the kernel completes the
/// handshake) and never answers: it must give up on its own, exiting 1 with "timed out" —
/// not crash (bookworm's 1.35: signal 11) nor ignore `-T` (killed after 20 s). Returns how
/// long it took.
pub fn check_wget_timeout(busybox: &Path) -> Result<Duration, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a local listener: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("a local listener: {e}"))?
        .port();
    let started = Instant::now();
    let mut child = Command::new(busybox)
        .args(["wget", "-q", "-T", "1", "-O", "/dev/null"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {} wget: {e}", busybox.display()))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if started.elapsed() > Duration::from_secs(20) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("`wget -T 1` was still waiting after 20 s: -T is ignored".into());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for wget: {e}")),
        }
    };
    let elapsed = started.elapsed();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    drop(listener);
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(1), _) if stderr.contains("timed out") => Ok(elapsed),
        (_, Some(sig)) => Err(format!("`wget -T 1` was killed by signal {sig}")),
        (code, _) => Err(format!(
            "`wget -T 1` against a listener that never answers exited {code:?}: {}",
            stderr.trim()
        )),
    }
}

/// Whether Debian version `v` is at least `min` (`[epoch:]upstream[-revision]`, numeric
/// parts compared as numbers). An unparsable version is not.
pub fn at_least(v: &str, min: &str) -> bool {
    match (parse_version(v), parse_version(min)) {
        (Some(a), Some(b)) => a >= b,
        _ => false,
    }
}

fn parse_version(v: &str) -> Option<(u64, Vec<u64>, u64)> {
    let (epoch, rest) = match v.split_once(':') {
        Some((e, r)) => (e.parse().ok()?, r),
        None => (0, v),
    };
    let (upstream, revision) = rest.rsplit_once('-').unwrap_or((rest, "0"));
    let upstream = upstream
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    let digits: String = revision
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    Some((epoch, upstream, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_debian_does_for_busybox() {
        assert!(at_least(VERSION, FIRST_FIXED));
        assert!(at_least("1:1.36.1-5", FIRST_FIXED));
        assert!(at_least("1:1.36.1-10", FIRST_FIXED));
        assert!(at_least("1:1.37.0-1", FIRST_FIXED));
        assert!(!at_least("1:1.36.1-4", FIRST_FIXED));
        assert!(!at_least("1:1.35.0-4+deb12u1+b1", FIRST_FIXED));
        assert!(!at_least("1.99.0-1", FIRST_FIXED), "epoch 0 < 1");
        assert!(!at_least("test", FIRST_FIXED));
        assert!(!at_least("", FIRST_FIXED));
    }

    #[test]
    fn sources_come_from_the_host_s_debian_mirrors() {
        let targets = "http://m.example/debian-security/\tbookworm-security\tDebian-Security\n\
                       http://m.example/debian/\tbookworm-updates\tDebian\n\
                       http://m.example/debian/\tbookworm\tDebian\n\
                       https://deb.other.example/node\tnodistro\tNode\n";
        assert_eq!(
            sources_list(targets, Some("bookworm"), true).unwrap(),
            format!(
                "deb [signed-by={KEYRING}] http://m.example/debian/ trixie main\n\
                 deb [signed-by={KEYRING}] http://m.example/debian-security/ trixie-security main\n"
            )
        );
        // Lists never downloaded: no labels; the suites named after the codename.
        let bare = "http://m.example/debian/\tbookworm\t\n\
                    http://m.example/sec/\tbookworm-security\t\n\
                    https://deb.other.example/node\tnodistro\t\n";
        assert_eq!(
            sources_list(bare, Some("bookworm"), false).unwrap(),
            "deb http://m.example/debian/ trixie main\ndeb http://m.example/sec/ trixie-security main\n"
        );
        assert_eq!(sources_list(bare, None, true), None);
        assert_eq!(
            sources_list(
                "https://deb.other.example/node\tnodistro\tNode\n",
                None,
                true
            ),
            None
        );
    }

    #[test]
    fn cache_directory_names_are_path_friendly() {
        let c = Cache::new("/c");
        assert_eq!(
            version_dir(&c, "1:1.37.0-6+b9"),
            Path::new("/c/busybox/1_1.37.0-6+b9")
        );
        assert_eq!(version_dir(&c, "../x"), Path::new("/c/busybox/.._x"));
    }

    /// The check catches bookworm's busybox (the bug this module exists for) where the host
    /// has it.
    #[test]
    fn bookworm_s_busybox_fails_the_check() {
        let host = Path::new(super::super::deps::BUSYBOX_PATH);
        let version = super::super::deps::installed_version(PACKAGE);
        if !host.is_file() || version.as_deref().is_some_and(|v| at_least(v, FIRST_FIXED)) {
            return;
        }
        let err = check_wget_timeout(host).unwrap_err();
        assert!(err.contains("signal 11"), "{err}");
    }

    /// The guest's busybox (fetched into the user's image cache when not there yet, as an
    /// image build would) is the pinned version, and its `wget -T` times out.
    #[test]
    fn the_guest_busybox_times_out() {
        let cache = Cache::open(None).unwrap();
        let bb = ensure(&cache, &mut |l| eprintln!("{l}")).unwrap();
        assert!(at_least(&bb.version, FIRST_FIXED), "{}", bb.version);
        let took = check_wget_timeout(&bb.path).unwrap();
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(10),
            "{took:?}"
        );
    }
}
