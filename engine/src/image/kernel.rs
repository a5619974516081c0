//! Building the guest kernel: unpack the Debian source, apply the patches, configure
//! from `allnoconfig` + fragments, verify the result, `make vmlinux`.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::deps::tail;
use super::error::ImageError;
use super::kconfig;
use super::recipe::{self, Profile};

/// A kernel build in `work` (a scratch directory).
pub struct KernelBuild<'a> {
    /// Scratch directory (the source tree goes in `work/<source dir>`).
    pub work: PathBuf,
    /// The source tarball.
    pub tarball: &'a Path,
    /// Profile.
    pub profile: Profile,
    /// `make -j`.
    pub jobs: usize,
    /// Log file receiving every command's output.
    pub log: PathBuf,
}

/// Output of a kernel build.
#[derive(Debug)]
pub struct BuiltKernel {
    /// The `vmlinux` ELF.
    pub vmlinux: PathBuf,
    /// The final `.config`.
    pub config: PathBuf,
    /// `make kernelrelease`.
    pub release: String,
}

impl KernelBuild<'_> {
    fn src(&self) -> PathBuf {
        self.work.join(recipe::KERNEL_SOURCE_DIR)
    }

    /// Runs `cmd`, appending its output to the log and passing each line to `line`.
    fn run(
        &self,
        step: &str,
        cmd: &mut Command,
        line: &mut dyn FnMut(&str),
    ) -> Result<String, ImageError> {
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(ImageError::io(&self.log))?;
        let _ = writeln!(log, "\n$ {cmd:?}");
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| ImageError::Step {
            step: step.to_string(),
            log_tail: format!("cannot run {:?}: {e}", cmd.get_program()),
            log: None,
        })?;
        // stderr is drained on a thread so neither pipe can fill up.
        let stderr = child.stderr.take().map(|s| {
            std::thread::spawn(move || {
                let mut buf = String::new();
                for l in BufReader::new(s).lines().map_while(Result::ok) {
                    buf.push_str(&l);
                    buf.push('\n');
                }
                buf
            })
        });
        let mut out = String::new();
        if let Some(stdout) = child.stdout.take() {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{l}");
                line(&l);
                out.push_str(&l);
                out.push('\n');
            }
        }
        let err = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
        let _ = log.write_all(err.as_bytes());
        let status = child.wait().map_err(ImageError::io(&self.log))?;
        if !status.success() {
            let combined = format!("{out}{err}");
            return Err(ImageError::Step {
                step: format!("{step} ({status})"),
                log_tail: tail(&combined, 30),
                log: Some(self.log.clone()),
            });
        }
        Ok(out)
    }

    fn make(&self) -> Command {
        let mut c = Command::new("make");
        c.current_dir(self.src()).arg("ARCH=x86_64");
        for (k, v) in recipe::KBUILD_ENV {
            c.env(k, v);
        }
        match self.profile.kcflags() {
            Some(f) => c.env("KCFLAGS", f),
            None => c.env_remove("KCFLAGS"),
        };
        c.env("LC_ALL", "C")
            .env_remove("ARCH")
            .env_remove("CROSS_COMPILE");
        c
    }

    /// Unpacks the source tarball into the work directory.
    pub fn unpack(&self) -> Result<(), ImageError> {
        fs::create_dir_all(&self.work).map_err(ImageError::io(&self.work))?;
        self.run(
            "unpacking the kernel source",
            Command::new("tar")
                .arg("-xf")
                .arg(self.tarball)
                .arg("-C")
                .arg(&self.work),
            &mut |_| {},
        )?;
        if !self.src().is_dir() {
            return Err(ImageError::Environment(format!(
                "{} did not contain {}/",
                self.tarball.display(),
                recipe::KERNEL_SOURCE_DIR
            )));
        }
        Ok(())
    }

    /// Applies [`recipe::PATCHES`] in order.
    pub fn patch(&self) -> Result<(), ImageError> {
        let dir = self.work.join("patches");
        fs::create_dir_all(&dir).map_err(ImageError::io(&dir))?;
        for (name, text) in recipe::PATCHES {
            let p = dir.join(name);
            fs::write(&p, text).map_err(ImageError::io(&p))?;
            self.run(
                &format!("applying {name}"),
                Command::new("patch")
                    .current_dir(self.src())
                    .args([
                        "-p1",
                        "--forward",
                        "--batch",
                        "--no-backup-if-mismatch",
                        "-i",
                    ])
                    .arg(&p),
                &mut |_| {},
            )?;
        }
        Ok(())
    }

    /// `allnoconfig` + the profile's fragments, `olddefconfig`, then checks every
    /// requested option.
    pub fn configure(&self) -> Result<(), ImageError> {
        let dir = self.work.join("config");
        fs::create_dir_all(&dir).map_err(ImageError::io(&dir))?;
        let mut paths = Vec::new();
        let mut parsed = Vec::new();
        for (name, text) in self.profile.fragments() {
            parsed.push(kconfig::parse_fragment(name, text)?);
            let p = dir.join(name);
            fs::write(&p, text).map_err(ImageError::io(&p))?;
            paths.push(p);
        }
        let mut merge = Command::new("scripts/kconfig/merge_config.sh");
        merge
            .current_dir(self.src())
            .env("ARCH", "x86_64")
            .arg("-n")
            .args(&paths);
        self.run(
            "merge_config.sh (allnoconfig + fragments)",
            &mut merge,
            &mut |_| {},
        )?;
        self.run(
            "make olddefconfig",
            self.make().arg("olddefconfig"),
            &mut |_| {},
        )?;
        let cfg_path = self.src().join(".config");
        let cfg = fs::read_to_string(&cfg_path).map_err(ImageError::io(&cfg_path))?;
        let requested = kconfig::merge(parsed.iter().map(Vec::as_slice));
        let bad = kconfig::verify(&requested, &cfg);
        if !bad.is_empty() {
            return Err(ImageError::Config(bad));
        }
        Ok(())
    }

    /// `make vmlinux`; `progress` gets each output line.
    pub fn compile(&self, progress: &mut dyn FnMut(&str)) -> Result<BuiltKernel, ImageError> {
        self.run(
            "make vmlinux",
            self.make()
                .arg(format!("-j{}", self.jobs.max(1)))
                .arg("vmlinux"),
            progress,
        )?;
        let release = self
            .run(
                "make kernelrelease",
                self.make().arg("-s").arg("kernelrelease"),
                &mut |_| {},
            )?
            .trim()
            .to_string();
        Ok(BuiltKernel {
            vmlinux: self.src().join("vmlinux"),
            config: self.src().join(".config"),
            release,
        })
    }
}

/// Rough number of compile steps of a build, for the progress bar.
pub const EXPECTED_COMPILE_STEPS: u64 = 1240;

/// Whether a `make` output line is one compile step (`  CC      foo.o`, `  AS …`).
pub fn is_compile_step(line: &str) -> bool {
    let t = line.trim_start();
    line.starts_with("  ")
        && ["CC ", "AS ", "LD ", "AR "]
            .iter()
            .any(|p| t.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_steps() {
        assert!(is_compile_step("  CC      kernel/fork.o"));
        assert!(is_compile_step("  AS      arch/x86/entry/entry_64.o"));
        assert!(!is_compile_step("make[1]: Entering directory"));
        assert!(!is_compile_step("CC kernel"));
    }
}
