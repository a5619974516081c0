//! The node runner: `voidbox apply SPEC --node NAME --inputs DIR --outputs DIR` runs one node
//! of a plan, in its own VM, with the same semantics as inside a whole `apply`, for a
//! distributed engine (Argo Workflows, GitHub Actions; see [`crate::export`]) that runs each
//! node on its own machine and moves the nodes' results between them.
//!
//! The layout both sides share, one directory per node named by
//! [`crate::names::file_component`]:
//!
//! ```text
//! <inputs>/<upstream node>/output               that node's output, as its runner wrote it
//! <inputs>/<upstream node>/artifacts/<name>/    its box outputs (artifacts)
//! <outputs>/output                              this node's output (when it succeeded)
//! <outputs>/artifacts/<name>/                   its box outputs
//! <outputs>/report.json                         the JSON report of this node's run
//! ```
//!
//! The node's input is built from the upstream outputs by the scheduler's own rule
//! ([`crate::scheduler::data::node_input`]): a fan-in is merged as a JSON array in declaration
//! order exactly as `apply` merges it. A sidecar service upstream (`mode: service`) runs
//! beside its dependents and hands them no output, as a command service does in `apply`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use petgraph::graph::NodeIndex;

use crate::names::file_component;
use crate::plan::Plan;
use crate::scheduler::data::{final_output, node_input, NodeInput};

/// What a node runner runs: the node's plan, its input and its box inputs.
#[derive(Debug)]
pub struct NodeJob {
    /// The node alone ([`Plan::only`]).
    pub plan: Plan,
    /// Its input, built from the upstream outputs.
    pub input: NodeInput,
    /// Its box inputs: artifact name → directory under `--inputs`.
    pub artifacts: HashMap<String, PathBuf>,
}

/// The node called `name`, or the usage error listing every node's name.
pub fn find_node(plan: &Plan, name: &str) -> Result<NodeIndex, String> {
    plan.node(name).ok_or_else(|| {
        let names: Vec<&str> = plan.graph.node_weights().map(|n| n.name.as_str()).collect();
        format!(
            "--node {name}: `{}` has no node `{name}`; its nodes are: {}",
            plan.name,
            names.join(", ")
        )
    })
}

/// The directory of node `name`'s results under an `--inputs` directory.
pub fn node_dir(inputs: &Path, name: &str) -> PathBuf {
    inputs.join(file_component(name))
}

/// Reads `<inputs>/<node>/output`, within `max_output` bytes; `needed_by` says who reads it
/// (``node `x` ``, `the final output`).
fn read_output(
    inputs: &Path,
    node: &str,
    max_output: u64,
    needed_by: &str,
) -> Result<Vec<u8>, String> {
    let path = node_dir(inputs, node).join("output");
    let what = format!(
        "{needed_by} needs the output of `{node}`: {}",
        path.display()
    );
    let meta = std::fs::metadata(&path)
        .map_err(|e| format!("{what}: {}", crate::validate::io_reason(&e)))?;
    if !meta.is_file() {
        return Err(format!("{what}: not a regular file"));
    }
    let bytes = crate::validate::read_capped(&path, max_output)
        .map_err(|e| format!("{what}: {}", crate::validate::io_reason(&e)))?;
    if bytes.len() as u64 > max_output {
        return Err(format!(
            "{what}: over the output cap of {max_output} bytes (--max-output)"
        ));
    }
    Ok(bytes)
}

/// The nodes whose results `idx` needs: its upstream nodes ([`Plan::upstream`]), then the
/// producers of its box inputs that are not among them.
pub fn sources(plan: &Plan, idx: NodeIndex) -> Vec<NodeIndex> {
    let mut out = plan.upstream(idx);
    for i in &plan.graph[idx].artifacts.inputs {
        if let Some(p) = producer(plan, &i.from) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The [`sources`] whose results a runner reads from `--inputs`: all but sidecar services,
/// which run beside it and hand it no output.
pub fn reads(plan: &Plan, idx: NodeIndex) -> Vec<NodeIndex> {
    sources(plan, idx)
        .into_iter()
        .filter(|s| !plan.is_sidecar(*s))
        .collect()
}

/// The node whose box `outputs` include `name`.
pub fn producer(plan: &Plan, name: &str) -> Option<NodeIndex> {
    plan.graph.node_indices().find(|&i| {
        plan.graph[i]
            .artifacts
            .outputs
            .iter()
            .any(|o| o.name == name)
    })
}

/// Builds node `idx`'s job from the results under `inputs` (`None`: no `--inputs`, which
/// only a node without upstream nodes or box inputs may omit). Errors are usage errors
/// (exit 2) that name the node and the file.
pub fn prepare(
    plan: &Plan,
    idx: NodeIndex,
    inputs: Option<&Path>,
    run_input: Option<&[u8]>,
    max_output: u64,
) -> Result<NodeJob, String> {
    let node = &plan.graph[idx];
    let read = reads(plan, idx);
    let dir = match inputs {
        _ if read.is_empty() => None,
        None => {
            let names: Vec<&str> = read.iter().map(|s| plan.graph[*s].name.as_str()).collect();
            return Err(format!(
                "--node {}: it takes the results of {}; give them with --inputs DIR (DIR/<node>/output, DIR/<node>/artifacts/)",
                node.name,
                names.join(", ")
            ));
        }
        Some(dir) if !dir.is_dir() => {
            return Err(format!("--inputs {}: not a directory", dir.display()));
        }
        Some(dir) => Some(dir),
    };
    // In declaration order, so the first missing one is named first. `read` holds every
    // upstream node but the sidecars, which hand no output, so `dir` is set for each read.
    let mut outputs: Vec<Option<Vec<u8>>> = vec![None; plan.graph.node_count()];
    for s in plan.upstream(idx) {
        outputs[s.index()] = Some(match dir {
            Some(dir) if !plan.is_sidecar(s) => read_output(
                dir,
                &plan.graph[s].name,
                max_output,
                &format!("node `{}`", node.name),
            )?,
            _ => Vec::new(),
        });
    }
    let input = node_input(plan, idx, run_input, &outputs).ok_or_else(|| {
        format!(
            "--node {}: its input could not be built from --inputs",
            node.name
        )
    })?;
    let mut artifacts = HashMap::new();
    for i in &node.artifacts.inputs {
        let Some(p) = producer(plan, &i.from) else {
            return Err(format!(
                "--node {}: input `{}` is no box's output",
                node.name, i.from
            ));
        };
        let dir = inputs.ok_or_else(|| {
            format!(
                "--node {}: input `{}` needs --inputs DIR",
                node.name, i.from
            )
        })?;
        let src = node_dir(dir, &plan.graph[p].name)
            .join("artifacts")
            .join(file_component(&i.from));
        if !src.is_dir() {
            return Err(format!(
                "node `{}` needs `{}` (a box output of `{}`): {} is not a directory",
                node.name,
                i.from,
                plan.graph[p].name,
                src.display()
            ));
        }
        artifacts.insert(i.from.clone(), src);
    }
    Ok(NodeJob {
        plan: plan.only(idx),
        input,
        artifacts,
    })
}

/// `apply --final-output`: the run's final output built from the nodes' outputs under
/// `inputs`, as `apply` builds it (a fan-out's or several final steps' outputs merged as a
/// JSON array in declaration order), for an engine's last step.
pub fn final_from(plan: &Plan, inputs: &Path, max_output: u64) -> Result<Vec<u8>, String> {
    let mut outputs: Vec<Option<Vec<u8>>> = vec![None; plan.graph.node_count()];
    for idx in final_nodes(plan) {
        let name = &plan.graph[idx].name;
        outputs[idx.index()] = Some(read_output(inputs, name, max_output, "the final output")?);
    }
    final_output(plan, &outputs)
        .ok_or_else(|| "--final-output: a final node's output is missing".to_string())
}

/// The nodes the plan's final output is made of.
pub fn final_nodes(plan: &Plan) -> Vec<NodeIndex> {
    match &plan.output {
        crate::plan::Output::Node(n) => vec![*n],
        crate::plan::Output::Group(g) => plan.groups.get(*g).cloned().unwrap_or_default(),
        crate::plan::Output::Merge(ns) => ns.clone(),
    }
}

/// Makes `--outputs DIR`: created when missing; an existing one must be empty, so results
/// of another run are never mixed in.
pub fn outputs_dir(dir: &Path) -> Result<(), String> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "--outputs {}: not empty (give a new or empty directory)",
                    dir.display()
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!(
                    "--outputs {}: {}",
                    dir.display(),
                    crate::validate::io_reason(&e)
                )
            })
        }
        Err(e) => Err(format!(
            "--outputs {}: {}",
            dir.display(),
            crate::validate::io_reason(&e)
        )),
    }
}

/// A node runner's services across machines (`--service NAME=ADDR`, `--service-listen
/// ADDR`), applied to its VM's network by [`crate::network::services::ServiceNet::across_machines`].
#[derive(Debug, Clone)]
pub struct Across {
    /// The whole plan.
    pub full: Plan,
    /// The node run.
    pub node: NodeIndex,
    /// The sidecars it reaches: name → their runners' address.
    pub addrs: Vec<(String, std::net::IpAddr)>,
    /// Where a service publishes its ports for its dependents' runners.
    pub listen: Option<std::net::IpAddr>,
}

impl Across {
    /// Checks the addresses against the plan (a usage error names the service).
    pub fn check(&self) -> Result<(), String> {
        crate::network::services::ServiceNet::default().across_machines(
            &self.full,
            self.node,
            &self.addrs,
            self.listen,
        )
    }
}

/// Parses `--service NAME=ADDR` (an IP address: an engine gives its pods' IPs).
pub fn parse_service(arg: &str) -> Result<(String, std::net::IpAddr), String> {
    let (name, addr) = arg
        .split_once('=')
        .ok_or_else(|| format!("`{arg}`: expected NAME=ADDR"))?;
    let ip = addr
        .trim()
        .parse()
        .map_err(|_| format!("`{arg}`: `{addr}` is not an IP address"))?;
    Ok((name.to_string(), ip))
}

/// A node runner's progress: as `inner`, and a service's readiness marked by the file
/// `path` (an engine's readiness probe checks it).
pub struct ReadyFile {
    /// The progress shown.
    pub inner: std::sync::Arc<dyn crate::scheduler::progress::Progress>,
    /// `<outputs>/ready`.
    pub path: PathBuf,
}

impl crate::scheduler::progress::Progress for ReadyFile {
    fn event(
        &self,
        plan: &Plan,
        ev: &crate::scheduler::Event,
        record: Option<&crate::scheduler::NodeRecord>,
    ) {
        if matches!(ev, crate::scheduler::Event::Ready { .. }) {
            if let Err(e) = std::fs::write(&self.path, b"") {
                self.inner.notice(&format!(
                    "cannot mark the service ready at {}: {e}",
                    self.path.display()
                ));
            }
        }
        self.inner.event(plan, ev, record);
    }
    fn attempt_ended(
        &self,
        plan: &Plan,
        node: NodeIndex,
        attempt: u32,
        started: std::time::SystemTime,
        a: &crate::scheduler::Attempt,
    ) {
        self.inner.attempt_ended(plan, node, attempt, started, a);
    }
    fn finish(&self) {
        self.inner.finish();
    }
    fn notice(&self, msg: &str) {
        self.inner.notice(msg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::compile_for_test;

    const FAN: &str = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - {name: seed, run: {program: echo}}\n    - {name: a, run: {program: echo}}\n    - {name: b, run: {program: echo}}\n    - {name: c, run: {program: echo}}\n    - {name: last, run: {program: cat}}\n  stages:\n    - {type: box, name: seed}\n    - {type: fan_out, boxes: [c, a, b]}\n    - {type: box, name: last}\n";

    fn write(dir: &Path, node: &str, out: &[u8]) {
        std::fs::create_dir_all(node_dir(dir, node)).unwrap();
        std::fs::write(node_dir(dir, node).join("output"), out).unwrap();
    }

    #[test]
    fn a_fan_in_of_three_is_merged_in_declaration_order() {
        let plan = compile_for_test(FAN);
        let dir = tempfile::tempdir().unwrap();
        // Written in another order than declared: the merge follows the fan-out's order.
        write(dir.path(), "b", b"\"B\"\n");
        write(dir.path(), "a", b"2\n");
        write(dir.path(), "c", b"text\n");
        let idx = find_node(&plan, "last").unwrap();
        let job = prepare(&plan, idx, Some(dir.path()), None, 1 << 20).unwrap();
        assert_eq!(job.input.stdin.as_deref(), Some(&br#"["text",2,"B"]"#[..]));
        assert_eq!(job.input.file, job.input.stdin);
        assert_eq!(job.plan.graph.node_count(), 1);
        assert_eq!(job.plan.graph[NodeIndex::new(0)].name, "last");
        // The final output is the last node's, as `apply` prints it.
        write(dir.path(), "last", b"[1]\n");
        assert_eq!(final_from(&plan, dir.path(), 100).unwrap(), b"[1]\n");
    }

    #[test]
    fn missing_or_bad_inputs_name_the_node_and_the_file() {
        let plan = compile_for_test(FAN);
        let dir = tempfile::tempdir().unwrap();
        let last = find_node(&plan, "last").unwrap();
        let e = prepare(&plan, last, None, None, 100).unwrap_err();
        assert!(e.contains("--inputs") && e.contains("c, a, b"), "{e}");
        write(dir.path(), "c", b"1");
        write(dir.path(), "a", b"1");
        let e = prepare(&plan, last, Some(dir.path()), None, 100).unwrap_err();
        assert!(
            e.contains("node `last` needs the output of `b`") && e.contains("b/output"),
            "{e}"
        );
        write(dir.path(), "b", &[b'x'; 101]);
        let e = prepare(&plan, last, Some(dir.path()), None, 100).unwrap_err();
        assert!(e.contains("over the output cap"), "{e}");
        std::fs::remove_file(node_dir(dir.path(), "b").join("output")).unwrap();
        std::fs::create_dir(node_dir(dir.path(), "b").join("output")).unwrap();
        let e = prepare(&plan, last, Some(dir.path()), None, 100).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = find_node(&plan, "nope").unwrap_err();
        assert!(
            e.contains("seed, a, b, c, last") || e.contains("seed, c, a, b, last"),
            "{e}"
        );
        // A root node takes the run's input and needs no --inputs.
        let seed = find_node(&plan, "seed").unwrap();
        let job = prepare(&plan, seed, None, Some(b"{}"), 100).unwrap();
        assert_eq!(job.input.stdin.as_deref(), Some(&b"{}"[..]));
    }

    #[test]
    fn box_inputs_come_from_their_producers_directories() {
        let src = "kind: pipeline\nname: p\npipeline:\n  boxes:\n    - {name: make, run: {program: echo}, outputs: [{name: rep}]}\n    - {name: mid, run: {program: echo}}\n    - {name: use, run: {program: cat}, inputs: [{from: rep}]}\n  stages:\n    - {type: box, name: make}\n    - {type: box, name: mid}\n    - {type: box, name: use}\n";
        let plan = compile_for_test(src);
        let dir = tempfile::tempdir().unwrap();
        let used = find_node(&plan, "use").unwrap();
        assert_eq!(
            sources(&plan, used)
                .iter()
                .map(|s| plan.graph[*s].name.as_str())
                .collect::<Vec<_>>(),
            ["mid", "make"]
        );
        write(dir.path(), "mid", b"x");
        let e = prepare(&plan, used, Some(dir.path()), None, 100).unwrap_err();
        assert!(e.contains("`rep` (a box output of `make`)"), "{e}");
        std::fs::create_dir_all(node_dir(dir.path(), "make").join("artifacts/rep")).unwrap();
        let job = prepare(&plan, used, Some(dir.path()), None, 100).unwrap();
        assert_eq!(
            job.artifacts["rep"],
            node_dir(dir.path(), "make").join("artifacts/rep")
        );
    }

    #[test]
    fn outputs_must_be_new_or_empty() {
        let dir = tempfile::tempdir().unwrap();
        outputs_dir(&dir.path().join("new/out")).unwrap();
        outputs_dir(&dir.path().join("new/out")).unwrap();
        std::fs::write(dir.path().join("new/out/x"), b"").unwrap();
        let e = outputs_dir(&dir.path().join("new/out")).unwrap_err();
        assert!(e.contains("not empty"), "{e}");
    }

    #[test]
    fn services_across_machines_are_checked() {
        let src = "kind: workflow\nname: w\nworkflow:\n  steps:\n    - {name: web, mode: service, ports: [8080], run: {program: httpd}}\n    - {name: a, depends_on: [web], run: {program: wget}}\n";
        let plan = compile_for_test(src);
        let a = find_node(&plan, "a").unwrap();
        let web = find_node(&plan, "web").unwrap();
        let across = |node, addrs: &[(&str, &str)], listen: Option<&str>| Across {
            full: plan.clone(),
            node,
            addrs: addrs
                .iter()
                .map(|(n, ip)| (n.to_string(), ip.parse().unwrap()))
                .collect(),
            listen: listen.map(|l| l.parse().unwrap()),
        };
        let e = across(a, &[], None).check().unwrap_err();
        assert!(e.contains("--service web=ADDR"), "{e}");
        let e = across(a, &[("web", "10.1.2.3"), ("db", "10.1.2.4")], None)
            .check()
            .unwrap_err();
        assert!(e.contains("no service `db`"), "{e}");
        across(a, &[("web", "10.1.2.3")], None).check().unwrap();
        across(web, &[], Some("0.0.0.0")).check().unwrap();
        let e = across(a, &[("web", "10.1.2.3")], Some("0.0.0.0"))
            .check()
            .unwrap_err();
        assert!(e.contains("not a `mode: service` node"), "{e}");
        let mut net = crate::network::services::ServiceNet::default();
        net.across_machines(
            &plan,
            a,
            &[("web".into(), "10.1.2.3".parse().unwrap())],
            None,
        )
        .unwrap();
        let r = net.routes("a");
        assert_eq!(r[0].name, "web");
        assert_eq!(
            r[0].ports[0].to,
            voidbox_net::PortTarget::Tcp("10.1.2.3:8080".parse().unwrap())
        );
        assert!(parse_service("web=fe80::1").is_ok());
        assert!(parse_service("web=host.example")
            .unwrap_err()
            .contains("not an IP"));
        assert!(parse_service("web").unwrap_err().contains("NAME=ADDR"));
        // A sidecar upstream hands no output, so no --inputs is needed: a node whose only
        // upstream is one gets the run input.
        let job = prepare(&plan, a, None, None, 10).unwrap();
        assert_eq!(job.input.file, None);
        let job = prepare(&plan, a, None, Some(b"in"), 10).unwrap();
        assert_eq!(job.input.file.as_deref(), Some(&b"in"[..]));
    }
}
