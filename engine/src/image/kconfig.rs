//! Kernel config fragments: parsing, merging and checking the final `.config`.
//!
//! kconfig silently drops options whose dependencies are not met, so after
//! `make olddefconfig` every requested option is checked against the result.

use std::collections::BTreeMap;
use std::fmt;

/// A requested value: `Some("y")`, `Some("\"str\"")`, `Some("100")`, or `None` for
/// `# CONFIG_X is not set`.
pub type Value = Option<String>;

/// Options requested by the merged fragments, by name (without `CONFIG_`), later
/// fragments overriding earlier ones.
pub type Requested = BTreeMap<String, Value>;

/// A syntax error in a fragment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{fragment}:{line}: {what}")]
pub struct FragmentError {
    /// Fragment name.
    pub fragment: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub what: String,
}

/// An option that did not end up as requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Option name without `CONFIG_`.
    pub name: String,
    /// What the fragments asked for.
    pub requested: Value,
    /// What `.config` has (`None`: not set or absent).
    pub actual: Value,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |v: &Value| v.clone().unwrap_or_else(|| "is not set".into());
        write!(
            f,
            "CONFIG_{}: requested {}, got {} (unmet dependencies?)",
            self.name,
            show(&self.requested),
            show(&self.actual)
        )
    }
}

/// Parses one fragment. Accepts `CONFIG_X=value`, `# CONFIG_X is not set`,
/// comments and blank lines.
pub fn parse_fragment(name: &str, text: &str) -> Result<Vec<(String, Value)>, FragmentError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let err = |what: &str| FragmentError {
            fragment: name.to_string(),
            line: i + 1,
            what: what.to_string(),
        };
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let rest = rest.trim();
            if let Some(sym) = rest
                .strip_suffix(" is not set")
                .and_then(|s| s.strip_prefix("CONFIG_"))
            {
                check_symbol(sym).map_err(|w| err(&w))?;
                out.push((sym.to_string(), None));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(err(
                "expected CONFIG_NAME=value or `# CONFIG_NAME is not set`",
            ));
        };
        let sym = key
            .strip_prefix("CONFIG_")
            .ok_or_else(|| err("option names start with CONFIG_"))?;
        check_symbol(sym).map_err(|w| err(&w))?;
        let value = value.trim();
        if value.is_empty() {
            return Err(err("empty value"));
        }
        if value == "n" {
            out.push((sym.to_string(), None));
        } else {
            out.push((sym.to_string(), Some(value.to_string())));
        }
    }
    Ok(out)
}

fn check_symbol(sym: &str) -> Result<(), String> {
    if !sym.is_empty()
        && sym
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        Ok(())
    } else {
        Err(format!("bad option name CONFIG_{sym}"))
    }
}

/// Merges fragments in order (later wins), as `merge_config.sh` does.
pub fn merge<'a>(fragments: impl IntoIterator<Item = &'a [(String, Value)]>) -> Requested {
    let mut out = Requested::new();
    for frag in fragments {
        for (k, v) in frag {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// Parses a full `.config` into the options that are set (`n` and "is not set"
/// become absent).
pub fn parse_config(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("CONFIG_"))
        .filter_map(|l| l.split_once('='))
        .filter(|(_, v)| *v != "n")
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every requested option whose final value differs.
pub fn verify(requested: &Requested, config_text: &str) -> Vec<Mismatch> {
    let actual = parse_config(config_text);
    requested
        .iter()
        .filter_map(|(name, want)| {
            let got = actual.get(name).cloned();
            (got != *want).then(|| Mismatch {
                name: name.clone(),
                requested: want.clone(),
                actual: got,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fragment_forms() {
        let f = parse_fragment(
            "t",
            "# comment\n\nCONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x y\"\nCONFIG_D=100\nCONFIG_E=n\n",
        )
        .unwrap();
        assert_eq!(
            f,
            vec![
                ("A".into(), Some("y".into())),
                ("B".into(), None),
                ("C".into(), Some("\"x y\"".into())),
                ("D".into(), Some("100".into())),
                ("E".into(), None),
            ]
        );
    }

    #[test]
    fn rejects_garbage_with_line_numbers() {
        let e = parse_fragment("frag", "CONFIG_A=y\nFOO=y\n").unwrap_err();
        assert_eq!((e.line, e.fragment.as_str()), (2, "frag"));
        assert!(parse_fragment("f", "CONFIG_a=y").is_err());
        assert!(parse_fragment("f", "CONFIG_A=").is_err());
        assert!(parse_fragment("f", "just words").is_err());
    }

    #[test]
    fn later_fragment_wins() {
        let a = parse_fragment("a", "CONFIG_SYSFS=y\nCONFIG_X=y\n").unwrap();
        let b = parse_fragment("b", "# CONFIG_SYSFS is not set\n").unwrap();
        let m = merge([a.as_slice(), b.as_slice()]);
        assert_eq!(m["SYSFS"], None);
        assert_eq!(m["X"].as_deref(), Some("y"));
    }

    #[test]
    fn verify_reports_dropped_options() {
        let req = merge([parse_fragment(
            "f",
            "CONFIG_A=y\nCONFIG_B=y\n# CONFIG_C is not set\n# CONFIG_D is not set\nCONFIG_S=\"v\"\nCONFIG_HZ=100\n",
        )
        .unwrap()
        .as_slice()]);
        // B dropped (absent), C absent (fine: invisible = n), D set (bad), S ok, HZ wrong.
        let cfg = "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_D=y\nCONFIG_S=\"v\"\nCONFIG_HZ=250\n";
        let bad: Vec<_> = verify(&req, cfg).into_iter().map(|m| m.name).collect();
        assert_eq!(bad, ["B", "D", "HZ"]);
        let msg = verify(&req, cfg)[0].to_string();
        assert!(
            msg.contains("CONFIG_B: requested y, got is not set"),
            "{msg}"
        );
    }

    #[test]
    fn shipped_fragments_parse() {
        for (name, text) in [
            ("base.config", super::super::recipe::BASE_CONFIG),
            (
                "compat-emulated-kvm.config",
                super::super::recipe::COMPAT_CONFIG,
            ),
        ] {
            let f = parse_fragment(name, text).unwrap();
            assert!(f.len() > 5, "{name}");
        }
    }
}
