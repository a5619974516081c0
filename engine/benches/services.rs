//! `mode: service`: how long a sidecar takes to become ready, how soon its dependent starts
//! after it, and what one HTTP request from a dependent's VM to the service's VM costs
//! (through both NATs and the run's Unix socket) against the same request to an `httpd` on
//! the dependent's own loopback (the floor: the guest's own process start and TCP).
//!
//! `cargo bench -p voidbox --bench services` (`VOIDBOX_BENCH_RUNS` runs of `voidbox apply`,
//! default 3; `VOIDBOX_BENCH_RR` requests per path and run, default 10). Needs `/dev/kvm`
//! and the guest image. The dependent times its requests itself (`/proc/uptime`, 10 ms
//! resolution, over the whole batch); each `wget` is a guest process start, which on a host
//! that interprets guest kernel code is most of a request.

mod common;

use std::process::Command;

use common::{env_usize, host_description};
use serde_json::Value;

fn spec(n: usize) -> String {
    // `batch URL`: N sequential requests, prints the mean in ms.
    let client = format!(
        "batch() {{ a=$(cut -d' ' -f1 /proc/uptime); i=0; while [ $i -lt {n} ]; do wget -q -O /dev/null \"$1\" || exit 9; i=$((i+1)); done; b=$(cut -d' ' -f1 /proc/uptime); echo $(( (${{b%.*}}${{b#*.}} - ${{a%.*}}${{a#*.}}) * 10 / {n} )); }}; \
         mkdir -p /tmp/www && echo ok > /tmp/www/index.html && httpd -p 8081 -h /tmp/www; \
         wget -q -O /dev/null http://127.0.0.1:8081/index.html; wget -q -O /dev/null http://web:8080/index.html; \
         echo \"{{\\\"service\\\": $(batch http://web:8080/index.html), \\\"loopback\\\": $(batch http://127.0.0.1:8081/index.html)}}\""
    );
    format!(
        "kind: workflow\nname: bench-services\nworkflow:\n  steps:\n    - name: web\n      mode: service\n      ports: [8080]\n      run: {{program: sh, args: [-c, 'mkdir -p /tmp/www && echo ok > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www']}}\n    - name: client\n      depends_on: [web]\n      run: {{program: sh, args: [-c, {}]}}\n",
        serde_json::to_string(&client).expect("json")
    )
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let runs = env_usize("VOIDBOX_BENCH_RUNS", 3).max(1);
    let n = env_usize("VOIDBOX_BENCH_RR", 10).max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("services.yaml");
    std::fs::write(&path, spec(n)).expect("spec");
    let (mut ready, mut lag, mut service, mut loopback) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let out = Command::new(env!("CARGO_BIN_EXE_voidbox"))
            .arg("apply")
            .arg(&path)
            .args(["--output", "json", "--max-parallel", "2", "--logs-dir"])
            .arg(dir.path().join("logs"))
            .output()
            .expect("voidbox apply");
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
        });
        assert_eq!(doc["status"], "succeeded", "{doc}");
        let node = |name: &str| {
            doc["nodes"]
                .as_array()
                .and_then(|ns| ns.iter().find(|x| x["name"] == name))
                .cloned()
                .expect("node")
        };
        let (web, client) = (node("web"), node("client"));
        let f = |v: &Value| v.as_f64().expect("number");
        ready.push(f(&web["service"]["ready_ms"]));
        lag.push(f(&client["started_ms"]) - f(&web["started_ms"]));
        service.push(f(&doc["output"]["service"]));
        loopback.push(f(&doc["output"]["loopback"]));
    }
    println!("host: {}", host_description());
    println!(
        "{runs} runs of `voidbox apply`; {n} requests per path and run (mean per request each run)"
    );
    println!("| measure | p50 | max |");
    println!("|---|---:|---:|");
    for (name, v) in [
        (
            "service command start → ready (port 8080 accepts), ms",
            &mut ready,
        ),
        ("service node start → dependent node start, ms", &mut lag),
        (
            "dependent VM → `web:8080` (service VM) per request, ms",
            &mut service,
        ),
        (
            "dependent VM → its own loopback `httpd` per request (floor), ms",
            &mut loopback,
        ),
    ] {
        let p50 = pct(v, 0.5);
        println!("| {name} | {p50:.0} | {:.0} |", pct(v, 1.0));
    }
}
