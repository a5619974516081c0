//! The run's metrics: OpenTelemetry instruments recorded as nodes finish.
//!
//! Names follow the OpenTelemetry conventions: durations in seconds, `gen_ai.client.token.usage`
//! from the GenAI semantic conventions, everything else under `voidbox.`.

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};
use opentelemetry::KeyValue;

use crate::scheduler::{Attempt, NodeRecord};

/// Bucket boundaries (seconds) for durations from a snapshot restore to a long agent run.
const SECONDS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
/// Bucket boundaries for token counts.
const TOKENS: [f64; 12] = [
    16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// The instruments.
pub struct Instruments {
    run_duration: Histogram<f64>,
    node_duration: Histogram<f64>,
    queue_wait: Histogram<f64>,
    attempts: Counter<u64>,
    vm_start: Histogram<f64>,
    tokens: Histogram<u64>,
    cost: Counter<f64>,
    denials: Counter<u64>,
    guest_cpu: Counter<f64>,
    guest_memory: Gauge<u64>,
}

impl Instruments {
    /// Creates the instruments on `meter`.
    pub fn new(meter: &Meter) -> Instruments {
        let secs = |name: &'static str, what: &'static str| {
            meter
                .f64_histogram(name)
                .with_unit("s")
                .with_description(what)
                .with_boundaries(SECONDS.to_vec())
                .build()
        };
        Instruments {
            run_duration: secs("voidbox.run.duration", "Wall time of a run"),
            node_duration: secs(
                "voidbox.node.duration",
                "A node's first start to its last end (all attempts)",
            ),
            queue_wait: secs(
                "voidbox.node.queue_wait",
                "From a node's inputs being ready to its start (slots, memory)",
            ),
            attempts: meter
                .u64_counter("voidbox.node.attempts")
                .with_description("Attempts made, by status")
                .build(),
            vm_start: secs(
                "voidbox.vm.start.duration",
                "A node VM's start: snapshot restore or cold boot",
            ),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens an agent attempt used, by type")
                .with_boundaries(TOKENS.to_vec())
                .build(),
            cost: meter
                .f64_counter("voidbox.llm.cost")
                .with_unit("USD")
                .with_description("What the agent runtimes reported their calls cost")
                .build(),
            denials: meter
                .u64_counter("voidbox.network.denials")
                .with_description("Guest connections and lookups the NAT denied, by reason")
                .build(),
            guest_cpu: meter
                .f64_counter("voidbox.guest.cpu.time")
                .with_unit("s")
                .with_description("Guest CPU time while the node's command ran (guest telemetry)")
                .build(),
            guest_memory: meter
                .u64_gauge("voidbox.guest.memory.usage")
                .with_unit("By")
                .with_description(
                    "The most guest memory in use while the node's command ran (guest telemetry)",
                )
                .build(),
        }
    }

    /// One attempt ended.
    pub fn attempt(&self, node: &[KeyValue], a: &Attempt) {
        let mut attrs = node.to_vec();
        attrs.push(KeyValue::new("voidbox.node.status", a.status.as_str()));
        self.attempts.add(1, &attrs);
        if let (Some(boot), Some(restored)) = (a.boot, a.restored) {
            let mut attrs = node.to_vec();
            attrs.push(KeyValue::new(
                "voidbox.vm.start.kind",
                if restored { "restore" } else { "cold_boot" },
            ));
            self.vm_start.record(boot.as_secs_f64(), &attrs);
        }
        if let Some(ag) = &a.agent {
            let mut attrs = node.to_vec();
            attrs.push(KeyValue::new("gen_ai.provider.name", ag.provider.clone()));
            if let Some(m) = &ag.model {
                attrs.push(KeyValue::new("gen_ai.request.model", m.clone()));
            }
            self.cost.add(ag.cost_usd.max(0.0), &attrs);
            for (kind, n) in [("input", ag.input_tokens), ("output", ag.output_tokens)] {
                let mut attrs = attrs.clone();
                attrs.push(KeyValue::new("gen_ai.operation.name", "invoke_agent"));
                attrs.push(KeyValue::new("gen_ai.token.type", kind));
                self.tokens.record(n, &attrs);
            }
        }
        for d in &a.net_denials {
            let mut attrs = node.to_vec();
            attrs.push(KeyValue::new("voidbox.network.reason", d.reason.clone()));
            self.denials.add(d.count, &attrs);
        }
        if let Some(g) = &a.guest {
            for (mode, ms) in [("user", g.cpu_user_ms), ("system", g.cpu_system_ms)] {
                let mut attrs = node.to_vec();
                attrs.push(KeyValue::new("cpu.mode", mode));
                self.guest_cpu.add(ms as f64 / 1000.0, &attrs);
            }
            self.guest_memory
                .record(g.mem_peak_kb.saturating_mul(1024), node);
        }
    }

    /// A node reached its final status.
    pub fn node(&self, node: &[KeyValue], r: &NodeRecord) {
        let mut attrs = node.to_vec();
        attrs.push(KeyValue::new("voidbox.node.status", r.status.as_str()));
        if let Some(d) = r.duration {
            self.node_duration.record(d.as_secs_f64(), &attrs);
        }
        if let Some(w) = r.queue_wait {
            self.queue_wait.record(w.as_secs_f64(), node);
        }
    }

    /// The run ended.
    pub fn run(&self, attrs: &[KeyValue], secs: f64) {
        self.run_duration.record(secs, attrs);
    }
}
