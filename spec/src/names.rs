//! Spec, box and step names on the host: which names are refused, and how a name becomes
//! one file-name component (logs directory, console logs) without ever becoming a path.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

/// Longest file-name component [`file_component`] produces (well under `NAME_MAX`, leaving
/// room for suffixes such as `.12.console.log`).
pub const MAX_COMPONENT_BYTES: usize = 160;

/// Why a name can never be used, or `None` when it can: names holding `/`, `\`, NUL or
/// control characters, and `.` / `..`, are refused (they read as paths or corrupt logs).
pub fn name_problem(name: &str) -> Option<String> {
    if name == "." || name == ".." {
        return Some("would name a directory (`.` and `..` are refused)".to_string());
    }
    let bad = name
        .chars()
        .find(|c| matches!(c, '/' | '\\') || c.is_control());
    bad.map(|c| match c {
        '/' | '\\' => format!("contains `{c}` (a path separator)"),
        '\0' => "contains a NUL character".to_string(),
        c => format!("contains the control character U+{:04X}", c as u32),
    })
}

/// Encodes `name` as one file-name component: `[A-Za-z0-9._-]` stay as they are, every
/// other byte becomes `%XX` (so the encoding is readable and reversible with
/// [`decode_component`]), and the result is never empty, `.` or `..`. A name whose encoding
/// is longer than [`MAX_COMPONENT_BYTES`] is cut and ends in `~` and 16 hex digits of its
/// SHA-256 (`~` never appears otherwise, so such names stay distinct).
pub fn file_component(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    if out.is_empty() || out == "." || out == ".." {
        out = out.replace('.', "%2E");
        if out.is_empty() {
            out.push('%');
        }
    }
    if out.len() > MAX_COMPONENT_BYTES {
        let hash = Sha256::digest(name.as_bytes());
        let mut cut = MAX_COMPONENT_BYTES - 17;
        // Never split a `%XX` escape.
        while let Some(p) = out[..cut].rfind('%').filter(|p| p + 3 > cut) {
            cut = p;
        }
        out.truncate(cut);
        out.push('~');
        out.push_str(&hex::encode(&hash[..8]));
    }
    out
}

/// Reverses [`file_component`] (`None` for text it cannot have produced, or for a cut name).
pub fn decode_component(encoded: &str) -> Option<String> {
    if encoded == "%" {
        return Some(String::new());
    }
    if encoded.contains('~') {
        return None;
    }
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut it = encoded.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hi = char::from(it.next()?).to_digit(16)?;
            let lo = char::from(it.next()?).to_digit(16)?;
            bytes.push(u8::try_from(hi * 16 + lo).ok()?);
        } else {
            bytes.push(b);
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_stay_readable() {
        for n in ["seed", "fan-out_2", "v1.2", "A-Z"] {
            assert_eq!(file_component(n), n);
        }
    }

    #[test]
    fn hostile_names_never_become_paths() {
        for n in [
            "../../x", "..", ".", "", "a/b", "a\\b", "a\0b", "\u{1}", "é 😀", "%2E", "...",
        ] {
            let c = file_component(n);
            assert!(!c.is_empty() && c != "." && c != "..", "{n:?} → {c:?}");
            assert!(
                c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-%".contains(&b)),
                "{n:?} → {c:?}"
            );
            assert_eq!(decode_component(&c).as_deref(), Some(n), "{n:?} → {c:?}");
        }
        assert_eq!(file_component("../../x"), "..%2F..%2Fx");
        assert_eq!(file_component(".."), "%2E%2E");
        assert_eq!(file_component("a b%"), "a%20b%25");
    }

    #[test]
    fn long_names_are_cut_with_a_hash() {
        let long = "é".repeat(200);
        let c = file_component(&long);
        assert!(c.len() <= MAX_COMPONENT_BYTES, "{}", c.len());
        assert!(c.contains('~'));
        assert_ne!(c, file_component(&format!("{long}x")));
        assert_eq!(decode_component(&c), None);
        let plain = "a".repeat(MAX_COMPONENT_BYTES);
        assert_eq!(file_component(&plain), plain);
    }

    #[test]
    fn refused_names() {
        assert!(name_problem("seed").is_none());
        assert!(name_problem("my box (v2)").is_none());
        for n in [".", "..", "a/b", "..\\x", "a\0", "tab\there", "\u{7f}"] {
            assert!(name_problem(n).is_some(), "{n:?}");
        }
        assert_eq!(
            name_problem("a/b").as_deref(),
            Some("contains `/` (a path separator)")
        );
    }
}
