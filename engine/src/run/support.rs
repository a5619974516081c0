//! Plan-time check that every node only asks for sandbox features this installation can
//! provide. A feature that cannot work is refused with a clear error, never silently dropped.

use crate::plan::{NodeSandbox, Plan};

/// The first unsupported sandbox feature of any node, as an error message with help.
pub fn check_supported(plan: &Plan) -> Result<(), String> {
    for n in plan.graph.node_weights() {
        if let Some(feature) = unsupported(&n.sandbox) {
            return Err(format!(
                "node `{}` asks for {feature}, which this version of voidbox cannot provide yet\n  help: remove it from the spec (`voidbox validate` accepts it so that specs stay portable)",
                n.name
            ));
        }
    }
    Ok(())
}

fn unsupported(sb: &NodeSandbox) -> Option<&'static str> {
    if sb.network {
        Some("`network: true` (the VM has no network device yet)")
    } else if !sb.mounts.is_empty() {
        Some("`mounts` (host directories are not shared into the VM yet)")
    } else if sb.image.is_some() {
        Some("an OCI root filesystem `image` (OCI images are not supported yet)")
    } else if sb.kernel.is_some() || sb.initramfs.is_some() {
        Some("a custom `kernel`/`initramfs` (only the built-in guest image boots)")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::validate_source;
    use std::path::Path;

    fn plan(sandbox: &str) -> Plan {
        let src = format!("kind: sandbox\nname: s\nsandbox: {sandbox}\nrun: {{program: echo}}\n");
        let v = validate_source("t.yaml", src, Path::new("/"));
        let spec = v.spec.expect("valid spec");
        Plan::compile(&spec, Path::new("/")).expect("plan")
    }

    #[test]
    fn refuses_features_that_cannot_work() {
        assert!(check_supported(&plan("{memory_mb: 128}")).is_ok());
        let e = check_supported(&plan("{network: true}")).expect_err("network");
        assert!(e.contains("node `s` asks for `network: true`"), "{e}");
        let e = check_supported(&plan("{mounts: [{host: /, guest: /mnt}]}")).expect_err("mounts");
        assert!(e.contains("`mounts`"), "{e}");
        assert!(check_supported(&plan("{image: 'alpine:3.20'}")).is_err());
        assert!(check_supported(&plan("{snapshot: abc}")).is_ok());
    }
}
