//! `voidbox validate`'s diagnostics as LSP diagnostics: the same validation (same code
//! path, same host facts as the CLI passes), the same codes, ranges and help. A YAML file
//! that is not a spec (a CI workflow, a Kubernetes manifest) gets none, by the rule
//! `validate <dir>` skips it by ([`looks_like_spec`]).

use std::path::Path;

use lsp_types::{
    Diagnostic, DiagnosticRelatedInformation, DiagnosticSeverity, Location, NumberOrString, Uri,
};
use voidbox_spec::diagnostic::Severity;
use voidbox_spec::validate::{validate_source_with, HostFacts};
use voidbox_spec::yaml::looks_like_spec;

use crate::document::Document;

/// Validates `doc` (relative paths against `base`) and converts what `validate` reports;
/// nothing for a document that is not a spec.
pub fn of(
    uri: &Uri,
    name: &str,
    doc: &Document,
    base: &Path,
    facts: HostFacts<'_>,
) -> Vec<Diagnostic> {
    if !looks_like_spec(&doc.text) {
        return Vec::new();
    }
    let v = validate_source_with(name, doc.text.clone(), base, facts);
    v.report
        .diagnostics
        .iter()
        .map(|d| {
            let mut message = d.message.clone();
            if let Some(label) = &d.label {
                message.push_str(&format!(" ({label})"));
            }
            if let Some(help) = &d.help {
                message.push_str("\nhelp: ");
                message.push_str(help);
            }
            let related: Vec<DiagnosticRelatedInformation> = d
                .related
                .iter()
                .map(|r| DiagnosticRelatedInformation {
                    location: Location::new(uri.clone(), doc.range(r.span)),
                    message: r.label.clone(),
                })
                .collect();
            Diagnostic {
                range: doc.range(d.span),
                severity: Some(match d.severity {
                    Severity::Error => DiagnosticSeverity::ERROR,
                    Severity::Warning => DiagnosticSeverity::WARNING,
                }),
                code: Some(NumberOrString::String(d.code.to_string())),
                source: Some("voidbox".into()),
                message,
                related_information: (!related.is_empty()).then_some(related),
                ..Diagnostic::default()
            }
        })
        .collect()
}
