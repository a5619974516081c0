//! `voidbox-mock-llm`: a deterministic, offline stand-in for an LLM CLI (`llm.provider: mock`).
//!
//! Invoked like `claude -p PROMPT --output-format stream-json --verbose`, it reads the prompt,
//! the skills under `--skills-dir` (`<name>/SKILL.md`) and `/workspace/input.json`, prints
//! claude-code-style stream-json on stdout (a `system` init event, assistant text, `tool_use`
//! / `tool_result` pairs for every skill it "uses" and the files it reads and writes, and a
//! final `result` with token usage and `total_cost_usd`), and writes its result as JSON to
//! `--output-file` (default `/workspace/output.json`). Same inputs, same bytes out.
//!
//! Options: `-p/--print PROMPT` (else the prompt is read from stdin), `--output-format
//! stream-json|json|text`, `--skills-dir DIR`, `--input-file PATH`, `--output-file PATH`,
//! `--model NAME`; unknown flags are ignored (like a tolerant CLI). `VOIDBOX_MOCK_FAIL=1`
//! makes it report an error result and exit 1.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Bytes of any one input file that are read (the rest is ignored).
const MAX_READ: u64 = 1 << 20;
/// Input tokens charged per million, output tokens per million (USD).
const PRICE_IN: f64 = 3.0;
const PRICE_OUT: f64 = 15.0;

struct Args {
    prompt: Option<String>,
    format: String,
    skills_dir: PathBuf,
    input_file: PathBuf,
    output_file: PathBuf,
    model: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        prompt: None,
        format: "text".into(),
        skills_dir: std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".claude/skills"))
            .unwrap_or_else(|| PathBuf::from("/home/sandbox/.claude/skills")),
        input_file: PathBuf::from("/workspace/input.json"),
        output_file: PathBuf::from("/workspace/output.json"),
        model: "voidbox-mock-1".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut val = || inline.clone().or_else(|| it.next());
        match flag.as_str() {
            "-p" | "--print" => a.prompt = val(),
            "--output-format" => a.format = val().unwrap_or_default(),
            "--skills-dir" => a.skills_dir = val().map(PathBuf::from).unwrap_or(a.skills_dir),
            "--input-file" => a.input_file = val().map(PathBuf::from).unwrap_or(a.input_file),
            "--output-file" => a.output_file = val().map(PathBuf::from).unwrap_or(a.output_file),
            "--model" => a.model = val().unwrap_or(a.model),
            _ if !arg.starts_with('-') && a.prompt.is_none() => a.prompt = Some(arg),
            _ => {}
        }
    }
    a
}

/// JSON string literal.
fn js(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn read_capped(p: &Path) -> Option<String> {
    let f = std::fs::File::open(p).ok()?;
    let mut buf = Vec::new();
    f.take(MAX_READ).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// `(name, description, SKILL.md text)` of every skill, sorted by name.
fn skills(dir: &Path) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(text) = read_capped(&e.path().join("SKILL.md")) {
            let desc = text
                .lines()
                .find_map(|l| l.strip_prefix("description:"))
                .map(|d| d.trim().trim_matches('"').to_string())
                .unwrap_or_default();
            out.push((name, desc, text));
        }
    }
    out.sort();
    out
}

/// A rough, deterministic token count (≈4 bytes per token).
fn tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4)
}

struct Out {
    lines: Vec<String>,
    stream: bool,
}

impl Out {
    fn event(&mut self, json: String) {
        if self.stream {
            self.lines.push(json);
        }
    }
    fn tool(&mut self, n: &mut u32, name: &str, input: String, result: &str) {
        *n += 1;
        let id = format!("toolu_mock_{n:03}");
        self.event(format!(
            r#"{{"type":"assistant","message":{{"role":"assistant","content":[{{"type":"tool_use","id":{},"name":{},"input":{input}}}]}}}}"#,
            js(&id),
            js(name)
        ));
        self.event(format!(
            r#"{{"type":"user","message":{{"role":"user","content":[{{"type":"tool_result","tool_use_id":{},"content":{}}}]}}}}"#,
            js(&id),
            js(result)
        ));
    }
}

fn main() {
    let a = parse_args();
    let prompt = match a.prompt.clone() {
        Some(p) => p,
        None => {
            let mut s = String::new();
            let _ = std::io::stdin().take(MAX_READ).read_to_string(&mut s);
            s
        }
    };
    let fail = std::env::var("VOIDBOX_MOCK_FAIL").as_deref() == Ok("1");
    let session = format!("mock-{:016x}", fnv(prompt.as_bytes()));
    let skills = skills(&a.skills_dir);
    let input = read_capped(&a.input_file);
    let mut out = Out {
        lines: Vec::new(),
        stream: a.format == "stream-json",
    };
    let skill_names: Vec<String> = skills.iter().map(|s| js(&s.0)).collect();
    out.event(format!(
        r#"{{"type":"system","subtype":"init","session_id":{},"model":{},"cwd":"/workspace","tools":["Read","Write","Skill"],"skills":[{}]}}"#,
        js(&session),
        js(&a.model),
        skill_names.join(",")
    ));
    out.event(format!(
        r#"{{"type":"assistant","message":{{"role":"assistant","content":[{{"type":"text","text":{}}}]}}}}"#,
        js(&format!("I will work on: {}", first_line(&prompt)))
    ));
    let mut n = 0u32;
    let mut consumed = prompt.clone();
    for (name, desc, text) in &skills {
        out.tool(
            &mut n,
            "Skill",
            format!(r#"{{"skill":{}}}"#, js(name)),
            &format!("loaded skill {name}: {desc}"),
        );
        consumed.push_str(text);
    }
    if let Some(inp) = &input {
        out.tool(
            &mut n,
            "Read",
            format!(r#"{{"file_path":{}}}"#, js(&a.input_file.to_string_lossy())),
            &format!("{} bytes", inp.len()),
        );
        consumed.push_str(inp);
    }
    let summary = format!(
        "mock result for \"{}\": {} skill(s) [{}], input of {} bytes",
        first_line(&prompt),
        skills.len(),
        skills
            .iter()
            .map(|s| s.0.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        input.as_ref().map_or(0, |i| i.len())
    );
    let result_json = format!(
        r#"{{"summary":{},"prompt":{},"skills":[{}],"input_bytes":{},"model":{}}}"#,
        js(&summary),
        js(&prompt),
        skill_names.join(","),
        input.as_ref().map_or(0, |i| i.len()),
        js(&a.model)
    );
    let mut wrote = false;
    if !fail {
        out.tool(
            &mut n,
            "Write",
            format!(
                r#"{{"file_path":{}}}"#,
                js(&a.output_file.to_string_lossy())
            ),
            "ok",
        );
        wrote = std::fs::write(&a.output_file, format!("{result_json}\n")).is_ok();
    }
    out.event(format!(
        r#"{{"type":"assistant","message":{{"role":"assistant","content":[{{"type":"text","text":{}}}]}}}}"#,
        js(&summary)
    ));
    let (tin, tout) = (tokens(&consumed), tokens(&summary) + tokens(&result_json));
    let cost = (tin as f64 * PRICE_IN + tout as f64 * PRICE_OUT) / 1e6;
    let result = format!(
        r#"{{"type":"result","subtype":{},"is_error":{fail},"duration_ms":0,"num_turns":{},"result":{},"session_id":{},"total_cost_usd":{cost},"usage":{{"input_tokens":{tin},"output_tokens":{tout},"cache_read_input_tokens":0,"cache_creation_input_tokens":0}}}}"#,
        js(if fail {
            "error_during_execution"
        } else {
            "success"
        }),
        n + 1,
        js(&summary),
        js(&session)
    );
    out.event(result.clone());
    let mut stdout = std::io::stdout().lock();
    let body = match a.format.as_str() {
        "stream-json" => out.lines.join("\n") + "\n",
        "json" => result + "\n",
        _ => summary.clone() + "\n",
    };
    let _ = stdout.write_all(body.as_bytes());
    let _ = stdout.flush();
    if fail || (!wrote && !a.output_file.as_os_str().is_empty()) {
        if !fail {
            eprintln!("voidbox-mock-llm: cannot write {}", a.output_file.display());
        }
        std::process::exit(1);
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").chars().take(120).collect()
}

/// FNV-1a, for a stable session id.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}
