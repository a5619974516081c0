//! The spec's JSON Schema (generated from the model by `voidbox-spec`) walked along a path:
//! what a field means (its description), which fields a mapping takes, which values an
//! enumeration accepts. `$ref`s and `anyOf`/`oneOf`/`allOf` alternatives are followed.

use serde_json::Value;

use crate::path::Seg;

/// The schema root.
pub fn root() -> &'static Value {
    voidbox_spec::schema::schema()
}

/// `schema` with its `$ref` (to `#/$defs/NAME`) followed, repeatedly.
fn resolve(schema: &Value) -> &Value {
    let mut s = schema;
    for _ in 0..16 {
        let Some(r) = s.get("$ref").and_then(Value::as_str) else {
            return s;
        };
        let Some(target) = r
            .strip_prefix("#/$defs/")
            .and_then(|name| root().get("$defs")?.get(name))
        else {
            return s;
        };
        s = target;
    }
    s
}

/// `schema` and every alternative it allows (`anyOf`/`oneOf`/`allOf`, refs resolved).
fn alternatives(schema: &Value) -> Vec<&Value> {
    let mut out: Vec<&Value> = Vec::new();
    let mut todo = vec![schema];
    while let Some(s) = todo.pop() {
        let s = resolve(s);
        if out
            .iter()
            .any(|o| std::ptr::eq(*o as *const Value, s as *const Value))
            || out.len() > 64
        {
            continue;
        }
        out.push(s);
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(list) = s.get(key).and_then(Value::as_array) {
                // Popped in the schema's order.
                todo.extend(list.iter().rev());
            }
        }
    }
    out
}

/// The schemas a path leads to (one per alternative that has the step), with the schema of
/// the last step as written at its parent (so its own description is kept).
pub fn at(path: &[Seg]) -> Vec<&'static Value> {
    let mut here: Vec<&'static Value> = vec![root()];
    for seg in path {
        let mut next: Vec<&'static Value> = Vec::new();
        for s in here.iter().flat_map(|s| alternatives(s)) {
            let child = match seg {
                Seg::Key(k) => s
                    .get("properties")
                    .and_then(|p| p.get(k))
                    .or_else(|| s.get("additionalProperties").filter(|a| a.is_object())),
                Seg::Item(_) => s.get("items"),
            };
            if let Some(c) = child {
                if !next
                    .iter()
                    .any(|n| std::ptr::eq(*n as *const Value, c as *const Value))
                {
                    next.push(c);
                }
            }
        }
        if next.is_empty() {
            return next;
        }
        here = next;
    }
    here
}

/// The description of what `path` names (the field's own, else its type's).
pub fn description(path: &[Seg]) -> Option<String> {
    let schemas = at(path);
    for s in &schemas {
        if let Some(d) = s.get("description").and_then(Value::as_str) {
            return Some(d.to_string());
        }
    }
    schemas
        .iter()
        .flat_map(|s| alternatives(s))
        .find_map(|s| s.get("description").and_then(Value::as_str))
        .map(str::to_string)
}

/// The fields the mapping at `path` takes: (name, description), in schema order.
pub fn fields(path: &[Seg]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for s in at(path).iter().flat_map(|s| alternatives(s)) {
        let Some(props) = s.get("properties").and_then(Value::as_object) else {
            continue;
        };
        for (name, p) in props {
            if out.iter().any(|(n, _)| n == name) {
                continue;
            }
            let desc = p
                .get("description")
                .or_else(|| resolve(p).get("description"))
                .and_then(Value::as_str)
                .map(str::to_string);
            out.push((name.clone(), desc));
        }
    }
    out
}

/// The values an enumeration at `path` accepts: (value, description).
pub fn values(path: &[Seg]) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    let mut push = |v: &Value, d: Option<&str>| {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            _ => return,
        };
        if !out.iter().any(|(t, _)| *t == text) {
            out.push((text, d.map(str::to_string)));
        }
    };
    for s in at(path).iter().flat_map(|s| alternatives(s)) {
        let d = s.get("description").and_then(Value::as_str);
        if let Some(c) = s.get("const") {
            push(c, d);
        }
        for v in s
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            push(v, None);
        }
        if s.get("type").and_then(Value::as_str) == Some("boolean") {
            push(&Value::Bool(true), None);
            push(&Value::Bool(false), None);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Seg {
        Seg::Key(s.into())
    }

    #[test]
    fn descriptions_fields_and_values_follow_refs_and_alternatives() {
        let d = description(&[key("kind")]).unwrap();
        assert!(d.contains("What this spec describes"), "{d}");
        let kinds: Vec<String> = values(&[key("kind")]).into_iter().map(|v| v.0).collect();
        for k in ["agent", "sandbox", "pipeline", "workflow"] {
            assert!(kinds.contains(&k.to_string()), "{kinds:?}");
        }
        let run = [
            key("pipeline"),
            key("boxes"),
            Seg::Item(0),
            key("run"),
            key("program"),
        ];
        assert!(description(&run).unwrap().contains("Program name"));
        let stage: Vec<String> = fields(&[key("pipeline"), key("stages"), Seg::Item(0)])
            .into_iter()
            .map(|f| f.0)
            .collect();
        assert_eq!(stage, ["type", "name", "boxes"]);
        let types: Vec<String> =
            values(&[key("pipeline"), key("stages"), Seg::Item(0), key("type")])
                .into_iter()
                .map(|v| v.0)
                .collect();
        assert_eq!(types, ["box", "fan_out"]);
        let env = [key("sandbox"), key("env"), key("ANY_NAME")];
        assert!(!at(&env).is_empty(), "maps take any key");
        assert!(fields(&[key("nonsense")]).is_empty());
    }
}
