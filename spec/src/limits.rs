//! The one set of resource and time limits: the spec schema, `validate`, `apply`,
//! `voidbox run` and `voidbox snapshot create` all use these constants, and the VMM and the
//! guest agent enforce the same numbers: the memory and vCPU limits are defined here and
//! checked against `voidbox-vmm`'s at compile time (in the engine, which links both); the
//! timeouts are `voidbox-protocol`'s, which the guest agent shares.

use std::fmt;

/// Smallest guest memory, in MiB.
pub const MIN_MEMORY_MB: u64 = 64;
/// Largest guest memory, in MiB.
pub const MAX_MEMORY_MB: u64 = 65_536;
/// Fewest vCPUs.
pub const MIN_VCPUS: u32 = 1;
/// Most vCPUs.
pub const MAX_VCPUS: u32 = 32;

/// Guest memory of `voidbox run`, `voidbox snapshot create` and a spec's command nodes
/// without `memory_mb` / `--memory-mb`, in MiB: one default, so the snapshot `create` makes
/// is the one `run` and a minimal spec restore. Chosen by measurement (BENCHMARKS.md,
/// "Default guest memory"): the guest agent and busybox need ≈20 MiB, and a cold boot or a
/// snapshot grows with the memory the guest kernel initialises (on an interpreting KVM
/// 1024 MiB cold-boots ≈12 s slower than 256 MiB).
pub const DEFAULT_RUN_MEMORY_MB: u32 = 256;
/// Guest memory of a spec's agent nodes without `memory_mb`, in MiB: a real runtime (Claude
/// Code, Codex: Node.js and the model's context) needs more than a command.
pub const DEFAULT_AGENT_MEMORY_MB: u64 = 1024;

/// Time limit of a node (or `voidbox run` command) without `timeout_secs` / `--timeout`.
pub const DEFAULT_NODE_TIMEOUT_SECS: u64 = voidbox_protocol::DEFAULT_EXEC_TIMEOUT_SECS;
/// Largest `timeout_secs` (node or pipeline) and `--timeout`; the guest agent's own ceiling.
pub const MAX_TIMEOUT_SECS: u64 = voidbox_protocol::MAX_EXEC_TIMEOUT_SECS;

// The defaults lie within the ranges.
const _: () = assert!(
    DEFAULT_AGENT_MEMORY_MB >= MIN_MEMORY_MB
        && DEFAULT_AGENT_MEMORY_MB <= MAX_MEMORY_MB
        && DEFAULT_RUN_MEMORY_MB as u64 >= MIN_MEMORY_MB
        && DEFAULT_RUN_MEMORY_MB as u64 <= MAX_MEMORY_MB
        && DEFAULT_NODE_TIMEOUT_SECS <= MAX_TIMEOUT_SECS
);

/// The `clap` value range of `--memory-mb`.
#[cfg(feature = "cli")]
pub fn memory_mb_arg() -> clap::builder::RangedU64ValueParser<u32> {
    clap::builder::RangedU64ValueParser::<u32>::new().range(MIN_MEMORY_MB..=MAX_MEMORY_MB)
}

/// The `clap` value range of `--vcpus`.
#[cfg(feature = "cli")]
pub fn vcpus_arg() -> clap::builder::RangedU64ValueParser<u8> {
    clap::builder::RangedU64ValueParser::<u8>::new()
        .range(u64::from(MIN_VCPUS)..=u64::from(MAX_VCPUS))
}

/// The `clap` value range of a timeout in seconds.
#[cfg(feature = "cli")]
pub fn timeout_arg() -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::<u64>::new().range(1..=MAX_TIMEOUT_SECS)
}

/// Which limit bounds a run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutLimit {
    /// The node's own `timeout_secs`.
    Node,
    /// A node without `timeout_secs`: [`DEFAULT_NODE_TIMEOUT_SECS`].
    DefaultNode,
    /// The spec's top-level `timeout_secs` (the whole run).
    Pipeline,
    /// `voidbox run --timeout`.
    Flag,
    /// A `mode: service` node: no timeout of its own, bounded only by the longest a command
    /// may run ([`MAX_TIMEOUT_SECS`]) and the run's `timeout_secs`.
    Service,
}

/// A time limit and where it comes from, as reports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeout {
    /// Which limit.
    pub limit: TimeoutLimit,
    /// Its value in seconds.
    pub secs: u64,
}

impl Timeout {
    /// A node's effective timeout: its own `timeout_secs`, else the default.
    pub fn node(own: Option<u64>) -> Timeout {
        match own {
            Some(secs) => Timeout {
                limit: TimeoutLimit::Node,
                secs,
            },
            None => Timeout {
                limit: TimeoutLimit::DefaultNode,
                secs: DEFAULT_NODE_TIMEOUT_SECS,
            },
        }
    }

    /// `voidbox run`'s timeout: `--timeout`, else the default.
    pub fn flag(own: Option<u64>) -> Timeout {
        match own {
            Some(secs) => Timeout {
                limit: TimeoutLimit::Flag,
                secs,
            },
            None => Timeout::node(None),
        }
    }

    /// A service node's bound ([`TimeoutLimit::Service`]).
    pub fn service() -> Timeout {
        Timeout {
            limit: TimeoutLimit::Service,
            secs: MAX_TIMEOUT_SECS,
        }
    }

    /// The spec's run-wide `timeout_secs`.
    pub fn pipeline(secs: u64) -> Timeout {
        Timeout {
            limit: TimeoutLimit::Pipeline,
            secs,
        }
    }

    /// The limit's name in reports (`node timeout_secs`, `default node timeout`, …).
    pub fn label(&self) -> &'static str {
        match self.limit {
            TimeoutLimit::Node => "node timeout_secs",
            TimeoutLimit::DefaultNode => "default node timeout",
            TimeoutLimit::Pipeline => "pipeline timeout_secs",
            TimeoutLimit::Flag => "--timeout",
            TimeoutLimit::Service => "service limit",
        }
    }

    /// `{"limit": "node timeout_secs", "secs": 30}` (the JSON report's form).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "limit": self.label(), "secs": self.secs })
    }
}

impl fmt::Display for Timeout {
    /// `node timeout_secs=30 s`, `default node timeout 1800 s`, `--timeout=30 s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.limit {
            TimeoutLimit::DefaultNode | TimeoutLimit::Service => {
                write!(f, "{} {} s", self.label(), self.secs)
            }
            _ => write!(f, "{}={} s", self.label(), self.secs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_name_their_limit() {
        assert_eq!(
            Timeout::node(Some(30)).to_string(),
            "node timeout_secs=30 s"
        );
        assert_eq!(
            Timeout::node(None).to_string(),
            format!("default node timeout {DEFAULT_NODE_TIMEOUT_SECS} s")
        );
        assert_eq!(
            Timeout::pipeline(60).to_string(),
            "pipeline timeout_secs=60 s"
        );
        assert_eq!(Timeout::flag(Some(5)).to_string(), "--timeout=5 s");
        assert_eq!(Timeout::flag(None), Timeout::node(None));
        assert_eq!(
            Timeout::node(Some(30)).to_json(),
            serde_json::json!({"limit": "node timeout_secs", "secs": 30})
        );
    }

    #[test]
    fn limits_agree_with_the_vmm_and_guest() {
        assert_eq!((MIN_MEMORY_MB, MAX_MEMORY_MB), (64, 65536));
        assert_eq!((MIN_VCPUS, MAX_VCPUS), (1, 32));
        assert_eq!(
            (DEFAULT_NODE_TIMEOUT_SECS, MAX_TIMEOUT_SECS),
            (1800, 86_400)
        );
    }
}
