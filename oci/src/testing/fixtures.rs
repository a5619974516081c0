//! Fixture images built offline with `umoci` and pushed with `skopeo`.
//!
//! Layers are tar archives written here (with exact owners and modes, whiteouts and opaque
//! markers as the OCI spec spells them) or by a Python `tarfile` script ([`python_tar`],
//! for hostile archives), and appended with `umoci raw add-layer`.

use super::registry::{Registry, RegistryAuthMode};
use super::{herr, http_request, run, Result, BUSYBOX};
use base64::Engine as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The tag used inside the fixture's OCI layout.
const LAYOUT_TAG: &str = "fixture";

#[derive(Debug, Clone)]
enum Item {
    Dir {
        path: String,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    File {
        path: String,
        data: Vec<u8>,
        mode: u32,
        uid: u64,
        gid: u64,
    },
    Symlink {
        path: String,
        target: String,
    },
    Hardlink {
        path: String,
        target: String,
    },
}

/// One layer, described entry by entry (in archive order).
#[derive(Debug, Clone, Default)]
pub struct Layer {
    items: Vec<Item>,
}

impl Layer {
    /// An empty layer.
    pub fn new() -> Layer {
        Layer::default()
    }

    /// A directory owned by root.
    pub fn dir(self, path: &str, mode: u32) -> Layer {
        self.dir_owned(path, mode, 0, 0)
    }

    /// A directory owned by `uid:gid`.
    pub fn dir_owned(mut self, path: &str, mode: u32, uid: u64, gid: u64) -> Layer {
        self.items.push(Item::Dir {
            path: path.into(),
            mode,
            uid,
            gid,
        });
        self
    }

    /// A regular file owned by root.
    pub fn file(self, path: &str, data: impl AsRef<[u8]>, mode: u32) -> Layer {
        self.file_owned(path, data, mode, 0, 0)
    }

    /// A regular file owned by `uid:gid`.
    pub fn file_owned(
        mut self,
        path: &str,
        data: impl AsRef<[u8]>,
        mode: u32,
        uid: u64,
        gid: u64,
    ) -> Layer {
        self.items.push(Item::File {
            path: path.into(),
            data: data.as_ref().to_vec(),
            mode,
            uid,
            gid,
        });
        self
    }

    /// A symlink `path` → `target`.
    pub fn symlink(mut self, path: &str, target: &str) -> Layer {
        self.items.push(Item::Symlink {
            path: path.into(),
            target: target.into(),
        });
        self
    }

    /// A hardlink `path` to the earlier entry `target`.
    pub fn hardlink(mut self, path: &str, target: &str) -> Layer {
        self.items.push(Item::Hardlink {
            path: path.into(),
            target: target.into(),
        });
        self
    }

    /// A whiteout deleting `path` of lower layers (`dir/.wh.name`).
    pub fn whiteout(self, path: &str) -> Layer {
        let p = Path::new(path);
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let wh = match p.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => format!("{}/.wh.{name}", d.display()),
            None => format!(".wh.{name}"),
        };
        self.file(&wh, b"", 0o644)
    }

    /// An opaque marker: `dir` loses everything lower layers put in it.
    pub fn opaque(self, dir: &str) -> Layer {
        self.file(
            &format!("{}/.wh..wh..opq", dir.trim_end_matches('/')),
            b"",
            0o644,
        )
    }

    /// The busybox base: `/bin/busybox` (from `busybox-static`) with `sh`, `cat`, `ls`, … links,
    /// `/etc/passwd` and `/etc/group` with root, `/tmp` (1777), `/root` (0700).
    pub fn busybox_base() -> Result<Layer> {
        let busybox = std::fs::read(BUSYBOX)
            .map_err(|e| herr!("reading {BUSYBOX} (apt-get install busybox-static): {e}"))?;
        let mut l = Layer::new()
            .dir("bin", 0o755)
            .dir("etc", 0o755)
            .dir("tmp", 0o1777)
            .dir("root", 0o700)
            .dir("home", 0o755)
            .file("bin/busybox", busybox, 0o755)
            .file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)
            .file("etc/group", "root:x:0:\n", 0o644);
        for applet in [
            "sh", "cat", "ls", "echo", "id", "stat", "env", "pwd", "true", "false", "test",
            "mkdir", "touch", "rm", "sleep", "whoami", "head", "wc",
        ] {
            l = l.symlink(&format!("bin/{applet}"), "busybox");
        }
        Ok(l)
    }

    /// Writes the layer as an uncompressed tar archive.
    pub fn write_tar(&self, out: &Path) -> Result<()> {
        let file = std::fs::File::create(out)?;
        let mut b = tar::Builder::new(file);
        for item in &self.items {
            let mut h = tar::Header::new_gnu();
            h.set_mtime(0);
            h.set_uid(0);
            h.set_gid(0);
            match item {
                Item::Dir {
                    path,
                    mode,
                    uid,
                    gid,
                } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_uid(*uid);
                    h.set_gid(*gid);
                    h.set_size(0);
                    b.append_data(
                        &mut h,
                        format!("{}/", path.trim_end_matches('/')),
                        std::io::empty(),
                    )?;
                }
                Item::File {
                    path,
                    data,
                    mode,
                    uid,
                    gid,
                } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_uid(*uid);
                    h.set_gid(*gid);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, path, data.as_slice())?;
                }
                Item::Symlink { path, target } | Item::Hardlink { path, target } => {
                    let kind = if matches!(item, Item::Symlink { .. }) {
                        tar::EntryType::Symlink
                    } else {
                        tar::EntryType::Link
                    };
                    h.set_entry_type(kind);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, path, target)?;
                }
            }
        }
        b.into_inner()?;
        Ok(())
    }
}

/// Writes a tar archive to `out` with a Python `tarfile` script. The script body may call
/// `add_file(name, data=b"", mode=0o644, uid=0, gid=0)`, `add_dir(name, mode=0o755)`,
/// `add_symlink(name, target)`, `add_hardlink(name, target)` and
/// `add_device(name, kind=tarfile.CHRTYPE, major=1, minor=3)`, or use `tar` directly; names
/// are written verbatim (`../x`, `/abs`), which is the point.
pub fn python_tar(body: &str, out: &Path) -> Result<()> {
    let script = format!(
        r#"import io, sys, tarfile
tar = tarfile.open(sys.argv[1], "w", format=tarfile.GNU_FORMAT)
def _info(name, kind, mode, uid=0, gid=0):
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = mode
    ti.uid = uid
    ti.gid = gid
    ti.mtime = 0
    return ti
def add_file(name, data=b"", mode=0o644, uid=0, gid=0):
    ti = _info(name, tarfile.REGTYPE, mode, uid, gid)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))
def add_dir(name, mode=0o755, uid=0, gid=0):
    tar.addfile(_info(name, tarfile.DIRTYPE, mode, uid, gid))
def add_symlink(name, target):
    ti = _info(name, tarfile.SYMTYPE, 0o777)
    ti.linkname = target
    tar.addfile(ti)
def add_hardlink(name, target):
    ti = _info(name, tarfile.LNKTYPE, 0o644)
    ti.linkname = target
    tar.addfile(ti)
def add_device(name, kind=tarfile.CHRTYPE, major=1, minor=3):
    ti = _info(name, kind, 0o666)
    ti.devmajor = major
    ti.devminor = minor
    tar.addfile(ti)
{body}
tar.close()
"#
    );
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("make_layer.py");
    std::fs::write(&path, script)?;
    run(Command::new("python3").arg(&path).arg(out))?;
    Ok(())
}

/// An OCI image being assembled in a temporary OCI layout.
pub struct ImageBuilder {
    dir: tempfile::TempDir,
    layers: usize,
    config_args: Vec<String>,
    reproducible: bool,
}

/// The timestamp a reproducible image carries ([`ImageBuilder::reproducible`]).
const EPOCH: &str = "1970-01-01T00:00:00Z";

impl ImageBuilder {
    /// An image without layers.
    pub fn new() -> Result<ImageBuilder> {
        let dir = tempfile::Builder::new()
            .prefix("voidbox-fixture.")
            .tempdir()?;
        let layout = dir.path().join("layout");
        run(Command::new("umoci")
            .arg("init")
            .arg("--layout")
            .arg(&layout))?;
        let b = ImageBuilder {
            dir,
            layers: 0,
            config_args: Vec::new(),
            reproducible: false,
        };
        run(Command::new("umoci")
            .arg("new")
            .arg("--image")
            .arg(b.image_arg()))?;
        Ok(b)
    }

    /// An image whose first layer is [`Layer::busybox_base`].
    pub fn busybox() -> Result<ImageBuilder> {
        ImageBuilder::new()?.layer(Layer::busybox_base()?)
    }

    /// Makes the pushed image's digest depend on its content only: its config and history
    /// carry a fixed date instead of the build's. Every run of a test then pushes the same
    /// digest, so what voidbox caches per image (its erofs disk, the golden and warm
    /// snapshots of VMs that boot it) is made once and reused by later runs, as it is for
    /// an image a user pulls again.
    pub fn reproducible(mut self) -> ImageBuilder {
        self.reproducible = true;
        self
    }

    fn image_arg(&self) -> String {
        format!("{}:{LAYOUT_TAG}", self.layout().display())
    }

    /// The OCI layout directory.
    pub fn layout(&self) -> PathBuf {
        self.dir.path().join("layout")
    }

    /// Appends `layer` (gzip-compressed by umoci).
    pub fn layer(self, layer: Layer) -> Result<ImageBuilder> {
        let tar = self.dir.path().join(format!("layer-{}.tar", self.layers));
        layer.write_tar(&tar)?;
        self.layer_tar(&tar)
    }

    /// Appends an uncompressed tar archive as a layer, verbatim.
    pub fn layer_tar(mut self, tar: &Path) -> Result<ImageBuilder> {
        // The layer's history entry has a fixed date (the image's own `created` decides
        // whether its digest is reproducible).
        run(Command::new("umoci")
            .args(["raw", "add-layer", "--history.created", EPOCH, "--image"])
            .arg(self.image_arg())
            .arg(tar))?;
        self.layers += 1;
        Ok(self)
    }

    /// Adds `KEY=value` to the config's `Env`.
    pub fn env(mut self, kv: &str) -> ImageBuilder {
        self.config_args.push(format!("--config.env={kv}"));
        self
    }

    /// Sets `WorkingDir`.
    pub fn working_dir(mut self, dir: &str) -> ImageBuilder {
        self.config_args.push(format!("--config.workingdir={dir}"));
        self
    }

    /// Sets `User`.
    pub fn user(mut self, user: &str) -> ImageBuilder {
        self.config_args.push(format!("--config.user={user}"));
        self
    }

    /// Sets `Entrypoint`.
    pub fn entrypoint(mut self, args: &[&str]) -> ImageBuilder {
        for a in args {
            self.config_args.push(format!("--config.entrypoint={a}"));
        }
        self
    }

    /// Sets `Cmd`.
    pub fn cmd(mut self, args: &[&str]) -> ImageBuilder {
        for a in args {
            self.config_args.push(format!("--config.cmd={a}"));
        }
        self
    }

    /// Sets the config's `os` and `architecture` (default: linux/amd64).
    pub fn platform(mut self, os: &str, arch: &str) -> ImageBuilder {
        self.config_args.push(format!("--os={os}"));
        self.config_args.push(format!("--architecture={arch}"));
        self
    }

    /// Pushes the image to `registry` as `name:tag` (with the registry's credentials when it
    /// has some) and returns the manifest digest.
    pub fn push(&mut self, registry: &Registry, name_tag: &str) -> Result<String> {
        if self.reproducible {
            self.config_args.extend([
                format!("--created={EPOCH}"),
                format!("--history.created={EPOCH}"),
            ]);
        }
        if !self.config_args.is_empty() {
            run(Command::new("umoci")
                .arg("config")
                .arg("--image")
                .arg(self.image_arg())
                .args(std::mem::take(&mut self.config_args)))?;
        }
        let digest_file = self.dir.path().join("pushed.digest");
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
        ])
        .arg("--digestfile")
        .arg(&digest_file);
        if let Some((user, password)) = registry.credentials() {
            cmd.arg(format!("--dest-creds={user}:{password}"));
        }
        cmd.arg(format!("oci:{}", self.image_arg()))
            .arg(format!("docker://{}", registry.reference(name_tag)));
        run(&mut cmd)?;
        let digest = std::fs::read_to_string(&digest_file)?;
        Ok(digest.trim().to_string())
    }
}

/// Pushes a busybox image with one extra file at `path` holding `content`; returns its digest.
/// The e2e "node output comes from a file only in the image" fixture.
pub fn file_image(
    registry: &Registry,
    name_tag: &str,
    path: &str,
    content: &str,
) -> Result<String> {
    ImageBuilder::busybox()?
        .layer(Layer::new().file(path.trim_start_matches('/'), content, 0o644))?
        .push(registry, name_tag)
}

/// Pushes an image index as `name:tag` pointing at manifests already in `registry`, each given
/// as (`os/arch`, manifest digest); returns the index digest. Works with anonymous and basic-
/// auth registries.
pub fn push_index(
    registry: &Registry,
    name_tag: &str,
    manifests: &[(&str, &str)],
) -> Result<String> {
    let (name, tag) = name_tag
        .rsplit_once(':')
        .ok_or_else(|| herr!("push_index wants name:tag, got {name_tag}"))?;
    let mut auth_header = Vec::new();
    match registry.auth() {
        RegistryAuthMode::Anonymous => {}
        RegistryAuthMode::Basic { user, password } => {
            let b64 =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            auth_header.push(("Authorization".to_string(), format!("Basic {b64}")));
        }
        RegistryAuthMode::Token { .. } => {
            return Err(herr!("push_index: token registries unsupported"))
        }
    }
    let headers = |extra: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut h = auth_header.clone();
        h.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        h
    };
    let mut entries = Vec::new();
    for (platform, digest) in manifests {
        let h = headers(&[("Accept", "application/vnd.oci.image.manifest.v1+json")]);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let resp = http_request(
            &registry.host(),
            "GET",
            &format!("/v2/{name}/manifests/{digest}"),
            &h,
            b"",
        )?;
        if resp.status != 200 {
            return Err(herr!("GET manifest {digest}: HTTP {}", resp.status));
        }
        let (os, arch) = platform
            .split_once('/')
            .ok_or_else(|| herr!("platform must be os/arch, got {platform}"))?;
        entries.push(serde_json::json!({
            "mediaType": resp.header("content-type").unwrap_or("application/vnd.oci.image.manifest.v1+json"),
            "digest": digest,
            "size": resp.body.len(),
            "platform": {"architecture": arch, "os": os},
        }));
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    })
    .to_string();
    let h = headers(&[("Content-Type", "application/vnd.oci.image.index.v1+json")]);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let resp = http_request(
        &registry.host(),
        "PUT",
        &format!("/v2/{name}/manifests/{tag}"),
        &h,
        index.as_bytes(),
    )?;
    if resp.status != 201 {
        return Err(herr!(
            "PUT index: HTTP {}: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        ));
    }
    Ok(crate::Digest::of(index.as_bytes()).to_string())
}
