//! Server-sent events: the wire form of streamed answers.

use serde_json::Value;

/// A sequence of SSE events, serialized as they are added.
#[derive(Debug, Default)]
pub(crate) struct Sse {
    buf: String,
    /// Events added.
    pub(crate) count: u64,
}

impl Sse {
    /// Adds `event: NAME` with `data:` the compact JSON of `data`.
    pub(crate) fn event(&mut self, name: &str, data: Value) {
        self.buf.push_str("event: ");
        self.buf.push_str(name);
        self.buf.push_str("\ndata: ");
        self.buf.push_str(&data.to_string());
        self.buf.push_str("\n\n");
        self.count += 1;
    }

    /// The serialized events.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf.into_bytes()
    }
}

/// `s` in pieces of at most `n` characters (at least one piece, possibly empty).
pub(crate) fn chunks(s: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (count, (i, _)) in s.char_indices().enumerate() {
        if count > 0 && count % n.max(1) == 0 {
            out.push(&s[start..i]);
            start = i;
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_keep_characters_whole() {
        assert_eq!(chunks("", 3), vec![""]);
        assert_eq!(chunks("abcdefg", 3), vec!["abc", "def", "g"]);
        assert_eq!(
            chunks("\u{e9}\u{e9}\u{e9}\u{e9}", 2).concat(),
            "\u{e9}".repeat(4)
        );
        assert_eq!(chunks("\u{e9}\u{e9}\u{e9}\u{e9}", 2).len(), 2);
    }
}
