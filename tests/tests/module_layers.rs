//! The top-level modules of `voidbox` (engine) and `voidbox-spec` form layers: read from the
//! `crate::` paths of their non-test code, no module reaches one that reaches it back
//! (issue 24). A new upward import fails here with the cycle and the files that make it;
//! the passing run prints the order, lowest layer first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use voidbox_tests::repo_root;

/// `module -> (module it uses -> files that use it)`.
type Edges = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The crate's top-level modules: `src/NAME.rs` and `src/NAME/`.
fn modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .expect("src dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let m = name.strip_suffix(".rs").unwrap_or(&name).to_string();
            (m != "lib" && m != "main").then_some(m)
        })
        .collect()
}

/// The `.rs` files of a module, test files left out.
fn files(src: &Path, module: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{module}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src.join(module)];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("module dir").flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != "tests" {
                    dirs.push(p);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && name != "testing.rs" {
                out.push(p);
            }
        }
    }
    out
}

/// The text without `//` comments and without `#[cfg(test)] mod NAME { … }` blocks.
fn non_test_code(text: &str) -> String {
    let code: String = text
        .lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let head = after.trim_start();
        let is_mod = head.starts_with("mod ")
            || head.starts_with("pub mod ")
            || head.starts_with("pub(crate) mod ");
        let open = after.find('{');
        let block = is_mod && open.is_some_and(|o| after.find(';').is_none_or(|s| o < s));
        let Some(open) = open.filter(|_| block) else {
            // `mod tests;` (its file is left out already) or another test-only item: skip
            // the attribute only.
            rest = after;
            continue;
        };
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The modules `code` names through `crate::NAME` (also inside `use crate::{…}` groups).
fn used(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let after = &code[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let inner = group.split('}').next().unwrap_or("");
            out.extend(inner.split(',').map(|p| ident(p.trim())));
        } else {
            out.insert(ident(after));
        }
    }
    out.retain(|m| modules.contains(m));
    out
}

fn edges(src: &Path) -> Edges {
    let modules = modules(src);
    let mut edges = Edges::new();
    for m in &modules {
        let uses = edges.entry(m.clone()).or_default();
        for f in files(src, m) {
            let text = std::fs::read_to_string(&f).expect("source");
            for to in used(&non_test_code(&text), &modules) {
                if &to != m {
                    let rel = f.strip_prefix(src).unwrap_or(&f).display().to_string();
                    uses.entry(to).or_default().insert(rel);
                }
            }
        }
    }
    edges
}

/// The modules in layer order (lowest first), or the modules left on cycles.
fn layers(edges: &Edges) -> Result<Vec<String>, BTreeSet<String>> {
    let mut placed: Vec<String> = Vec::new();
    let mut left: BTreeSet<String> = edges.keys().cloned().collect();
    loop {
        let ready: Vec<String> = left
            .iter()
            .filter(|m| edges[*m].keys().all(|to| !left.contains(to)))
            .cloned()
            .collect();
        if ready.is_empty() {
            break;
        }
        for m in ready {
            left.remove(&m);
            placed.push(m);
        }
    }
    match left.is_empty() {
        true => Ok(placed),
        false => Err(left),
    }
}

fn assert_layered(crate_dir: &str) {
    let src = repo_root().join(crate_dir).join("src");
    let edges = edges(&src);
    assert!(edges.len() > 5, "{crate_dir}: modules found: {edges:?}");
    match layers(&edges) {
        Ok(order) => println!("{crate_dir}: {}", order.join(" < ")),
        Err(left) => {
            let mut why = String::new();
            for m in &left {
                for (to, files) in &edges[m] {
                    if left.contains(to) {
                        why.push_str(&format!("\n  {m} -> {to}: {files:?}"));
                    }
                }
            }
            panic!("{crate_dir}: modules on import cycles:{why}");
        }
    }
}

#[test]
fn engine_modules_form_layers() {
    assert_layered("engine");
}

#[test]
fn spec_modules_form_layers() {
    assert_layered("spec");
}

#[test]
fn a_cycle_is_found_and_test_code_is_not_counted() {
    let modules: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let code = "use crate::{b, c::X};\n// crate::a\n#[cfg(test)]\nmod tests { use crate::a; fn f() { if x { } } }\nfn g() { crate::a::f() }";
    assert_eq!(
        used(&non_test_code(code), &modules),
        ["a", "b", "c"].map(String::from).into()
    );
    let code = "use crate::b;\n#[cfg(test)]\nmod tests { use crate::a; }\n";
    assert_eq!(
        used(&non_test_code(code), &modules),
        ["b".to_string()].into()
    );
    let code = "#[cfg(test)]\nmod tests;\nuse crate::b;\nfn f() { }\n";
    assert_eq!(
        used(&non_test_code(code), &modules),
        ["b".to_string()].into()
    );
    let e = |pairs: &[(&str, &str)]| {
        let mut e = Edges::new();
        for m in ["a", "b", "c"] {
            e.entry(m.into()).or_default();
        }
        for (from, to) in pairs {
            e.get_mut(*from)
                .unwrap()
                .entry(to.to_string())
                .or_default()
                .insert("f.rs".into());
        }
        e
    };
    assert_eq!(
        layers(&e(&[("a", "b"), ("b", "c")])).unwrap(),
        ["c", "b", "a"]
    );
    assert_eq!(
        layers(&e(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap_err(),
        ["a", "b", "c"].map(String::from).into()
    );
}
