//! Host-side tests of `voidbox shell`: arguments, specs, settings. The sessions themselves
//! run on real VMs in `tests/tests/shell_cli.rs`.

use clap::Parser;

use super::*;
use crate::plan::compile_for_test;

#[derive(Debug, clap::Parser)]
struct T {
    #[command(flatten)]
    a: ShellArgs,
}

fn args(argv: &[&str]) -> ShellArgs {
    T::try_parse_from(std::iter::once("shell").chain(argv.iter().copied()))
        .unwrap()
        .a
}

#[test]
fn flags_parse_with_defaults() {
    let a = args(&[]);
    assert_eq!(a.program, None);
    assert_eq!((a.spec, a.memory_mb, a.vcpus), (None, None, None));
    let a = args(&[
        "box.yaml",
        "--program",
        "/usr/bin/env",
        "--arg",
        "-i",
        "--memory-mb",
        "128",
        "--vcpus",
        "2",
        "-e",
        "A=1",
        "--mount",
        ".:/w:rw",
        "--allow-host-port",
        "8080",
    ]);
    assert_eq!(a.spec.as_deref(), Some(std::path::Path::new("box.yaml")));
    assert_eq!(
        (a.program.as_deref(), a.args.as_slice()),
        (Some("/usr/bin/env"), &["-i".to_string()][..])
    );
    assert_eq!((a.memory_mb, a.vcpus), (Some(128), Some(2)));
    assert_eq!(a.mounts, [".:/w:rw"]);
    assert_eq!(
        a.network.policy().unwrap().unwrap().allow_host_ports,
        [8080]
    );
    assert!(T::try_parse_from(["shell", "--memory-mb", "63"]).is_err());
    assert!(T::try_parse_from(["shell", "--timeout", "0"]).is_err());
}

#[test]
fn env_pairs() {
    let ok = parse_env(&["A=1".into(), "B=x=y".into(), "C=".into()]).unwrap();
    assert_eq!(
        ok,
        [
            ("A".into(), "1".into()),
            ("B".into(), "x=y".into()),
            ("C".into(), String::new())
        ]
    );
    assert!(parse_env(&["=1".into()])
        .unwrap_err()
        .contains("NAME=VALUE"));
    assert!(parse_env(&["A".into()]).unwrap_err().contains("`A`"));
}

const SANDBOX: &str = r#"
api_version: v1
kind: sandbox
name: dev
sandbox:
  memory_mb: 512
  vcpus: 2
  network: true
  env: {EDITOR: vi}
  allowed_commands: [python3]
"#;

#[test]
fn a_sandbox_without_run_is_opened_with_its_settings() {
    let plan = compile_for_test(SANDBOX);
    let s = Setup::new(&args(&["-e", "A=1", "-e", "EDITOR=nano"]), Some(&plan)).unwrap();
    let node = s.node.as_ref().unwrap();
    assert_eq!((node.sandbox.memory_mb, node.sandbox.vcpus), (512, 2));
    // The spec's variables first, the flags' after (the later one wins in the guest).
    assert_eq!(
        s.env,
        [
            ("EDITOR".into(), "vi".into()),
            ("A".into(), "1".into()),
            ("EDITOR".into(), "nano".into())
        ]
    );
    assert!(s.network.as_ref().unwrap().public_egress);
    assert_eq!(s.timeout.secs, crate::limits::MAX_TIMEOUT_SECS);
    // Network flags replace the spec's policy.
    let s = Setup::new(
        &args(&["--allow-host-port", "9", "--timeout", "60"]),
        Some(&plan),
    )
    .unwrap();
    assert_eq!(s.network.unwrap().allow_host_ports, [9]);
    assert_eq!(s.timeout.secs, 60);
    // Without a spec: no network unless asked for.
    let s = Setup::new(&args(&[]), None).unwrap();
    assert!(s.node.is_none() && s.network.is_none() && s.env.is_empty());
}

#[test]
fn specs_that_run_something_are_refused() {
    let run = SANDBOX.replace("name: dev", "name: dev\nrun: {program: echo}");
    let e = interactive_node(&compile_for_test(&run)).unwrap_err();
    assert!(
        e.contains("runs a command") && e.contains("voidbox apply"),
        "{e}"
    );
    let agent = |mode: &str| {
        format!("api_version: v1\nkind: agent\nname: a\nagent:\n  prompt: hi\n  mode: {mode}\n")
    };
    let e = interactive_node(&compile_for_test(&agent("task"))).unwrap_err();
    assert!(e.contains("mode: interactive"), "{e}");
    let node = interactive_node(&compile_for_test(&agent("interactive"))).unwrap();
    assert_eq!(node.name, "a");
    let pipeline = r#"
api_version: v1
kind: pipeline
name: p
pipeline:
  boxes:
    - {name: a, run: {program: echo}}
    - {name: b, run: {program: echo}}
  stages: [{type: box, name: a}, {type: box, name: b}]
"#;
    let e = interactive_node(&compile_for_test(pipeline)).unwrap_err();
    assert!(e.contains("is a pipeline"), "{e}");
    let mock = SANDBOX.replace("memory_mb: 512", "memory_mb: 512\n  mode: mock");
    assert!(interactive_node(&compile_for_test(&mock))
        .unwrap_err()
        .contains("mock"));
}

#[test]
fn mounts_become_shares_and_missing_rw_dirs_are_created() {
    let dir = tempfile::tempdir().unwrap();
    let host = format!("{}:/workspace/w:rw", dir.path().display());
    let missing = dir.path().join("new");
    let new = format!("{}:/workspace/n:rw", missing.display());
    let s = Setup::new(&args(&["--mount", &host, "--mount", &new]), None).unwrap();
    assert!(missing.is_dir(), "a missing rw directory is created");
    let shares = crate::mount_flag::shares(&s.mounts);
    assert_eq!(shares.len(), 2);
    assert_eq!(shares[1].host, missing);
    assert_eq!(
        (shares[0].guest.as_str(), shares[0].read_only),
        ("/workspace/w", false)
    );
    // Bad mounts are usage errors, found before a VM starts.
    let e = Setup::new(&args(&["--mount", "nowhere-7f3a:/w"]), None).unwrap_err();
    assert!(e.contains("nowhere-7f3a"), "{e}");
    let e = Setup::new(&args(&["--mount", &host, "--mount", &host]), None).unwrap_err();
    assert!(e.contains("overlap"), "{e}");
    let e = Setup::new(
        &args(&["--mount", &format!("{}:/tmp", dir.path().display())]),
        None,
    )
    .unwrap_err();
    assert!(e.contains("/tmp"), "{e}");
    // The spec's mounts come first, the flags' after.
    let spec = SANDBOX.replace(
        "allowed_commands: [python3]",
        &format!(
            "allowed_commands: [python3]\n  mounts: [{{host: {}, guest: /workspace/s}}]",
            dir.path().display()
        ),
    );
    let s = Setup::new(&args(&["--mount", &host]), Some(&compile_for_test(&spec))).unwrap();
    let guests: Vec<_> = s.mounts.iter().map(|m| m.guest.as_str()).collect();
    assert_eq!(guests, ["/workspace/s", "/workspace/w"]);
    assert!(s.mounts[0].read_only);
}

const AGENT: &str = r#"
api_version: v1
kind: agent
name: helper
sandbox:
  memory_mb: 2048
  env: {EDITOR: vi}
llm: {provider: claude, base_url: 'http://127.0.0.1:9/', api_key_env: VBX_SHELL_KEY, model: m1}
agent:
  prompt: Say hi
  mode: interactive
"#;

fn agent_of(
    spec: &str,
    program_flags: bool,
    key: Option<&str>,
) -> Result<Option<agent::Agent>, Failure> {
    let plan = compile_for_test(spec);
    let node = interactive_node(&plan).unwrap();
    let key = key.map(String::from);
    agent::Agent::of(&plan, Some(&node), program_flags, &move |k| {
        (k == "VBX_SHELL_KEY").then(|| key.clone()).flatten()
    })
}

#[test]
fn an_interactive_agent_resolves_its_endpoint_before_anything_starts() {
    let a = agent_of(AGENT, false, Some("sk-test-0123456789abcdef"))
        .unwrap()
        .unwrap();
    assert_eq!(a.endpoint.runtime, crate::providers::Runtime::ClaudeCode);
    assert_eq!(a.endpoint.model.as_deref(), Some("m1"));
    assert_eq!(a.action.prompt, "Say hi");
    // A missing key is an environment failure (exit 3), naming the variable.
    let f = agent_of(AGENT, false, None).unwrap_err();
    assert_eq!(f.code, 3, "{}", f.message);
    assert!(f.message.contains("VBX_SHELL_KEY"), "{}", f.message);
    // `--program`/`--arg` with an agent are ambiguous: usage errors.
    let f = agent_of(AGENT, true, Some("sk-test-0123456789abcdef")).unwrap_err();
    assert_eq!(f.code, 2);
    assert!(f.message.contains("--program"), "{}", f.message);
    // The mock runtime has no interactive mode: a usage error, even without a key.
    let mock = AGENT.replace(
        "llm: {provider: claude, base_url: 'http://127.0.0.1:9/', api_key_env: VBX_SHELL_KEY, model: m1}",
        "llm: {provider: mock}",
    );
    let f = agent_of(&mock, false, None).unwrap_err();
    assert_eq!(f.code, 2);
    assert!(f.message.contains("no interactive mode"), "{}", f.message);
    // A sandbox is not an agent.
    assert!(agent_of(SANDBOX, true, None).unwrap().is_none());
}

#[test]
fn the_runtimes_variables_win_and_the_gateway_summary_reads_well() {
    let env = agent::merge_env(
        vec![
            ("HOME".into(), "/home/sandbox".into()),
            ("ANTHROPIC_API_KEY".into(), "vbx-t".into()),
        ],
        vec![
            ("EDITOR".into(), "vi".into()),
            ("ANTHROPIC_API_KEY".into(), "from-flags".into()),
            ("HOME".into(), "/root".into()),
        ],
    );
    assert_eq!(
        env,
        [
            ("HOME".to_string(), "/home/sandbox".to_string()),
            ("ANTHROPIC_API_KEY".into(), "vbx-t".into()),
            ("EDITOR".into(), "vi".into())
        ]
    );
    let s = crate::gateway::GatewayStats {
        requests: 1,
        input_tokens: 20,
        output_tokens: 5,
        ..Default::default()
    };
    assert_eq!(
        agent::summary(&s),
        "gateway: 1 request, 20 input tokens (0 cached), 5 output tokens"
    );
    let s = crate::gateway::GatewayStats {
        requests: 3,
        refused: 2,
        upstream_errors: 1,
        input_tokens: 1,
        cached_tokens: 1,
        output_tokens: 1,
    };
    assert_eq!(
        agent::summary(&s),
        "gateway: 3 requests, 1 input token (1 cached), 1 output token, 2 refused, 1 upstream error"
    );
}

#[test]
fn an_agents_vm_gets_the_runtimes_disk_the_gateway_and_its_runtime() {
    let base = GuestImage {
        hash: "h".into(),
        vmlinux: "k".into(),
        system_disk: "d".into(),
        system_disk_sha256: "s".into(),
        agent: "a".into(),
        initramfs: None,
        profile: crate::image::Profile::Compat,
        cmdline: String::new(),
    };
    let disk = ImageDisk {
        path: "/cache/runtimes.erofs".into(),
        digest: "sha256:ab".into(),
        role: crate::sandbox::disks::DiskRole::Runtimes {
            mount: crate::runtimes::GUEST_MOUNT.into(),
        },
    };
    let vm = |spec: &str| {
        let plan = compile_for_test(spec);
        let a = args(&["-e", "A=1"]);
        let setup = Setup::new(&a, Some(&plan)).unwrap();
        let agent = AgentVm {
            disk: disk.clone(),
            gateway_port: Some(4321),
        };
        let node = node_vm(&setup, Some(&plan), &base).unwrap();
        vm_config(
            &a,
            &setup,
            node.as_ref(),
            base.clone(),
            crate::runtimes::CLAUDE_BIN,
            Some(agent),
        )
        .unwrap()
    };
    let (cfg, program) = vm(AGENT);
    assert_eq!(cfg.disks.images, std::slice::from_ref(&disk));
    assert_eq!(cfg.memory_mb, 2048);
    // No `network` in the spec: the NAT reaches the gateway and nothing else.
    let net = cfg.network.as_ref().unwrap();
    assert_eq!(net.policy.allow_host_ports, [4321]);
    assert!(!net.policy.public_egress);
    // The guest may start the runtime (and nothing else the spec did not allow).
    let policy = cfg.policy.as_ref().unwrap();
    assert_eq!(
        policy.allowlist.as_deref(),
        Some(&[crate::runtimes::CLAUDE_BIN.to_string()][..])
    );
    assert!(policy.validate().is_ok());
    assert_eq!(
        program.env,
        [
            ("EDITOR".to_string(), "vi".to_string()),
            ("A".into(), "1".into())
        ]
    );
    // A spec with network keeps it, plus the gateway's port.
    let (cfg, _) = vm(&AGENT.replace(
        "env: {EDITOR: vi}",
        "env: {EDITOR: vi}\n  network: true\n  allowed_commands: [git]",
    ));
    let net = cfg.network.as_ref().unwrap();
    assert_eq!(net.policy.allow_host_ports, [4321]);
    assert!(net.policy.public_egress);
    assert_eq!(
        cfg.policy.unwrap().allowlist.unwrap(),
        [crate::runtimes::CLAUDE_BIN.to_string(), "git".into()]
    );
}

#[test]
fn an_agent_starts_in_the_flag_s_dir_else_the_image_s_working_dir_else_workspace() {
    use crate::node::oci_images::NodeVm;
    let image = NodeVm {
        workdir: Some("/srv/project".into()),
        ..NodeVm::default()
    };
    let bare = NodeVm::default();
    assert_eq!(agent_workdir(Some("/tmp/w"), Some(&image)), "/tmp/w");
    assert_eq!(agent_workdir(None, Some(&image)), "/srv/project");
    assert_eq!(
        agent_workdir(None, Some(&bare)),
        crate::node::launch::WORKDIR
    );
    assert_eq!(agent_workdir(None, None), crate::node::launch::WORKDIR);
}
