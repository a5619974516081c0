//! Redaction of secrets in `Debug` output.
//!
//! Environment variables whose **name** contains `KEY`, `SECRET`, `TOKEN` or `PASSWORD`
//! (case-insensitive) have their **value** replaced by [`REDACTED`] whenever a message is
//! formatted with `{:?}`. Byte payloads are shown as their length only.

use std::fmt;

/// Placeholder printed instead of a sensitive value.
pub const REDACTED: &str = "<redacted>";

/// Name fragments that mark an environment variable as sensitive.
pub const SENSITIVE_MARKERS: [&str; 4] = ["KEY", "SECRET", "TOKEN", "PASSWORD"];

/// Returns `true` when an environment variable called `name` must not have its value logged.
pub fn is_sensitive_env_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SENSITIVE_MARKERS.iter().any(|m| upper.contains(m))
}

/// `Debug` adapter for an environment list that redacts sensitive values.
pub struct RedactedEnv<'a>(pub &'a [(String, String)]);

impl fmt::Debug for RedactedEnv<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, value) in self.0 {
            if is_sensitive_env_name(name) {
                map.entry(name, &format_args!("{REDACTED}"));
            } else {
                map.entry(name, value);
            }
        }
        map.finish()
    }
}

/// `Debug` adapter that prints a byte buffer as `<N bytes>` instead of its contents.
pub struct ByteLen<'a>(pub &'a [u8]);

impl fmt::Debug for ByteLen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_case_insensitive_substrings() {
        for n in [
            "API_KEY",
            "aws_secret_access_key",
            "GithubToken",
            "db_password",
            "KEYRING",
            "x-Secret-y",
        ] {
            assert!(is_sensitive_env_name(n), "{n}");
        }
        for n in ["PATH", "HOME", "LANG", "PASSWD", "TOKN", ""] {
            assert!(!is_sensitive_env_name(n), "{n}");
        }
    }

    #[test]
    fn env_debug_hides_values() {
        let env = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("OPENAI_API_KEY".to_string(), "sk-very-secret".to_string()),
            ("my_token".to_string(), "tok123".to_string()),
        ];
        let s = format!("{:?}", RedactedEnv(&env));
        assert!(s.contains("/usr/bin"));
        assert!(s.contains("OPENAI_API_KEY"));
        assert!(!s.contains("sk-very-secret"));
        assert!(!s.contains("tok123"));
        assert_eq!(s.matches(REDACTED).count(), 2);
    }
}
