//! The JSON Schema of the spec language: generation (from the model) and validation with
//! errors mapped back to YAML spans.

use std::sync::OnceLock;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use serde_json::Value;

use crate::diagnostic::{Diagnostic, Span};
use crate::model::Spec;
use crate::suggest::{did_you_mean, one_of};
use crate::yaml::Node;

/// The JSON Schema (draft 2020-12) of a voidbox spec, generated from [`Spec`].
pub fn schema() -> &'static Value {
    static SCHEMA: OnceLock<Value> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
        let root = generator.into_root_schema_for::<Spec>();
        serde_json::to_value(root).unwrap_or(Value::Null)
    })
}

/// The schema as pretty-printed JSON with a trailing newline (what `voidbox schema` prints).
pub fn schema_json() -> String {
    let mut s = serde_json::to_string_pretty(schema()).unwrap_or_default();
    s.push('\n');
    s
}

fn validator() -> Result<&'static Validator, String> {
    static VALIDATOR: OnceLock<Result<Validator, String>> = OnceLock::new();
    VALIDATOR
        .get_or_init(|| jsonschema::validator_for(schema()).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// Validates `instance` (the JSON form of `root`) and returns located diagnostics.
pub fn validate(root: &Node, instance: &Value) -> Vec<Diagnostic> {
    let validator = match validator() {
        Ok(v) => v,
        Err(e) => {
            return vec![Diagnostic::error(
                "voidbox::internal",
                format!("the built-in JSON Schema does not compile: {e}"),
                Span::default(),
            )]
        }
    };
    let mut out = Vec::new();
    for err in validator.iter_errors(instance) {
        map_error(root, &err, &mut out);
    }
    out
}

/// JSON pointer → path segments.
fn segments(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// `pipeline.boxes[0].name` from path segments.
fn display_path(segs: &[String]) -> String {
    let mut out = String::new();
    for s in segs {
        if s.parse::<usize>().is_ok() {
            out.push_str(&format!("[{s}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(s);
        }
    }
    if out.is_empty() {
        "the spec".to_string()
    } else {
        format!("`{out}`")
    }
}

/// The subschema at a keyword location, following `$ref`s into `$defs`.
fn schema_at<'a>(root: &'a Value, segs: &[String]) -> Option<&'a Value> {
    let mut cur = root;
    for s in segs {
        if s == "$ref" {
            let target = cur.get("$ref")?.as_str()?;
            cur = resolve_ref(root, target)?;
            continue;
        }
        cur = match cur {
            Value::Object(m) => m.get(s)?,
            Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    // A subschema that is only a reference stands for its target.
    if let Some(target) = cur.get("$ref").and_then(Value::as_str) {
        if cur.get("properties").is_none() {
            return resolve_ref(root, target);
        }
    }
    Some(cur)
}

fn resolve_ref<'a>(root: &'a Value, target: &str) -> Option<&'a Value> {
    let pointer = target.strip_prefix('#')?;
    root.pointer(pointer)
}

/// The start of a node (for errors about a whole mapping, whose span may run many lines).
fn head(node: &Node) -> Span {
    Span::new(node.span.offset, 0)
}

fn map_error(root: &Node, err: &ValidationError<'_>, out: &mut Vec<Diagnostic>) {
    let inst = segments(err.instance_path().as_str());
    let schema_path = segments(err.schema_path().as_str());
    let (node, _) = root.walk(inst.iter());
    let here = display_path(&inst);
    match err.kind() {
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            map_alternatives(root, err, context, out);
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let obj_schema = schema_path
                .split_last()
                .and_then(|(_, parent)| schema_at(schema(), parent));
            let allowed: Vec<String> = obj_schema
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            for name in unexpected {
                let span = node.entry(name).map_or(node.span, |(k, _)| k.span);
                let help = did_you_mean(name, allowed.iter().map(String::as_str))
                    .map(|s| format!("did you mean `{s}`?"))
                    .or_else(|| {
                        (!allowed.is_empty()).then(|| format!("allowed here: {}", one_of(&allowed)))
                    });
                out.push(
                    Diagnostic::error(
                        "voidbox::unknown_field",
                        format!("unknown field `{name}` in {here}"),
                        span,
                    )
                    .with_label("not a known field")
                    .with_help_opt(help),
                );
            }
        }
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            out.push(
                Diagnostic::error(
                    "voidbox::missing_field",
                    format!("missing required field `{name}` in {here}"),
                    head(node),
                )
                .with_label(format!("`{name}` is required here")),
            );
        }
        ValidationErrorKind::Type { kind } => {
            out.push(type_mismatch(
                &here,
                &[format!("{kind:?}")],
                err.instance(),
                node.span,
            ));
        }
        ValidationErrorKind::Enum { options } => {
            let options: Vec<String> = options
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            out.push(enum_diagnostic(node, &inst, err.instance(), &options));
        }
        ValidationErrorKind::Constant { expected_value } => {
            out.push(
                Diagnostic::error(
                    "voidbox::invalid_value",
                    format!(
                        "invalid value {} for {here}: expected {}",
                        display_value(err.instance()),
                        display_value(expected_value)
                    ),
                    node.span,
                )
                .with_label("not allowed"),
            );
        }
        ValidationErrorKind::Minimum { .. }
        | ValidationErrorKind::Maximum { .. }
        | ValidationErrorKind::ExclusiveMinimum { .. }
        | ValidationErrorKind::ExclusiveMaximum { .. } => {
            let sub = schema_path
                .split_last()
                .and_then(|(_, parent)| schema_at(schema(), parent));
            let min = sub.and_then(|s| s.get("minimum")).map(Value::to_string);
            let max = sub.and_then(|s| s.get("maximum")).map(Value::to_string);
            let range = match (min, max) {
                (Some(a), Some(b)) => format!("{a}..={b}"),
                (Some(a), None) => format!("at least {a}"),
                (None, Some(b)) => format!("at most {b}"),
                (None, None) => "the allowed range".to_string(),
            };
            out.push(
                Diagnostic::error(
                    "voidbox::out_of_range",
                    format!(
                        "{here} is {}, outside {range}",
                        display_value(err.instance())
                    ),
                    node.span,
                )
                .with_label(format!("allowed: {range}")),
            );
        }
        ValidationErrorKind::MinLength { .. } => {
            out.push(
                Diagnostic::error(
                    "voidbox::invalid_value",
                    format!("{here} must not be empty"),
                    node.span,
                )
                .with_label("empty"),
            );
        }
        _ => {
            out.push(Diagnostic::error(
                "voidbox::schema",
                format!("{here}: {err}"),
                node.span,
            ));
        }
    }
}

/// A value outside a fixed set of strings (`enum`, or a `oneOf` of documented `const`s).
fn enum_diagnostic(node: &Node, inst: &[String], value: &Value, options: &[String]) -> Diagnostic {
    let here = display_path(inst);
    let field = inst.last().map(String::as_str).unwrap_or_default();
    let code = match field {
        "provider" => "voidbox::unknown_provider",
        "api_version" => "voidbox::unsupported_api_version",
        "kind" if inst.len() == 1 => "voidbox::unknown_kind",
        _ => "voidbox::invalid_value",
    };
    let help = value
        .as_str()
        .and_then(|s| did_you_mean(s, options.iter().map(String::as_str)))
        .map(|s| format!("did you mean `{s}`?"))
        .unwrap_or_else(|| format!("expected one of: {}", one_of(options)));
    Diagnostic::error(
        code,
        format!("invalid value {} for {here}", display_value(value)),
        node.span,
    )
    .with_label("not allowed")
    .with_help(help)
}

/// An `anyOf`/`oneOf` failure: report the errors of the alternative the author most likely
/// meant (right JSON type, matching `type:` discriminator, fewest errors).
fn map_alternatives(
    root: &Node,
    err: &ValidationError<'_>,
    branches: &[Vec<ValidationError<'static>>],
    out: &mut Vec<Diagnostic>,
) {
    let inst_path = err.instance_path().as_str().to_string();
    let discriminator = format!("{inst_path}/type");
    let mut best: Option<(usize, &Vec<ValidationError<'static>>)> = None;
    let mut wanted_types = Vec::new();
    let mut discriminators = Vec::new();
    let mut constants = Vec::new();
    let all_constants = branches.iter().all(|b| {
        b.len() == 1
            && matches!(b[0].kind(), ValidationErrorKind::Constant { .. })
            && b[0].instance_path().as_str() == inst_path
    });
    if all_constants {
        for b in branches {
            if let ValidationErrorKind::Constant { expected_value } = b[0].kind() {
                constants.extend(expected_value.as_str().map(str::to_string));
            }
        }
        let inst = segments(&inst_path);
        let (node, _) = root.walk(inst.iter());
        out.push(enum_diagnostic(node, &inst, err.instance(), &constants));
        return;
    }
    for branch in branches {
        let mut disqualified = false;
        let mut score = 0usize;
        for e in branch {
            let at = e.instance_path().as_str();
            match e.kind() {
                ValidationErrorKind::Type { kind } if at == inst_path => {
                    disqualified = true;
                    wanted_types.push(format!("{kind:?}"));
                }
                ValidationErrorKind::Constant { expected_value } if at == discriminator => {
                    disqualified = true;
                    if let Some(s) = expected_value.as_str() {
                        discriminators.push(s.to_string());
                    }
                }
                ValidationErrorKind::AdditionalProperties { unexpected } => {
                    score += unexpected.len()
                }
                _ => score += 1,
            }
        }
        if !disqualified && best.is_none_or(|(s, _)| score < s) {
            best = Some((score, branch));
        }
    }
    if let Some((_, branch)) = best {
        for e in branch {
            map_error(root, e, out);
        }
        return;
    }
    let inst = segments(&inst_path);
    let (node, _) = root.walk(inst.iter());
    let here = display_path(&inst);
    if !discriminators.is_empty() {
        if let Some(type_node) = node.get("type") {
            let found = type_node.as_str().unwrap_or_default();
            let help = did_you_mean(found, discriminators.iter().map(String::as_str))
                .map(|s| format!("did you mean `{s}`?"))
                .unwrap_or_else(|| format!("expected one of: {}", one_of(&discriminators)));
            out.push(
                Diagnostic::error(
                    "voidbox::invalid_value",
                    format!(
                        "unknown `type` {} in {here}",
                        display_value(&type_node.to_json())
                    ),
                    type_node.span,
                )
                .with_label("not allowed")
                .with_help(help),
            );
            return;
        }
        out.push(
            Diagnostic::error(
                "voidbox::missing_field",
                format!("missing required field `type` in {here}"),
                head(node),
            )
            .with_help(format!("expected one of: {}", one_of(&discriminators))),
        );
        return;
    }
    out.push(type_mismatch(
        &here,
        &wanted_types,
        err.instance(),
        node.span,
    ));
}

/// "`x` must be an integer, found string `lots`", from `TypeKind` debug renderings.
fn type_mismatch(here: &str, kinds: &[String], value: &Value, span: Span) -> Diagnostic {
    const NAMES: [&str; 7] = [
        "object", "array", "string", "integer", "number", "boolean", "null",
    ];
    let joined = kinds.join(" ").to_lowercase();
    // "a mapping, true or false": booleans are named by their values.
    let expected: Vec<String> = NAMES
        .iter()
        .filter(|n| joined.contains(*n) && **n != "null")
        .flat_map(|n| match *n {
            "boolean" => vec!["true".to_string(), "false".to_string()],
            n => vec![article(n)],
        })
        .collect();
    let expected = match expected.split_last() {
        None => "null".to_string(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    };
    Diagnostic::error(
        "voidbox::invalid_type",
        format!("{here} must be {expected}, found {}", describe(value)),
        span,
    )
    .with_label("wrong type")
}

fn article(t: &str) -> String {
    match t {
        "object" => "a mapping".into(),
        "array" => "a list".into(),
        "integer" => "an integer".into(),
        "string" => "a string".into(),
        "boolean" => "true or false".into(),
        "number" => "a number".into(),
        "null" => "null".into(),
        other => other.to_string(),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean `{b}`"),
        Value::Number(n) => format!("number `{n}`"),
        Value::String(s) => format!("string {}", display_value(&Value::String(s.clone()))),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

fn display_value(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > 40 => {
            format!("`{}…`", s.chars().take(40).collect::<String>())
        }
        Value::String(s) => format!("`{s}`"),
        other => format!("`{other}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::line_col;
    use crate::yaml::parse;

    fn check(src: &str) -> Vec<(String, usize, usize, String)> {
        let root = parse(src).expect("yaml");
        validate(&root, &root.to_json())
            .into_iter()
            .map(|d| {
                let (l, c) = line_col(src, d.span.offset);
                (d.code.to_string(), l, c, d.help.unwrap_or_default())
            })
            .collect()
    }

    #[test]
    fn schema_compiles_and_has_descriptions() {
        assert!(validator().is_ok());
        let s = schema_json();
        assert!(s.contains(
            "Guest memory per VM, in MiB (default: 256 for a command, 1024 for an agent)."
        ));
        assert!(
            !s.contains("\"default\": 1024"),
            "the default depends on the node"
        );
    }

    #[test]
    fn unknown_field_points_at_key_with_suggestion() {
        let got = check("kind: pipeline\nname: x\npipeline:\n  boxes:\n    - name: a\n      timeout_sec: 3\n      run: {program: echo}\n");
        assert_eq!(
            got,
            vec![(
                "voidbox::unknown_field".into(),
                6,
                7,
                "did you mean `timeout_secs`?".into()
            )]
        );
    }

    #[test]
    fn tagged_stage_reports_the_matching_branch() {
        let got = check("kind: pipeline\nname: x\npipeline:\n  boxes: []\n  stages:\n    - type: fan_out\n      boxs: [a, b]\n");
        let codes: Vec<_> = got.iter().map(|g| g.0.as_str()).collect();
        assert!(codes.contains(&"voidbox::unknown_field"), "{got:?}");
        assert!(codes.contains(&"voidbox::missing_field"), "{got:?}");
    }

    #[test]
    fn unknown_stage_type_suggests() {
        let got = check("kind: pipeline\nname: x\npipeline:\n  boxes: []\n  stages:\n    - type: fanout\n      boxes: [a, b]\n");
        assert_eq!(
            got,
            vec![(
                "voidbox::invalid_value".into(),
                6,
                13,
                "did you mean `fan_out`?".into()
            )]
        );
    }

    #[test]
    fn ranges_and_enums() {
        let got = check("kind: agent\nname: x\nsandbox:\n  memory_mb: 32\n  vcpus: 64\nllm:\n  provider: claud\nagent:\n  prompt: hi\n");
        assert_eq!(got[0].0, "voidbox::out_of_range");
        assert_eq!((got[0].1, got[0].2), (4, 14));
        assert_eq!(got[1].0, "voidbox::out_of_range");
        assert_eq!(
            got[2],
            (
                "voidbox::unknown_provider".into(),
                7,
                13,
                "did you mean `claude`?".into()
            )
        );
    }

    #[test]
    fn network_takes_a_boolean_or_a_policy_mapping() {
        for ok in [
            "true",
            "false",
            "{}",
            "{allow_host_ports: [1, 65535], allow_domains: [a.example], allow: [10.0.0.0/8], deny: [\"fd00::/8\"], max_connections: 65535, connections_per_second: 10000}",
        ] {
            let got = check(&format!("kind: sandbox\nname: s\nsandbox:\n  network: {ok}\n"));
            assert!(got.is_empty(), "{ok}: {got:?}");
        }
        let got = check("kind: sandbox\nname: s\nsandbox:\n  network: \"yes\"\n");
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].0.as_str(), got[0].1, got[0].2),
            ("voidbox::invalid_type", 4, 12)
        );
        let mut got = check("kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      sandbox:\n        network:\n          allow_host_port: [80]\n          max_connections: 0\n          connections_per_second: 10001\n");
        got.sort_by_key(|g| (g.1, g.2));
        let codes: Vec<_> = got.iter().map(|g| (g.0.as_str(), g.1, g.2)).collect();
        assert_eq!(
            codes,
            [
                ("voidbox::unknown_field", 9, 11),
                ("voidbox::out_of_range", 10, 28),
                ("voidbox::out_of_range", 11, 35),
            ],
            "{got:?}"
        );
        assert_eq!(got[0].3, "did you mean `allow_host_ports`?");
        let got = check(
            "kind: sandbox\nname: s\nsandbox:\n  network: {allow_host_ports: [0, 65536, 80]}\n",
        );
        let codes: Vec<_> = got.iter().map(|g| (g.0.as_str(), g.1, g.2)).collect();
        assert_eq!(
            codes,
            [
                ("voidbox::out_of_range", 4, 32),
                ("voidbox::out_of_range", 4, 35)
            ],
            "{got:?}"
        );
    }

    #[test]
    fn wrong_types() {
        let got =
            check("kind: pipeline\nname: x\nsandbox:\n  memory_mb: lots\npipeline:\n  boxes: {}\n");
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got.iter().all(|g| g.0 == "voidbox::invalid_type"));
    }
}
