//! Block-style YAML for exported workflows, written from a `serde_json::Value`.
//!
//! Written here rather than with serde_yaml or serde_norway because both emit YAML 1.2 plain
//! scalars that YAML 1.1 readers take for something else: `yes`, `on`, `off`, `y`, `n` become
//! booleans and `2001-12-14` a timestamp in Kubernetes' parser (go-yaml v2 behind
//! sigs.k8s.io/yaml) and in PyYAML. Here a string stays plain only when it cannot be read as
//! anything but that string in either version; every other one is double-quoted with JSON's
//! escapes (a valid YAML double-quoted scalar), and a multi-line one is a literal block.

use serde_json::Value;

/// The YAML text of `v` (a mapping or a sequence at the top), ending in a newline.
pub fn to_string(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Object(m) if !m.is_empty() => mapping(&mut out, m, 0),
        Value::Array(a) if !a.is_empty() => sequence(&mut out, a, 0),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
    out
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn mapping(out: &mut String, m: &serde_json::Map<String, Value>, indent: usize) {
    for (k, v) in m {
        pad(out, indent);
        out.push_str(&scalar(k));
        out.push(':');
        value_after_key(out, v, indent);
    }
}

fn sequence(out: &mut String, a: &[Value], indent: usize) {
    for v in a {
        pad(out, indent);
        out.push('-');
        match v {
            Value::Object(m) if !m.is_empty() => {
                // The first key on the dash's line, the rest aligned under it.
                out.push(' ');
                let mut first = true;
                for (k, v) in m {
                    if !first {
                        pad(out, indent + 2);
                    }
                    first = false;
                    out.push_str(&scalar(k));
                    out.push(':');
                    value_after_key(out, v, indent + 2);
                }
            }
            Value::Array(inner) if !inner.is_empty() => {
                out.push('\n');
                sequence(out, inner, indent + 2);
            }
            other => scalar_tail(out, other, indent + 2),
        }
    }
}

/// What follows `key:` — a nested block on the next lines, a literal block, or ` value`.
fn value_after_key(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            mapping(out, m, indent + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            sequence(out, a, indent);
        }
        other => scalar_tail(out, other, indent + 2),
    }
}

/// ` value` after `key:` or `-`: a literal block whose lines sit at `block_indent`, or one
/// line.
fn scalar_tail(out: &mut String, v: &Value, block_indent: usize) {
    out.push(' ');
    match v {
        Value::String(s) if block_literal(s).is_some() => literal(out, s, block_indent),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
        }
    }
}

/// A literal block scalar (`|`, `|-` or `|+` by the trailing newlines) at `indent`.
fn literal(out: &mut String, s: &str, indent: usize) {
    let Some(chomp) = block_literal(s) else {
        return;
    };
    out.push('|');
    out.push_str(chomp);
    out.push('\n');
    let body = s.strip_suffix('\n').unwrap_or(s);
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
        out.push('\n');
    }
}

/// The chomping indicator when `s` reads back exactly as a literal block: more than one
/// line, printable characters and tabs only, a first line that starts with neither a space
/// nor a tab (it sets the block's indentation), no line ending in a space or a tab.
fn block_literal(s: &str) -> Option<&'static str> {
    if !s.contains('\n')
        || s.starts_with([' ', '\t', '\n'])
        || s.chars()
            .any(|c| c != '\n' && c != '\t' && (c.is_control() || c == '\u{feff}'))
        || s.split('\n').any(|l| l.ends_with(' ') || l.ends_with('\t'))
    {
        return None;
    }
    Some(if s.ends_with("\n\n") {
        "+"
    } else if s.ends_with('\n') {
        ""
    } else {
        "-"
    })
}

/// A scalar or an empty collection on one line.
fn inline(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

/// A string as a plain scalar when that is unambiguous, else double-quoted.
fn scalar(s: &str) -> String {
    if plain_ok(s) {
        s.to_string()
    } else {
        serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
    }
}

/// Words YAML 1.1 or 1.2 reads as booleans or null.
const RESERVED: &[&str] = &[
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~",
];

/// Whether `s` reads back as this very string, in YAML 1.1 and 1.2 alike: it starts with a
/// letter, `/` or `_`, holds only letters, digits and `_ - . / @`, and is not a reserved
/// word (so it cannot be a number, a date, a boolean or null either).
fn plain_ok(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '/' || first == '_') {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | '@'))
    {
        return false;
    }
    !RESERVED.contains(&s.to_ascii_lowercase().as_str())
        && !matches!(s.to_ascii_lowercase().as_str(), ".inf" | ".nan")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ambiguous_strings_are_quoted() {
        let v = json!({"a": ["yes", "On", "n", "2001-12-14", "1.0", "0x1f", "~", "", "a: b",
            "#c", "- d", "plain-word", "path/to/x.yaml", "ubuntu-latest", "{{tasks.a.ip}}"]});
        let y = to_string(&v);
        for q in [
            "\"yes\"",
            "\"On\"",
            "\"n\"",
            "\"2001-12-14\"",
            "\"1.0\"",
            "\"0x1f\"",
            "\"~\"",
            "\"\"",
            "\"a: b\"",
            "\"#c\"",
            "\"- d\"",
            "\"{{tasks.a.ip}}\"",
        ] {
            assert!(y.contains(&format!("- {q}\n")), "{q} not quoted in\n{y}");
        }
        for p in ["plain-word", "path/to/x.yaml", "ubuntu-latest"] {
            assert!(y.contains(&format!("- {p}\n")), "{p} quoted in\n{y}");
        }
    }

    #[test]
    fn nesting_and_literals() {
        let v = json!({
            "on": {"workflow_dispatch": {}},
            "jobs": {"a": {"steps": [{"name": "x", "run": "echo 1\necho 2\n", "with": {"k": 1}},
                                     {"uses": "actions/checkout@v5"}]}},
            "list": [["a", "b"], []],
            "n": 3, "t": true, "z": null, "s": "two\nlines"
        });
        let y = to_string(&v);
        let want = "\"on\":\n  workflow_dispatch: {}\njobs:\n  a:\n    steps:\n    - name: x\n      run: |\n        echo 1\n        echo 2\n      with:\n        k: 1\n    - uses: actions/checkout@v5\nlist:\n-\n  - a\n  - b\n- []\n\"n\": 3\nt: true\nz: null\ns: |-\n  two\n  lines\n";
        assert_eq!(y, want);
    }

    fn arb_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[ -~\\n\\t\u{e9}\u{1F600}]{0,24}".prop_map(Value::String),
            prop::sample::select(vec![
                "yes",
                "No",
                "on",
                "OFF",
                "y",
                "~",
                "null",
                "1e3",
                "0o7",
                ".inf",
                "2001-12-14",
                "12:30",
                "-",
                "- x",
                "a #b",
                "|",
                ">",
                "@x",
                "!t",
                "&a",
                "*a",
                "%x",
                "`",
                "a\n b",
                "\n",
                "x\n\n",
                " x\ny",
                "x \ny"
            ])
            .prop_map(|s| Value::String(s.to_string())),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map("[ -~]{0,8}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        /// Whatever the value, the YAML reads back as the same value.
        #[test]
        fn reads_back_as_written(v in arb_value()) {
            let doc = json!({"doc": v});
            let text = to_string(&doc);
            let back = voidbox_spec::yaml::parse(&text)
                .unwrap_or_else(|e| panic!("{e:?} in\n{text}"))
                .to_json();
            proptest::prop_assert_eq!(back, doc, "{}", text);
        }
    }
}
