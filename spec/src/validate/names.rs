//! Names that reach host file names (the spec's, every box's and step's, box outputs'):
//! refused with `voidbox::bad_name` when they hold `/`, `\`, NUL or control characters, or
//! are `.` / `..` ([`crate::names::name_problem`]). Every other name is encoded safely.

use super::semantic::items;
use crate::diagnostic::Diagnostic;
use crate::names::name_problem;
use crate::yaml::Node;

/// Reports every refused name in the spec.
pub fn check(root: &Node, out: &mut Vec<Diagnostic>) {
    let mut one = |node: Option<&Node>, what: &str| {
        let Some(n) = node else { return };
        let Some(name) = n.as_str() else { return };
        if let Some(why) = name_problem(name) {
            out.push(
                Diagnostic::error(
                    "voidbox::bad_name",
                    format!("{what} name {name:?} {why}"),
                    n.span,
                )
                .with_label("not allowed in a name")
                .with_help("names end up in host file names (run logs): use letters, digits, `-`, `_`, `.` or spaces, without `/`, `\\` or control characters"),
            );
        }
    };
    one(root.get("name"), "spec");
    let pipeline = root.get("pipeline");
    for b in items(pipeline.and_then(|p| p.get("boxes"))) {
        one(b.get("name"), "box");
        for o in items(b.get("outputs")) {
            one(o.get("name"), "output");
        }
    }
    for s in items(root.get("workflow").and_then(|w| w.get("steps"))) {
        one(s.get("name"), "step");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::line_col;
    use crate::yaml::parse;

    fn bad(src: &str) -> Vec<(usize, usize, String)> {
        let root = parse(src).expect("yaml");
        let mut out = Vec::new();
        check(&root, &mut out);
        out.into_iter()
            .map(|d| {
                assert_eq!(d.code, "voidbox::bad_name");
                let (l, c) = line_col(src, d.span.offset);
                (l, c, d.message)
            })
            .collect()
    }

    #[test]
    fn refuses_path_like_names_where_they_are() {
        let src = "kind: pipeline\nname: \"../../x\"\npipeline:\n  boxes:\n    - name: \"a\\0b\"\n      run: {program: echo}\n      outputs: [{name: ..}]\n    - {name: ok box, run: {program: echo}}\n";
        let got = bad(src);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].0, got[0].1), (2, 7));
        assert!(
            got[0].2.contains("spec name \"../../x\" contains `/`"),
            "{got:?}"
        );
        assert_eq!((got[1].0, got[1].1), (5, 13));
        assert!(got[1].2.contains("NUL"), "{got:?}");
        assert_eq!(got[2].0, 7);
        let wf = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: \"a\\\\b\", run: {program: echo}}\n";
        assert_eq!(bad(wf).len(), 1);
        assert!(bad("kind: sandbox\nname: plain-name_1.0\n").is_empty());
    }
}
