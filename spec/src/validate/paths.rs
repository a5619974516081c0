//! Host paths in a spec, as `validate` checks them: resolved like the plan resolves them
//! ([`host_path::resolve`]), with a located warning when only the working directory has
//! the path (void-box's rule) — naming both paths.

use std::path::Path;

use crate::diagnostic::{Diagnostic, Span};
use crate::host_path::{self, Resolved};

/// Resolves `rel` against `base` (the spec file's directory), warning at `span` when the
/// working-directory fallback is used.
pub fn resolve(base: &Path, rel: &str, span: Span, out: &mut Vec<Diagnostic>) -> Resolved {
    let r = host_path::resolve(base, rel);
    if let Resolved::Cwd { spec, cwd } = &r {
        out.push(
            Diagnostic::warning(
                "voidbox::cwd_relative_path",
                format!(
                    "`{rel}` does not exist relative to the spec file ({}) but does relative to the working directory ({}); using {}",
                    spec.display(),
                    cwd.display(),
                    cwd.display()
                ),
                span,
            )
            .with_label("found relative to the working directory")
            .with_help("void-box resolves host paths against the working directory, voidbox against the spec file: write the path relative to the spec file"),
        );
    }
    r
}
