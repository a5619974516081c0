//! A command node that runs a runtime program gets the runtimes disk ([`crate::runtimes`]),
//! as an agent node does: void-box ships `codex` and `claude` in its guest, so
//! `run: {program: codex}` (or `claude`, or a `sh -c` script that runs one as a command,
//! [`voidbox_spec::validate::runtimes::command_runtimes`]) finds them on its `PATH`.
//!
//! Not in an OCI `sandbox.image` (its programs are the image's): there the disk is not
//! attached and the name is looked up in the image.

use crate::plan::{Action, PlanNode};
use voidbox_spec::validate::runtimes::command_runtimes;

/// The guest's system `PATH` (the guest agent's default).
const SYSTEM_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// The runtime programs `node`'s command runs (empty: it needs no runtimes disk).
pub fn of(node: &PlanNode) -> Vec<&'static str> {
    match &node.action {
        Action::Command(c) if node.sandbox.image.is_none() => c
            .program
            .as_deref()
            .map(|p| command_runtimes(p, &c.args))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Where runtime program `name` (one of
/// [`voidbox_spec::validate::runtimes::RUNTIME_PROGRAMS`]) is in the guest.
pub fn bin(name: &str) -> Option<&'static str> {
    match name {
        "codex" => Some(crate::runtimes::CODEX_BIN),
        "claude" => Some(crate::runtimes::CLAUDE_BIN),
        _ => None,
    }
}

/// The `PATH` of a command node with the runtimes disk: the runtimes' directories, then the
/// system's (a `PATH` of the node's own `env` replaces it).
pub fn path() -> String {
    format!(
        "{}:{}:{SYSTEM_PATH}",
        crate::runtimes::CODEX_BIN_DIR,
        crate::runtimes::CLAUDE_BIN_DIR
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> crate::plan::Plan {
        let v = voidbox_spec::validate::validate_source(
            "t.yaml",
            text.into(),
            std::path::Path::new("."),
        );
        let spec = v
            .spec
            .unwrap_or_else(|| panic!("{:?}", v.report.diagnostics));
        crate::plan::Plan::compile(&spec, std::path::Path::new(".")).expect("plan")
    }

    fn runtimes_of(text: &str) -> Vec<(String, Vec<&'static str>)> {
        let p = plan(text);
        let mut out: Vec<_> = p
            .graph
            .node_weights()
            .map(|n| (n.name.clone(), of(n)))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn command_nodes_running_a_runtime_need_the_disk() {
        let w = "api_version: v1\nkind: workflow\nname: w\nworkflow:\n  steps:\n    - name: a\n      run: {program: codex, args: [--version]}\n    - name: b\n      run: {program: sh, args: [-c, 'claude --version | head -1']}\n    - name: c\n      run: {program: echo, args: [codex]}\n    - name: d\n      sandbox: {image: 'alpine:3'}\n      run: {program: codex}\n";
        assert_eq!(
            runtimes_of(w),
            [
                ("a".to_string(), vec!["codex"]),
                ("b".to_string(), vec!["claude"]),
                ("c".to_string(), vec![]),
                ("d".to_string(), vec![]),
            ]
        );
        for p in ["codex", "claude"] {
            let b = bin(p).expect("bin");
            let dir = b.rsplit_once('/').map(|(d, _)| d).expect("dir");
            assert!(path().split(':').any(|d| d == dir), "{}", path());
        }
        assert!(path().ends_with(":/bin:/usr/local/sbin:/usr/sbin:/sbin"));
    }
}
