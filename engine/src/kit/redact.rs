//! Secret redaction in staged text files: the values of the host variables the spec passes
//! to a node, its provider key, and common token patterns, each replaced by
//! [`REDACTED`]. Values shorter than [`MIN_SECRET_LEN`] bytes are never redacted (a short
//! value such as `1` or `true` would match everywhere).

use crate::plan::{Action, PlanNode};

/// What a redacted secret becomes.
pub const REDACTED: &str = "[REDACTED]";
/// Shortest value redacted literally.
pub const MIN_SECRET_LEN: usize = 8;

/// The literal secret values of one node, longest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets {
    values: Vec<String>,
}

impl Secrets {
    /// Secrets from explicit values (those shorter than [`MIN_SECRET_LEN`] are dropped).
    pub fn new(values: impl IntoIterator<Item = String>) -> Secrets {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|v| v.len() >= MIN_SECRET_LEN)
            .collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        values.dedup();
        Secrets { values }
    }

    /// These secrets and `value` (kept only if long enough, as in [`Secrets::new`]).
    pub fn with(self, value: &str) -> Secrets {
        Secrets::new(self.values.into_iter().chain([value.to_string()]))
    }

    /// The host values `node` receives: every `sandbox.env` entry with an empty value (which
    /// copies the host's variable) and, for an agent, the variable `llm.api_key_env` names.
    pub fn for_node(node: &PlanNode) -> Secrets {
        Secrets::new(Self::host_names(node).filter_map(|k| std::env::var(k).ok()))
    }

    fn host_names(node: &PlanNode) -> impl Iterator<Item = &str> {
        let env = node
            .sandbox
            .env
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k.as_str());
        let key = match &node.action {
            Action::Agent(a) => a.llm.api_key_env.as_deref(),
            _ => None,
        };
        env.chain(key)
    }

    /// How many literal values are redacted.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// No literal values.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret and token pattern replaced, and the number of replacements.
    pub fn redact(&self, text: &str) -> (String, u64) {
        let mut out = text.to_string();
        let mut n = 0u64;
        for v in &self.values {
            let c = out.matches(v.as_str()).count() as u64;
            if c > 0 {
                out = out.replace(v.as_str(), REDACTED);
                n += c;
            }
        }
        let (out, m) = redact_private_keys(&out);
        let (out, k) = redact_tokens(&out);
        (out, n + m + k)
    }
}

/// A token pattern: its prefix, the characters of its body and the body's least length.
type TokenPattern = (&'static str, fn(u8) -> bool, usize);

/// Token prefixes and the characters and least length of their body.
const TOKENS: &[TokenPattern] = &[
    // Anthropic (`sk-ant-…`) and OpenAI (`sk-…`, `sk-proj-…`) keys.
    ("sk-", is_key_char, 20),
    ("ghp_", is_alnum, 30),
    ("gho_", is_alnum, 30),
    ("ghu_", is_alnum, 30),
    ("ghs_", is_alnum, 30),
    ("ghr_", is_alnum, 30),
    ("github_pat_", is_word_char, 22),
    ("AKIA", is_upper_digit, 16),
    ("ASIA", is_upper_digit, 16),
    ("xoxb-", is_key_char, 10),
    ("xoxa-", is_key_char, 10),
    ("xoxp-", is_key_char, 10),
    ("xoxr-", is_key_char, 10),
    ("xoxs-", is_key_char, 10),
];

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

fn is_word_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_key_char(b: u8) -> bool {
    is_word_char(b) || b == b'-'
}

fn is_upper_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

/// Replaces prefixed tokens (`sk-…`, `ghp_…`, `AKIA…`, `xoxb-…`) that start at a word
/// boundary and have a long enough body.
fn redact_tokens(text: &str) -> (String, u64) {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut n = 0u64;
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        let boundary = i == 0 || !is_key_char(b[i - 1]);
        let hit = boundary
            .then(|| {
                TOKENS.iter().find_map(|(prefix, class, min)| {
                    let rest = b[i..].strip_prefix(prefix.as_bytes())?;
                    let body = rest.iter().take_while(|&&c| class(c)).count();
                    (body >= *min).then_some(prefix.len() + body)
                })
            })
            .flatten();
        match hit {
            Some(len) => {
                // Prefixes and bodies are ASCII: `i` and `i + len` are char boundaries.
                out.push_str(&text[copied..i]);
                out.push_str(REDACTED);
                n += 1;
                i += len;
                copied = i;
            }
            None => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    (out, n)
}

/// Replaces `-----BEGIN … PRIVATE KEY-----` blocks through their `-----END … -----` line
/// (to the end of the text when the block is not closed).
fn redact_private_keys(text: &str) -> (String, u64) {
    const BEGIN: &str = "-----BEGIN ";
    let mut out = String::with_capacity(text.len());
    let mut n = 0u64;
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let header_end = after.find("-----");
        let is_private = header_end
            .is_some_and(|e| after[..e].ends_with("PRIVATE KEY") && !after[..e].contains('\n'));
        let Some(header_end) = header_end.filter(|_| is_private) else {
            out.push_str(&rest[..start + BEGIN.len()]);
            rest = after;
            continue;
        };
        let body = &after[header_end + 5..];
        let end = body
            .find("-----END ")
            .and_then(|e| {
                let tail = &body[e + 9..];
                tail.find("-----").map(|t| e + 9 + t + 5)
            })
            .unwrap_or(body.len());
        out.push_str(&rest[..start]);
        out.push_str(REDACTED);
        n += 1;
        rest = &body[end..];
    }
    out.push_str(rest);
    (out, n)
}
