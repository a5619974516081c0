//! Located diagnostics and their renderings (human via miette, JSON, GitHub annotations).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteDiagnostic, NamedSource};
use serde::Serialize;

/// A byte range in a source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Span {
    /// Byte offset of the first byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl Span {
    /// A span from an offset and a length.
    pub const fn new(offset: usize, len: usize) -> Self {
        Self { offset, len }
    }

    /// The span from the start of `self` to the end of `other`.
    pub fn to(self, other: Span) -> Span {
        let end = (other.offset + other.len).max(self.offset + self.len);
        Span::new(self.offset, end - self.offset)
    }
}

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The spec is invalid.
    Error,
    /// The spec is valid but something deserves attention.
    Warning,
}

/// A secondary location attached to a diagnostic ("first defined here").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Related {
    /// Where.
    pub span: Span,
    /// What is there.
    pub label: String,
}

/// One problem found in a spec file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Stable code such as `voidbox::unknown_field`.
    pub code: &'static str,
    /// Error or warning.
    pub severity: Severity,
    /// One-line description.
    pub message: String,
    /// Primary location.
    pub span: Span,
    /// Label under the primary location.
    pub label: Option<String>,
    /// Advice ("did you mean `timeout_secs`?").
    pub help: Option<String>,
    /// Secondary locations.
    pub related: Vec<Related>,
}

impl Diagnostic {
    /// An error at `span`.
    pub fn error(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Self {
            code,
            severity: Severity::Error,
            message: message.into(),
            span,
            label: None,
            help: None,
            related: Vec::new(),
        }
    }

    /// A warning at `span`.
    pub fn warning(code: &'static str, message: impl Into<String>, span: Span) -> Self {
        Self {
            severity: Severity::Warning,
            ..Self::error(code, message, span)
        }
    }

    /// Adds a help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Adds an optional help line.
    pub fn with_help_opt(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    /// Adds a label under the primary span.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Adds a secondary location.
    pub fn with_related(mut self, span: Span, label: impl Into<String>) -> Self {
        self.related.push(Related {
            span,
            label: label.into(),
        });
        self
    }

    /// Whether this diagnostic makes the spec invalid.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// All diagnostics of one file, with its source for rendering.
#[derive(Debug, Clone)]
pub struct FileReport {
    /// The path as given by the user.
    pub path: String,
    /// The file's text (empty when it could not be read).
    pub source: Arc<str>,
    /// Problems, in source order.
    pub diagnostics: Vec<Diagnostic>,
}

/// A diagnostic with its resolved location, as printed in JSON.
#[derive(Debug, Serialize)]
pub struct LocatedDiagnostic<'a> {
    /// The file.
    pub file: &'a str,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (characters).
    pub column: usize,
    /// Stable code.
    pub code: &'a str,
    /// Error or warning.
    pub severity: Severity,
    /// Description.
    pub message: &'a str,
    /// Advice, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub help: Option<&'a str>,
}

impl FileReport {
    /// Whether any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// 1-based line and column of a span.
    pub fn location(&self, span: Span) -> (usize, usize) {
        line_col(&self.source, span.offset)
    }

    /// Diagnostics with file/line/column resolved.
    pub fn located(&self) -> impl Iterator<Item = LocatedDiagnostic<'_>> {
        self.diagnostics.iter().map(|d| {
            let (line, column) = self.location(d.span);
            LocatedDiagnostic {
                file: &self.path,
                line,
                column,
                code: d.code,
                severity: d.severity,
                message: &d.message,
                help: d.help.as_deref(),
            }
        })
    }

    /// Renders every diagnostic with miette's graphical handler (source snippet, labels, help).
    /// Control characters of the spec (an `ESC` sequence that would retitle the terminal, a
    /// `BEL`, a lone `CR`) and bidirectional overrides are written visibly (`\u{1b}`), in the
    /// snippet and in every message, label and help that quotes the spec.
    pub fn render_human(&self, color: bool) -> String {
        let theme = if color {
            GraphicalTheme::unicode()
        } else {
            GraphicalTheme::unicode_nocolor()
        };
        let handler = GraphicalReportHandler::new_themed(theme).with_context_lines(2);
        let source = VisibleSource::of(&self.source);
        let path = visible(&self.path);
        let mut out = String::new();
        for d in &self.diagnostics {
            let (line, column) = self.location(d.span);
            let clamp = |s: Span| {
                let start = s.offset.min(self.source.len());
                let end = (s.offset + s.len).min(self.source.len());
                let (start, end) = (source.map(start), source.map(end));
                (start, end - start)
            };
            let label = d.label.as_deref().unwrap_or("here");
            let mut labels = vec![LabeledSpan::new_primary_with_span(
                Some(visible(label).into_owned()),
                clamp(d.span),
            )];
            labels.extend(d.related.iter().map(|r| {
                LabeledSpan::new_with_span(Some(visible(&r.label).into_owned()), clamp(r.span))
            }));
            let message = visible(&d.message);
            let mut md = MietteDiagnostic::new(format!("{path}:{line}:{column}: {message}"))
                .with_code(d.code)
                .with_severity(match d.severity {
                    Severity::Error => miette::Severity::Error,
                    Severity::Warning => miette::Severity::Warning,
                })
                .with_labels(labels);
            if let Some(help) = &d.help {
                md = md.with_help(visible(help).into_owned());
            }
            let report = miette::Report::new(md)
                .with_source_code(NamedSource::new(path.as_ref(), source.text.clone()));
            if handler.render_report(&mut out, report.as_ref()).is_err() {
                let _ = writeln!(out, "{path}:{line}:{column}: {message} [{}]", d.code);
            }
            out.push('\n');
        }
        out
    }

    /// Renders GitHub Actions workflow commands (`::error file=…,line=…,col=…::message`).
    pub fn render_github(&self) -> String {
        let mut out = String::new();
        for d in self.located() {
            let level = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let mut msg = format!("{} [{}]", visible(d.message), d.code);
            if let Some(help) = d.help {
                let _ = write!(msg, " help: {}", visible(help));
            }
            let _ = writeln!(
                out,
                "::{level} file={},line={},col={},title={}::{}",
                gh_escape_property(&visible(d.file)),
                d.line,
                d.column,
                gh_escape_property(d.code),
                gh_escape_data(&msg)
            );
        }
        out
    }
}

/// Whether `c` must not reach a terminal as is: a control character other than newline and
/// tab (`ESC` starts escape sequences, `BEL` rings, `CR` overwrites the line), or a
/// bidirectional override that reorders what is shown.
fn hidden(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Whether the character at byte `i` of `s` is hidden ([`hidden`]); the `CR` of a `CRLF`
/// line end is not.
fn hidden_at(s: &str, i: usize, c: char) -> bool {
    hidden(c) && !(c == '\r' && s.as_bytes().get(i + 1) == Some(&b'\n'))
}

/// `s` with the characters that could drive a terminal ([`hidden`]) written visibly, as
/// Rust escapes (`\u{1b}`): for every text that quotes a spec and goes to a terminal.
pub fn visible(s: &str) -> Cow<'_, str> {
    if !s.char_indices().any(|(i, c)| hidden_at(s, i, c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for (i, c) in s.char_indices() {
        if hidden_at(s, i, c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A source made [`visible`], with the map from its original byte offsets to the new ones
/// (so that spans still point at the same text).
struct VisibleSource {
    text: String,
    /// Per escaped character: its original offset and the bytes added up to and with it.
    shifts: Vec<(usize, usize)>,
}

impl VisibleSource {
    fn of(source: &str) -> Self {
        let mut text = String::with_capacity(source.len());
        let mut shifts = Vec::new();
        let mut added = 0;
        for (i, c) in source.char_indices() {
            if hidden_at(source, i, c) {
                let before = text.len();
                text.extend(c.escape_unicode());
                added += text.len() - before - c.len_utf8();
                shifts.push((i, added));
            } else {
                text.push(c);
            }
        }
        VisibleSource { text, shifts }
    }

    /// The offset in `text` of original offset `offset`.
    fn map(&self, offset: usize) -> usize {
        let n = self.shifts.partition_point(|(at, _)| *at < offset);
        offset + n.checked_sub(1).map_or(0, |i| self.shifts[i].1)
    }
}

fn gh_escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn gh_escape_property(s: &str) -> String {
    gh_escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = &src.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    let col = src
        .get(line_start..offset)
        .map_or(offset - line_start, |s| s.chars().count())
        + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> FileReport {
        FileReport {
            path: "a,b.yaml".into(),
            source: Arc::from("kind: pipeline\nname: x\n"),
            diagnostics: vec![Diagnostic::error(
                "voidbox::unknown_field",
                "unknown field `nmae`",
                Span::new(15, 4),
            )
            .with_help("did you mean `name`?")],
        }
    }

    #[test]
    fn github_format_escapes_and_locates() {
        let out = report().render_github();
        assert_eq!(
            out,
            "::error file=a%2Cb.yaml,line=2,col=1,title=voidbox%3A%3Aunknown_field::unknown field `nmae` [voidbox::unknown_field] help: did you mean `name`?\n"
        );
    }

    #[test]
    fn control_characters_are_shown_not_sent() {
        assert_eq!(visible("a\u{1b}]0;x\u{7}b"), "a\\u{1b}]0;x\\u{7}b");
        assert_eq!(visible("a\r\nb\tc\rd"), "a\r\nb\tc\\u{d}d");
        assert_eq!(visible("x\u{202e}y"), "x\\u{202e}y");
        assert!(matches!(visible("plain `text`\n"), Cow::Borrowed(_)));
        let src = "name: \"\u{1b}]0;pwned\u{7}\"\nkind: x\n";
        let v = VisibleSource::of(src);
        assert_eq!(v.text, "name: \"\\u{1b}]0;pwned\\u{7}\"\nkind: x\n");
        let kind = src.find("kind").unwrap();
        assert_eq!(&v.text[v.map(kind)..v.map(kind) + 4], "kind");
        assert_eq!(v.map(6), 6);
        let r = FileReport {
            path: "t\u{1b}.yaml".into(),
            source: Arc::from(src),
            diagnostics: vec![Diagnostic::error(
                "voidbox::invalid_name",
                "invalid name `\u{1b}]0;pwned\u{7}`",
                Span::new(6, src.find('\n').unwrap() - 6),
            )
            .with_label("bad \u{1b}")
            .with_help("not \u{7}")],
        };
        for out in [
            r.render_human(false),
            r.render_human(true),
            r.render_github(),
        ] {
            assert!(!out.contains('\u{7}'), "{out:?}");
            assert!(
                !out.contains("\u{1b}]") && !out.contains("\u{1b}.yaml"),
                "{out:?}"
            );
        }
        let out = r.render_human(false);
        assert!(out.contains("\"\\u{1b}]0;pwned\\u{7}\""), "{out}");
        assert!(!out.contains('\u{1b}'), "{out:?}");
    }

    #[test]
    fn human_format_has_snippet_code_and_help() {
        let out = report().render_human(false);
        assert!(out.contains("voidbox::unknown_field"), "{out}");
        assert!(out.contains("a,b.yaml:2:1"), "{out}");
        assert!(out.contains("name: x"), "{out}");
        assert!(out.contains("did you mean `name`?"), "{out}");
    }
}
