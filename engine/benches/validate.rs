//! `cargo bench -p voidbox --bench validate`: `voidbox validate` over 1,000 generated specs
//! (mixed valid and invalid). Prints a table: wall time per spec through the CLI (one process
//! for the whole directory), peak RSS of that process, and the in-process cost per spec.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::resource::{getrusage, UsageWho};

const SPECS: usize = 1000;
const RUNS: usize = 7;

fn spec(i: usize) -> String {
    match i % 10 {
        0 => format!("kind: sandbox\nname: bad{i}\nsandbox: {{memory_mb: 16, vcpu: 2}}\n"),
        1 => format!("kind: workflow\nname: cyc{i}\nworkflow:\n  steps:\n    - {{name: a, run: {{program: x}}, depends_on: [b]}}\n    - {{name: b, run: {{program: x}}, depends_on: [a]}}\n"),
        2 => format!("kind: pipeline\nname: refs{i}\npipeline:\n  boxes:\n    - {{name: a, run: {{program: echo}}, timeout_sec: 3}}\n  stages:\n    - {{type: fan_out, boxes: [a]}}\n    - {{type: box, name: nope}}\n"),
        3 | 4 => format!(
            "api_version: v1\nkind: workflow\nname: wf{i}\nworkflow:\n  steps:\n    - {{name: fetch, run: {{program: sh, args: [-c, 'seq 10']}}}}\n    - {{name: count, depends_on: [fetch], stdin_from: fetch, run: {{program: wc, args: [-l]}}}}\n    - {{name: sum, depends_on: [fetch], run: {{program: awk, args: ['{{s+=$1}} END {{print s}}']}}}}\n    - {{name: report, depends_on: [count, sum], run: {{program: cat}}}}\n  output_step: report\n"
        ),
        5 => format!("kind: agent\nname: ag{i}\nllm: {{provider: mock}}\nagent:\n  prompt: 'Summarise the input.'\n  skills: ['cli:awk', 'mcp:github', 'remote:obra/superpowers/brainstorming']\n  timeout_secs: 60\n"),
        _ => format!(
            "# yaml-language-server: $schema=../schemas/voidbox.schema.json\napi_version: v1\nkind: pipeline\nname: p{i}\nsandbox:\n  memory_mb: 256\n  vcpus: 1\n  env: {{LOG_LEVEL: info}}\npipeline:\n  boxes:\n    - name: seed\n      run: {{program: sh, args: [-c, 'echo 1']}}\n    - name: a\n      run: {{program: cat}}\n      timeout_secs: 30\n    - name: b\n      prompt: 'Analyse.'\n      retries: 2\n    - name: c\n      run: {{program: wc, args: [-c]}}\n    - name: collect\n      run: {{program: cat}}\n  stages:\n    - {{type: box, name: seed}}\n    - {{type: fan_out, boxes: [a, b, c]}}\n    - {{type: box, name: collect}}\n"
        ),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let bin = env!("CARGO_BIN_EXE_voidbox");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut texts = Vec::with_capacity(SPECS);
    for i in 0..SPECS {
        let text = spec(i);
        std::fs::write(dir.path().join(format!("spec{i:04}.yaml")), &text).expect("write");
        texts.push(text);
    }
    let invalid = (0..SPECS).filter(|i| i % 10 < 3).count();

    // Through the CLI: one process validating the whole directory.
    let mut walls = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        let out = Command::new(bin)
            .args(["validate", "--format", "json", "."])
            .current_dir(dir.path())
            .output()
            .expect("run voidbox");
        walls.push(start.elapsed());
        assert_eq!(
            out.status.code(),
            Some(1),
            "mixed corpus must be reported invalid"
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(doc["summary"]["invalid"], invalid);
    }
    let peak_rss_kib = getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| u.max_rss())
        .unwrap_or(0);

    // In process: load + schema + semantic checks, no process start-up.
    let mut per_spec = Vec::new();
    for _ in 0..RUNS {
        let start = Instant::now();
        for (i, t) in texts.iter().enumerate() {
            let v = voidbox::validate::validate_source(
                &format!("spec{i}.yaml"),
                t.clone(),
                Path::new("."),
            );
            std::hint::black_box(&v);
        }
        per_spec.push(start.elapsed() / SPECS as u32);
    }

    let wall = median(walls.clone());
    println!(
        "voidbox validate: {SPECS} generated specs ({invalid} invalid), median of {RUNS} runs"
    );
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| CLI wall time, {SPECS} specs (one process) | {:.1} ms |",
        wall.as_secs_f64() * 1e3
    );
    println!(
        "| CLI time per spec | {:.3} ms |",
        wall.as_secs_f64() * 1e3 / SPECS as f64
    );
    println!(
        "| CLI fastest run per spec | {:.3} ms |",
        walls
            .iter()
            .min()
            .map_or(0.0, |d| d.as_secs_f64() * 1e3 / SPECS as f64)
    );
    println!("| CLI peak RSS | {:.1} MiB |", peak_rss_kib as f64 / 1024.0);
    println!(
        "| in-process time per spec (library) | {:.3} ms |",
        median(per_spec).as_secs_f64() * 1e3
    );
    println!("| target | ≤ 2 ms per spec; 1,000 specs < 2 s |");
}
