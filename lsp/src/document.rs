//! An open document: its text, its version, and the conversion between byte offsets (what
//! `voidbox-spec` spans hold) and LSP positions (line and UTF-16 code unit).

use std::sync::OnceLock;

use lsp_types::{Position, Range};
use voidbox_spec::diagnostic::Span;
use voidbox_spec::yaml::Node;

/// One open text document.
#[derive(Debug, Clone)]
pub struct Document {
    /// The full text.
    pub text: String,
    /// The client's version of it.
    pub version: i32,
    /// Byte offset where each line starts.
    line_starts: Vec<usize>,
    /// The text parsed, once, by the first request that needs it (`None`: it does not parse).
    root: OnceLock<Option<Node>>,
}

impl Document {
    /// A document holding `text`.
    pub fn new(text: String, version: i32) -> Document {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Document {
            text,
            version,
            line_starts,
            root: OnceLock::new(),
        }
    }

    /// Applies one `didChange` content change: `range` (in UTF-16 positions of the text as it
    /// is before this change) replaced by `text`, or the whole text when `range` is `None`.
    /// Positions past a line's end or past the text are clamped, as [`offset`](Self::offset)
    /// does; a range whose end is before its start is taken as empty.
    pub fn edit(&mut self, range: Option<Range>, text: &str) {
        match range {
            None => self.text = text.to_string(),
            Some(r) => {
                let start = self.offset(r.start);
                let end = self.offset(r.end).max(start);
                self.text.replace_range(start..end, text);
            }
        }
        self.line_starts = vec![0];
        self.line_starts
            .extend(self.text.match_indices('\n').map(|(i, _)| i + 1));
        self.root = OnceLock::new();
    }

    /// The YAML tree with spans, parsed once per version; `None` while it does not parse.
    pub fn root(&self) -> Option<&Node> {
        self.root
            .get_or_init(|| voidbox_spec::yaml::parse(&self.text).ok())
            .as_ref()
    }

    /// The LSP position of byte `offset` (clamped to the text, and to a character boundary).
    pub fn position(&self, offset: usize) -> Position {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let character: usize = self.text[start..offset].chars().map(char::len_utf16).sum();
        Position::new(line as u32, character as u32)
    }

    /// The byte offset of an LSP position (a line past the end is the end of the text; a
    /// character past the end of its line is the line's end).
    pub fn offset(&self, p: Position) -> usize {
        let Some(&start) = self.line_starts.get(p.line as usize) else {
            return self.text.len();
        };
        let mut end = self
            .line_starts
            .get(p.line as usize + 1)
            .map_or(self.text.len(), |&e| e.saturating_sub(1));
        // A CRLF line ends before its `\r`.
        if end > start && self.text.as_bytes()[end - 1] == b'\r' {
            end -= 1;
        }
        let mut units = 0u32;
        for (i, c) in self.text[start..end].char_indices() {
            if units >= p.character {
                return start + i;
            }
            units += c.len_utf16() as u32;
        }
        end
    }

    /// The range of a span.
    pub fn range(&self, span: Span) -> Range {
        Range::new(
            self.position(span.offset),
            self.position(span.offset + span.len),
        )
    }

    /// Line `n` without its newline (empty past the end).
    pub fn line(&self, n: usize) -> &str {
        let Some(&start) = self.line_starts.get(n) else {
            return "";
        };
        let end = self
            .line_starts
            .get(n + 1)
            .map_or(self.text.len(), |&e| e.saturating_sub(1));
        self.text[start..end].trim_end_matches('\r')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_utf16_code_units_and_round_trip() {
        let d = Document::new("a: é\nb: 𝄞x\n".into(), 1);
        assert_eq!(d.position(0), Position::new(0, 0));
        // `é` is 2 bytes and 1 UTF-16 unit; `𝄞` is 4 bytes and 2 units.
        assert_eq!(d.position(5), Position::new(0, 4));
        let x = d.text.find('x').unwrap();
        assert_eq!(d.position(x), Position::new(1, 5));
        assert_eq!(d.offset(Position::new(1, 5)), x);
        assert_eq!(d.offset(Position::new(0, 99)), 5);
        assert_eq!(d.offset(Position::new(9, 0)), d.text.len());
        // Inside a multi-byte character: the character's start.
        assert_eq!(d.position(4), Position::new(0, 3));
        assert_eq!(d.line(1), "b: 𝄞x");
        assert_eq!(d.line(7), "");
    }

    #[test]
    fn ranged_edits_use_utf16_positions_of_the_text_before_them() {
        let mut d = Document::new("a: é𝄞z\nb: 2\r\nc: 3\n".into(), 1);
        // Replace `z` (after 1 + 2 UTF-16 units of `é𝄞`, i.e. character 6).
        d.edit(
            Some(Range::new(Position::new(0, 6), Position::new(0, 7))),
            "Z",
        );
        assert_eq!(d.text, "a: é𝄞Z\nb: 2\r\nc: 3\n");
        // Insert across lines, then delete a whole line; the parse follows.
        d.edit(
            Some(Range::new(Position::new(1, 4), Position::new(1, 4))),
            "0\nx: 1",
        );
        assert_eq!(d.text, "a: é𝄞Z\nb: 20\nx: 1\r\nc: 3\n");
        assert_eq!(d.line(2), "x: 1");
        // Past a CRLF line's end: before its `\r`.
        d.edit(
            Some(Range::new(Position::new(2, 99), Position::new(2, 99))),
            "1",
        );
        assert_eq!(d.line(2), "x: 11");
        d.edit(
            Some(Range::new(Position::new(0, 0), Position::new(1, 0))),
            "",
        );
        assert_eq!(d.text, "b: 20\nx: 11\r\nc: 3\n");
        assert!(d.root().is_some_and(|r| r.get("x").is_some()));
        d.edit(None, "whole: 1\n");
        assert_eq!((d.text.as_str(), d.line(1)), ("whole: 1\n", ""));
    }
}
