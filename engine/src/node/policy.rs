//! The guest policy every VM gets (docs/architecture.md §6, §7 layer 4): sent with the authenticated
//! handshake right after the re-key, before the first request is served.
//!
//! * Allowlist: the programs the guest agent may execute for the node — its own program
//!   (`run.program` of a command box, workflow step or sandbox; the runtime of an agent
//!   box) plus `sandbox.allowed_commands`. The guest compares by resolved path and by name;
//!   anything else is refused with exit code 126 naming the program. It governs what the
//!   agent execs directly: children of an allowed program (`sh -c "tr …"`) are not filtered.
//!   The engine runs no helper programs of its own in the guest — inputs, skills and outputs
//!   move by file RPCs — so nothing else needs to be on the list.
//! * Resource limits: `sandbox.limits` (the box's over the spec's, field by field), with
//!   [`ResourceLimits::DEFAULT`] where neither sets one.
//! * Timeout cap: the node's `timeout_secs`, so the guest never clamps it.

use voidbox_protocol::{valid_allow_entry, GuestPolicy, ResourceLimits};

use crate::plan::{Action, PlanNode};

/// The programs `node`'s guest agent may start, in order, without duplicates;
/// `program` is what the node starts: an agent node's runtime program
/// ([`super::launch::launch`]), or the image entrypoint of a command node without
/// `run.program` ([`super::oci_images::command_line`]).
pub fn allowlist(node: &PlanNode, program: Option<&str>) -> Vec<String> {
    let own = match &node.action {
        Action::Command(c) => c.program.clone().or_else(|| program.map(str::to_string)),
        Action::Agent(_) => program.map(str::to_string),
        Action::Shell => None,
    };
    // A command that runs a runtime program by name finds it on the runtimes disk
    // ([`super::command_runtimes`]): the guest compares by resolved path, so its path too.
    let runtime = match (&node.action, own.as_deref()) {
        (Action::Command(_), Some(p)) if !super::command_runtimes::of(node).is_empty() => {
            super::command_runtimes::bin(p).map(str::to_string)
        }
        _ => None,
    };
    let own = own.into_iter().chain(runtime);
    let mut out: Vec<String> = Vec::new();
    // A program that is neither a bare name nor an absolute path can never run (the guest
    // refuses that exec itself, with a clear message); listing it would make the guest
    // refuse the whole policy instead.
    for p in own.chain(node.sandbox.allowed_commands.iter().cloned()) {
        if valid_allow_entry(&p) && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The policy sent to `node`'s VMs (`program`: as for [`allowlist`]).
pub fn node_policy(node: &PlanNode, program: Option<&str>) -> GuestPolicy {
    GuestPolicy {
        allowlist: Some(allowlist(node, program)),
        rlimits: node.sandbox.limits.or_default(),
        max_timeout_secs: node.timeout_secs.filter(|&t| t > 0),
        ..GuestPolicy::default()
    }
}

/// The policy of `voidbox run -- PROGRAM …`: only `program`, default limits.
pub fn run_policy(program: &str, timeout_secs: Option<u64>) -> GuestPolicy {
    GuestPolicy {
        allowlist: Some(
            Some(program.to_string())
                .filter(|p| valid_allow_entry(p))
                .into_iter()
                .collect(),
        ),
        rlimits: ResourceLimits::DEFAULT,
        max_timeout_secs: timeout_secs.filter(|&t| t > 0),
        ..GuestPolicy::default()
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::node::agent::MOCK_RUNTIME;
    use crate::plan::Plan;

    fn plan(src: &str) -> Plan {
        crate::plan::compile_for_test(src)
    }

    fn node<'a>(p: &'a Plan, name: &str) -> &'a PlanNode {
        p.graph
            .node_weights()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    #[test]
    fn allowlist_is_the_nodes_program_plus_allowed_commands() {
        let p = plan(
            r#"
api_version: v1
kind: pipeline
name: p
sandbox:
  allowed_commands: [cat, /usr/bin/env]
  limits: {nofile: 4096, fsize_mb: 64}
pipeline:
  boxes:
    - name: seed
      run: {program: sh, args: [-c, "echo hi | tr a-z A-Z"]}
    - name: upper
      run: {program: tr, args: [a-z, A-Z]}
      sandbox:
        allowed_commands: [sed, tr]
        limits: {nofile: 64, address_space_mb: 2048}
      timeout_secs: 900
  stages:
    - {type: box, name: seed}
    - {type: box, name: upper}
"#,
        );
        let seed = node_policy(node(&p, "seed"), None);
        assert_eq!(
            seed.allowlist.as_deref(),
            Some(&["sh".to_string(), "cat".into(), "/usr/bin/env".into()][..])
        );
        assert_eq!(
            seed.rlimits,
            ResourceLimits {
                nofile: Some(4096),
                nproc: ResourceLimits::DEFAULT.nproc,
                fsize_mb: Some(64),
                address_space_mb: None,
            }
        );
        assert_eq!(seed.max_timeout_secs, None);
        assert!(seed.validate().is_ok());
        // The box's list replaces the spec's; its limits override field by field.
        let upper = node_policy(node(&p, "upper"), None);
        assert_eq!(
            upper.allowlist.as_deref(),
            Some(&["tr".to_string(), "sed".into()][..])
        );
        assert_eq!(upper.rlimits.nofile, Some(64));
        assert_eq!(upper.rlimits.fsize_mb, Some(64));
        assert_eq!(upper.rlimits.address_space_mb, Some(2048));
        assert_eq!(upper.max_timeout_secs, Some(900));
    }

    #[test]
    fn agents_may_start_their_runtime_and_defaults_apply() {
        let p = plan(
            r#"
api_version: v1
kind: agent
name: a
llm: {provider: mock}
agent:
  prompt: hi
"#,
        );
        let pol = node_policy(node(&p, "a"), Some(MOCK_RUNTIME));
        assert_eq!(pol.allowlist, Some(vec![MOCK_RUNTIME.to_string()]));
        assert_eq!(pol.rlimits, ResourceLimits::DEFAULT);
        let w = plan(
            r#"
api_version: v1
kind: workflow
name: w
workflow:
  steps:
    - name: one
      run: {program: /bin/busybox, args: [echo, hi]}
"#,
        );
        assert_eq!(
            allowlist(node(&w, "one"), None),
            vec!["/bin/busybox".to_string()]
        );
        let rel = plan(
            r#"
api_version: v1
kind: sandbox
name: s
run: {program: ./run.sh}
"#,
        );
        assert!(allowlist(node(&rel, "s"), None).is_empty());
        assert!(node_policy(node(&rel, "s"), None).validate().is_ok());
        let r = run_policy("ls", Some(5));
        assert_eq!(r.allowlist, Some(vec!["ls".to_string()]));
        assert_eq!(r.rlimits, ResourceLimits::DEFAULT);
    }
}
