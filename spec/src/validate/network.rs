//! `network:` mappings — the spec's `sandbox.network` and each box's and step's — checked
//! with [`crate::network_policy::checks`]: CIDRs in `allow` / `deny` (`voidbox::invalid_cidr`,
//! host bits set included), names in `allow_domains` (`voidbox::invalid_domain`) and ports
//! listed twice (`voidbox::duplicate_port`), each at the offending item. A CIDR or name
//! listed twice is a warning (`voidbox::duplicate_entry`). Types and ranges (ports 1..=65535,
//! `max_connections`, `connections_per_second`) are the schema's.

use super::semantic::items;
use crate::diagnostic::Diagnostic;
use crate::network_policy::checks;
use crate::yaml::{Node, NodeKind};

fn sandbox_network(n: &Node) -> Option<&Node> {
    n.get("sandbox").and_then(|s| s.get("network"))
}

/// Reports every invalid value in the spec's `network:` mappings.
pub fn check(root: &Node, out: &mut Vec<Diagnostic>) {
    if let Some(n) = sandbox_network(root) {
        policy(n, "sandbox.network", out);
    }
    let boxes = root.get("pipeline").and_then(|p| p.get("boxes"));
    for (i, b) in items(boxes).iter().enumerate() {
        if let Some(n) = sandbox_network(b) {
            policy(n, &format!("pipeline.boxes[{i}].sandbox.network"), out);
        }
    }
    let steps = root.get("workflow").and_then(|w| w.get("steps"));
    for (i, s) in items(steps).iter().enumerate() {
        if let Some(n) = sandbox_network(s) {
            policy(n, &format!("workflow.steps[{i}].sandbox.network"), out);
        }
    }
}

fn policy(node: &Node, at: &str, out: &mut Vec<Diagnostic>) {
    if !matches!(node.kind, NodeKind::Map(_)) {
        return;
    }
    let ports = items(node.get("allow_host_ports"));
    let values: Vec<Option<u16>> = ports.iter().map(port_of).collect();
    let known: Vec<u16> = values.iter().flatten().copied().collect();
    let index_of: Vec<usize> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|_| i))
        .collect();
    for (dup, first) in checks::duplicate_ports(&known) {
        let (i, j) = (index_of[dup], index_of[first]);
        out.push(
            Diagnostic::error(
                "voidbox::duplicate_port",
                format!(
                    "`{at}.allow_host_ports[{i}]`: port {} is listed twice",
                    known[dup]
                ),
                ports[i].span,
            )
            .with_label("listed again here")
            .with_related(ports[j].span, "first listed here")
            .with_help("list each port once"),
        );
    }
    for (i, d) in items(node.get("allow_domains")).iter().enumerate() {
        let Some(name) = d.as_str().filter(|s| !s.is_empty()) else {
            continue;
        };
        if let Err(p) = checks::domain(name) {
            out.push(
                Diagnostic::error(
                    "voidbox::invalid_domain",
                    format!("`{at}.allow_domains[{i}]`: {}", p.message),
                    d.span,
                )
                .with_label("not a domain name")
                .with_help_opt(p.help),
            );
        }
    }
    duplicates(node, "allow_domains", at, |s| checks::domain(s).ok(), out);
    for key in ["allow", "deny"] {
        for (i, c) in items(node.get(key)).iter().enumerate() {
            let Some(text) = c.as_str() else { continue };
            if let Err(p) = checks::cidr(text) {
                out.push(
                    Diagnostic::error(
                        "voidbox::invalid_cidr",
                        format!("`{at}.{key}[{i}]`: {}", p.message),
                        c.span,
                    )
                    .with_label("invalid CIDR")
                    .with_help_opt(p.help),
                );
            }
        }
        duplicates(
            node,
            key,
            at,
            |s| checks::cidr(s).ok().map(|n| n.to_string()),
            out,
        );
    }
}

/// Warns about entries of `node.key` whose normal form (`norm`) repeats an earlier one's.
fn duplicates(
    node: &Node,
    key: &str,
    at: &str,
    norm: impl Fn(&str) -> Option<String>,
    out: &mut Vec<Diagnostic>,
) {
    let list = items(node.get(key));
    let normal: Vec<Option<String>> = list.iter().map(|n| n.as_str().and_then(&norm)).collect();
    for (i, v) in normal.iter().enumerate() {
        let Some(v) = v else { continue };
        if let Some(first) = normal[..i].iter().position(|w| w.as_ref() == Some(v)) {
            out.push(
                Diagnostic::warning(
                    "voidbox::duplicate_entry",
                    format!("`{at}.{key}[{i}]`: `{v}` is listed twice"),
                    list[i].span,
                )
                .with_related(list[first].span, "first listed here"),
            );
        }
    }
}

/// A port number in range, as the schema accepts it.
fn port_of(n: &Node) -> Option<u16> {
    match &n.kind {
        NodeKind::Number(num) => num
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::line_col;
    use crate::yaml::parse;

    /// `(code, line, column, message, help)` of each diagnostic.
    fn diags(src: &str) -> Vec<(String, usize, usize, String, String)> {
        let root = parse(src).expect("yaml");
        let mut out = Vec::new();
        check(&root, &mut out);
        out.into_iter()
            .map(|d| {
                let (l, c) = line_col(src, d.span.offset);
                (
                    d.code.to_string(),
                    l,
                    c,
                    d.message,
                    d.help.unwrap_or_default(),
                )
            })
            .collect()
    }

    #[test]
    fn host_bits_are_located_with_a_suggestion() {
        let src = "kind: sandbox\nname: s\nsandbox:\n  network:\n    allow: [10.0.0.1/8]\n    deny:\n      - 198.51.100.0/24\n      - fd00::1\n";
        let got = diags(src);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            (got[0].0.as_str(), got[0].1, got[0].2),
            ("voidbox::invalid_cidr", 5, 13)
        );
        assert!(got[0]
            .3
            .starts_with("`sandbox.network.allow[0]`: `10.0.0.1/8` has host bits set"));
        assert!(got[0].4.contains("did you mean `10.0.0.0/8`"), "{got:?}");
        assert_eq!((got[1].1, got[1].2), (8, 9));
        assert!(got[1].3.contains("`sandbox.network.deny[1]`"), "{got:?}");
        assert_eq!(got[1].4, "write `fd00::1/128` for this one address");
    }

    #[test]
    fn domains_and_duplicate_ports_per_box_and_step() {
        let src = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      sandbox:\n        network:\n          allow_host_ports: [80, 11434, 80]\n          allow_domains: [\"https://api.github.com\", \"*.ok.example\", \"a.*.b\"]\n";
        let got = diags(src);
        let codes: Vec<(&str, usize, usize)> =
            got.iter().map(|g| (g.0.as_str(), g.1, g.2)).collect();
        assert_eq!(
            codes,
            [
                ("voidbox::duplicate_port", 9, 41),
                ("voidbox::invalid_domain", 10, 27),
                ("voidbox::invalid_domain", 10, 69),
            ],
            "{got:?}"
        );
        assert!(got[0]
            .3
            .contains("`pipeline.boxes[0].sandbox.network.allow_host_ports[2]`"));
        assert_eq!(got[1].4, "did you mean `api.github.com`?");
        let wf = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - name: s\n      run: {program: echo}\n      sandbox: {network: {allow_domains: [\"1.2.3.4\"]}}\n";
        let got = diags(wf);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].3.starts_with(
            "`workflow.steps[0].sandbox.network.allow_domains[0]`: `1.2.3.4` is an IP address"
        ));
    }

    #[test]
    fn duplicates_of_names_and_cidrs_are_warnings() {
        let src = "kind: sandbox\nname: s\nsandbox:\n  network:\n    allow_domains: [a.example, A.example]\n    deny: [10.0.0.0/8, 10.0.0.0/8]\n";
        let root = parse(src).expect("yaml");
        let mut out = Vec::new();
        check(&root, &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out
            .iter()
            .all(|d| !d.is_error() && d.code == "voidbox::duplicate_entry"));
    }

    #[test]
    fn valid_policies_and_boolean_forms_pass() {
        let src = "kind: pipeline\nname: p\nsandbox:\n  network: true\npipeline:\n  boxes:\n    - name: a\n      run: {program: echo}\n      sandbox:\n        network:\n          allow_host_ports: [11434]\n          allow_domains: [api.github.com, \"*.example.com\"]\n          allow: [203.0.113.0/24, \"2001:db8::/32\"]\n          deny: [198.51.100.0/24]\n          max_connections: 64\n          connections_per_second: 50\n    - name: b\n      run: {program: echo}\n      sandbox: {network: false}\n";
        assert!(diags(src).is_empty(), "{:?}", diags(src));
    }
}
