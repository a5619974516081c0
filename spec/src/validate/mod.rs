//! Spec validation: YAML with spans → JSON Schema → semantic rules → typed [`Spec`].
//!
//! Every problem in a file is reported at once, each with a stable code and a location.

pub mod artifacts;
pub mod entrypoints;
pub mod image_refs;
pub mod names;
pub mod network;
pub mod paths;
pub mod programs;
pub mod runtimes;
pub mod semantic;
pub mod skills;

use std::path::Path;
use std::sync::Arc;

use crate::diagnostic::{Diagnostic, FileReport, Span};
use crate::model::Spec;
use crate::schema;
use crate::yaml;

/// What validation knows of the host: nothing. Validation (`validate`, the LSP, `apply`'s
/// first step) is a function of the spec and the files it names, never of caches, images,
/// the network or the host, so a spec gets the same verdict on every machine; the checks
/// that need the guest image ([`programs::missing`], `cli:` skills) run in `apply` and
/// `apply --dry-run`. Kept so that callers' signatures stay stable: [`HostFacts::NONE`] is
/// its only value.
#[derive(Clone, Copy, Debug)]
pub struct HostFacts<'a> {
    _none: std::marker::PhantomData<&'a ()>,
}

impl HostFacts<'static> {
    /// No host facts (the only value).
    pub const NONE: HostFacts<'static> = HostFacts {
        _none: std::marker::PhantomData,
    };
}

/// Largest spec file accepted.
pub const MAX_SPEC_BYTES: u64 = 4 * 1024 * 1024;

/// The outcome of validating one file.
#[derive(Debug)]
pub struct Validated {
    /// Diagnostics (and the source, for rendering).
    pub report: FileReport,
    /// The typed spec, when the file has no errors.
    pub spec: Option<Spec>,
}

/// Why a path could not be validated at all (exit code 2 territory).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be opened or read.
    #[error("{path}: {reason}")]
    Io {
        /// The path as given.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Reads and validates the spec file at `path` (displayed as given), knowing nothing of the
/// host ([`validate_file_with`] takes [`HostFacts`]).
pub fn validate_file(path: &Path) -> Result<Validated, InputError> {
    validate_file_with(path, HostFacts::NONE)
}

/// Reads and validates the spec file at `path` (displayed as given) with what the caller
/// knows of the host.
pub fn validate_file_with(path: &Path, facts: HostFacts<'_>) -> Result<Validated, InputError> {
    let display = path.display().to_string();
    let io = |reason: String| InputError::Io {
        path: display.clone(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| io(io_reason(&e)))?;
    if meta.is_dir() {
        return Err(io("is a directory, not a spec file".into()));
    }
    if !meta.is_file() {
        // FIFOs, sockets and devices could block or never end.
        return Err(io("is not a regular file".into()));
    }
    if meta.len() > MAX_SPEC_BYTES {
        return Ok(single(
            &display,
            "",
            Diagnostic::error(
                "voidbox::too_large",
                format!(
                    "spec file is {} bytes; the limit is {MAX_SPEC_BYTES} bytes",
                    meta.len()
                ),
                Span::default(),
            ),
        ));
    }
    let bytes = read_capped(path, MAX_SPEC_BYTES).map_err(|e| io(io_reason(&e)))?;
    let base = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match String::from_utf8(bytes) {
        Ok(text) => Ok(validate_source_with(&display, text, base, facts)),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(&e.into_bytes()[..at]).into_owned();
            Ok(single(
                &display,
                &text,
                Diagnostic::error(
                    "voidbox::not_utf8",
                    format!("spec file is not UTF-8 text (invalid byte at offset {at})"),
                    Span::new(at, 0),
                )
                .with_help("is this a binary file?"),
            ))
        }
    }
}

/// Reads at most `cap + 1` bytes of `path` (one more than allowed, so a caller can tell a
/// file over the cap).
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_end(&mut buf)?;
    Ok(buf)
}

/// A short, stable description of an I/O error for diagnostics ("no such file or directory").
pub fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

fn single(path: &str, source: &str, d: Diagnostic) -> Validated {
    Validated {
        report: FileReport {
            path: path.to_string(),
            source: Arc::from(source),
            diagnostics: vec![d],
        },
        spec: None,
    }
}

/// Validates spec text; `base` is the directory relative paths are resolved against. Knows
/// nothing of the host ([`validate_source_with`] takes [`HostFacts`]).
pub fn validate_source(path: &str, text: String, base: &Path) -> Validated {
    validate_source_with(path, text, base, HostFacts::NONE)
}

/// Validates spec text with what the caller knows of the host; `base` is the directory
/// relative paths are resolved against.
pub fn validate_source_with(
    path: &str,
    text: String,
    base: &Path,
    facts: HostFacts<'_>,
) -> Validated {
    let source: Arc<str> = Arc::from(text);
    let mut diagnostics = Vec::new();
    if source.contains('\0') {
        let at = source.find('\0').unwrap_or(0);
        diagnostics.push(
            Diagnostic::error(
                "voidbox::not_utf8",
                format!("spec file contains a NUL byte at offset {at}"),
                Span::new(at, 0),
            )
            .with_help("is this a binary file?"),
        );
        return finish(path, source, diagnostics, None);
    }
    let root = match yaml::parse(&source) {
        Ok(root) => root,
        Err(e) => {
            diagnostics.push(
                Diagnostic::error(e.code, e.message, e.span)
                    .with_label("here")
                    .with_help_opt(e.help),
            );
            return finish(path, source, diagnostics, None);
        }
    };
    if !matches!(root.kind, yaml::NodeKind::Map(_)) {
        diagnostics.push(
            Diagnostic::error(
                "voidbox::invalid_type",
                "a spec must be a YAML mapping (`api_version: v1`, `kind: …`, `name: …`)",
                root.span,
            )
            .with_label("not a mapping"),
        );
        return finish(path, source, diagnostics, None);
    }
    let instance = root.to_json();
    diagnostics.extend(schema::validate(&root, &instance));
    semantic::check(&root, base, facts, &mut diagnostics);
    let spec = if diagnostics.iter().any(Diagnostic::is_error) {
        None
    } else {
        match serde_json::from_value::<Spec>(instance) {
            Ok(spec) => Some(spec),
            Err(e) => {
                diagnostics.push(Diagnostic::error(
                    "voidbox::internal",
                    format!("spec passed the schema but does not decode: {e}"),
                    Span::default(),
                ));
                None
            }
        }
    };
    finish(path, source, diagnostics, spec)
}

fn finish(
    path: &str,
    source: Arc<str>,
    mut diagnostics: Vec<Diagnostic>,
    spec: Option<Spec>,
) -> Validated {
    diagnostics.sort_by(|a, b| {
        (a.span.offset, a.code, &a.message).cmp(&(b.span.offset, b.code, &b.message))
    });
    diagnostics.dedup();
    Validated {
        report: FileReport {
            path: path.to_string(),
            source,
            diagnostics,
        },
        spec,
    }
}
