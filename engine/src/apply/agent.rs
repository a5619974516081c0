//! Agent boxes: which LLM runtimes can run here, the skills copied into the guest, the exec
//! request for the runtime, and the parser of its claude-code-style stream-json output.

use std::path::Path;

use serde_json::Value;
use voidbox_protocol::ExecRequest;

use super::scheduler::AgentStats;
use crate::plan::{Action, AgentAction, Plan};
use crate::spec::model::{Provider, SkillEntry};

/// The mock runtime's path in the guest image.
pub const MOCK_RUNTIME: &str = "/opt/voidbox/runtimes/mock/bin/voidbox-mock-llm";
/// Where skills go in the guest (`<dir>/<name>/SKILL.md`, design §3): the kit's `skills/`
/// under [`crate::kit::GUEST_KIT_ROOT`].
pub const GUEST_SKILLS_DIR: &str = "/home/sandbox/.claude/skills";
/// Default guest file the runtime writes its result to.
pub const DEFAULT_OUTPUT_FILE: &str = "/workspace/output.json";
/// Longest stream-json line parsed at least (longer ones are skipped); a parser for a larger
/// output cap allows a `result` line of twice the cap (JSON escaping).
const MAX_LINE: usize = 1 << 20;
/// Tool calls kept in the report.
const MAX_TOOL_CALLS: usize = 256;

/// Plan-time check: every agent node's provider can run on this installation. Only `mock`
/// ships in the guest image; others are refused, never substituted.
pub fn check_providers(plan: &Plan) -> Result<(), String> {
    for n in plan.graph.node_weights() {
        if let Action::Agent(a) = &n.action {
            if a.llm.credential_proxy {
                return Err(format!(
                    "agent box `{}` sets `llm.credential_proxy: true` (host-side API key injection), which no agent runtime in the guest image of this installation uses yet\n  help: remove `credential_proxy` until real agent runtimes land",
                    n.name
                ));
            }
            if a.llm.provider != Provider::Mock {
                return Err(format!(
                    "agent box `{}` uses `llm.provider: {}`, whose CLI is not in the guest image of this installation\n  help: only `provider: mock` (an offline stand-in) can run here for now",
                    n.name,
                    a.llm.provider.as_str()
                ));
            }
        }
    }
    Ok(())
}

/// A file to copy into the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFile {
    /// Absolute guest path.
    pub path: String,
    /// Contents.
    pub data: Vec<u8>,
    /// File mode (kit files are read-only).
    pub mode: u32,
}

/// The skill files of an agent: its kit ([`crate::kit`]) staged from `skills` (resolved
/// against `spec_dir`, `secrets` redacted), laid out under [`GUEST_SKILLS_DIR`], with the
/// kit's per-skill summary for the report.
pub fn skill_files(
    spec_dir: &Path,
    skills: &[SkillEntry],
    secrets: &crate::kit::Secrets,
) -> Result<(Vec<GuestFile>, Vec<crate::kit::SkillSummary>), String> {
    let kit = crate::kit::build(spec_dir, skills, secrets).map_err(|e| e.to_string())?;
    let files = kit
        .files
        .iter()
        .map(|f| GuestFile {
            path: f.guest_path(),
            data: f.data.clone(),
            mode: f.guest_mode(),
        })
        .collect();
    Ok((files, kit.summary()))
}

/// The program the guest starts for `agent` (its runtime; only the mock one exists yet).
pub fn runtime_program(_agent: &AgentAction) -> &'static str {
    MOCK_RUNTIME
}

/// The exec request that runs the mock runtime for `agent`.
pub fn runtime_request(
    agent: &AgentAction,
    output_file: &str,
    timeout: Option<u64>,
) -> ExecRequest {
    ExecRequest {
        program: runtime_program(agent).into(),
        args: vec![
            "-p".into(),
            agent.prompt.clone(),
            "--output-format".into(),
            "stream-json".into(),
            "--verbose".into(),
            "--skills-dir".into(),
            GUEST_SKILLS_DIR.into(),
            "--output-file".into(),
            output_file.into(),
        ],
        env: vec![("HOME".into(), "/home/sandbox".into())],
        workdir: Some("/workspace".into()),
        timeout_secs: timeout,
        ..ExecRequest::default()
    }
}

/// Incremental parser of stream-json (one JSON object per line). Hostile input: lines are
/// bounded, anything that is not an object of a known type is ignored. The `result` text is
/// kept whole up to the node's output cap, never cut: a larger one is reported as such.
#[derive(Debug)]
pub struct StreamParser {
    line: Vec<u8>,
    skipping: bool,
    stats: AgentStats,
    result_seen: bool,
    is_error: bool,
    events: u64,
    max_line: usize,
    max_result: u64,
    skipped_lines: u64,
    result_over_cap: Option<u64>,
}

impl Default for StreamParser {
    fn default() -> Self {
        StreamParser::new(super::data::DEFAULT_MAX_OUTPUT)
    }
}

/// What the stream said in the end.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    /// Usage, cost, tools, result.
    pub stats: AgentStats,
    /// A `result` event arrived.
    pub result_seen: bool,
    /// The result was an error.
    pub is_error: bool,
    /// JSON events parsed.
    pub events: u64,
    /// Lines skipped for being longer than the parser's limit.
    pub skipped_lines: u64,
    /// The `result` text was larger than the output cap: its size in bytes (it is then not
    /// in `stats.result`).
    pub result_over_cap: Option<u64>,
    /// The output cap the result was held to.
    pub max_result: u64,
}

impl StreamSummary {
    /// The result text for the node output: whole, or an error when it exceeds the cap.
    pub fn result(&self) -> Result<Option<String>, String> {
        match self.result_over_cap {
            Some(n) => Err(super::data::over_cap(
                "the agent's result",
                n,
                self.max_result,
            )),
            None => Ok(self.stats.result.clone()),
        }
    }

    /// Why no `result` event was seen, for the failure message.
    pub fn missing_result_hint(&self) -> String {
        if self.skipped_lines == 0 {
            return String::new();
        }
        format!(
            " ({} stream line(s) longer than twice the output cap were skipped; raise it with --max-output)",
            self.skipped_lines
        )
    }
}

impl StreamParser {
    /// A parser whose `result` may be up to `max_result` bytes (the node's output cap).
    pub fn new(max_result: u64) -> StreamParser {
        let line = max_result.saturating_mul(2).saturating_add(64 << 10);
        StreamParser {
            line: Vec::new(),
            skipping: false,
            stats: AgentStats::default(),
            result_seen: false,
            is_error: false,
            events: 0,
            max_line: usize::try_from(line).unwrap_or(usize::MAX).max(MAX_LINE),
            max_result,
            skipped_lines: 0,
            result_over_cap: None,
        }
    }

    /// Feeds bytes (any chunking).
    pub fn push(&mut self, data: &[u8]) {
        for &b in data {
            if b == b'\n' {
                if !self.skipping {
                    let line = std::mem::take(&mut self.line);
                    self.line_done(&line);
                }
                self.line.clear();
                self.skipping = false;
            } else if !self.skipping {
                if self.line.len() >= self.max_line {
                    self.skipping = true;
                    self.skipped_lines += 1;
                    self.line = Vec::new();
                } else {
                    self.line.push(b);
                }
            }
        }
    }

    /// Ends the stream (a last line without newline counts).
    pub fn finish(mut self) -> StreamSummary {
        if !self.skipping && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line);
        }
        StreamSummary {
            stats: self.stats,
            result_seen: self.result_seen,
            is_error: self.is_error,
            events: self.events,
            skipped_lines: self.skipped_lines,
            result_over_cap: self.result_over_cap,
            max_result: self.max_result,
        }
    }

    fn line_done(&mut self, line: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        self.events += 1;
        match v.get("type").and_then(Value::as_str) {
            Some("system") => {
                if let Some(m) = v.get("model").and_then(Value::as_str) {
                    self.stats.model = Some(cap(m, 200));
                }
            }
            Some("assistant") => {
                let content = v.pointer("/message/content").and_then(Value::as_array);
                for c in content.into_iter().flatten() {
                    if c.get("type").and_then(Value::as_str) == Some("tool_use")
                        && self.stats.tool_calls.len() < MAX_TOOL_CALLS
                    {
                        let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
                        self.stats.tool_calls.push(cap(name, 200));
                    }
                }
            }
            Some("result") => {
                self.result_seen = true;
                self.is_error = v.get("is_error").and_then(Value::as_bool).unwrap_or(false)
                    || v.get("subtype")
                        .and_then(Value::as_str)
                        .is_some_and(|s| s != "success");
                let result = v.get("result").and_then(Value::as_str);
                self.result_over_cap = result
                    .map(|r| r.len() as u64)
                    .filter(|&n| n > self.max_result);
                self.stats.result = result
                    .filter(|_| self.result_over_cap.is_none())
                    .map(str::to_string);
                let num = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
                self.stats.input_tokens = num("/usage/input_tokens")
                    .saturating_add(num("/usage/cache_read_input_tokens"))
                    .saturating_add(num("/usage/cache_creation_input_tokens"));
                self.stats.output_tokens = num("/usage/output_tokens");
                self.stats.num_turns = num("/num_turns");
                self.stats.cost_usd = v
                    .get("total_cost_usd")
                    .and_then(Value::as_f64)
                    .filter(|c| c.is_finite() && *c >= 0.0)
                    .unwrap_or(0.0);
            }
            _ => {}
        }
    }
}

fn cap(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        r#"{"type":"system","subtype":"init","model":"mock-1","tools":["Read","Write","Skill"]}"#,
        "\n",
        r#"{"type":"assistant","message":{"content":[{"type":"text","text":"hi"},{"type":"tool_use","id":"t1","name":"Skill","input":{"skill":"summarize"}}]}}"#,
        "\n",
        r#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}}"#,
        "\n",
        "not json at all\n",
        r#"{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t2","name":"Write","input":{}}]}}"#,
        "\n",
        r#"{"type":"result","subtype":"success","is_error":false,"result":"done","num_turns":3,"total_cost_usd":0.0123,"usage":{"input_tokens":100,"output_tokens":20,"cache_read_input_tokens":5}}"#
    );

    #[test]
    fn parses_usage_tools_and_result_in_any_chunking() {
        for chunk in [1usize, 7, 4096] {
            let mut p = StreamParser::default();
            for c in STREAM.as_bytes().chunks(chunk) {
                p.push(c);
            }
            let s = p.finish();
            assert!(s.result_seen && !s.is_error);
            assert_eq!(s.events, 5);
            assert_eq!(s.stats.model.as_deref(), Some("mock-1"));
            assert_eq!(s.stats.tool_calls, vec!["Skill", "Write"]);
            assert_eq!((s.stats.input_tokens, s.stats.output_tokens), (105, 20));
            assert_eq!(s.stats.num_turns, 3);
            assert!((s.stats.cost_usd - 0.0123).abs() < 1e-12);
            assert_eq!(s.stats.result.as_deref(), Some("done"));
        }
    }

    #[test]
    fn hostile_streams_are_bounded() {
        let mut p = StreamParser::default();
        p.push(&vec![
            b'{';
            2 * super::super::data::DEFAULT_MAX_OUTPUT as usize
                + (64 << 10)
                + 10
        ]);
        p.push(b"\n{\"type\":\"result\",\"subtype\":\"error_max_turns\",\"total_cost_usd\":-1}\n");
        let s = p.finish();
        assert!(s.result_seen && s.is_error);
        assert_eq!(s.stats.cost_usd, 0.0);
        assert_eq!(s.events, 1);
    }

    fn result_line(text: &str) -> Vec<u8> {
        let mut l = serde_json::to_vec(&serde_json::json!({
            "type": "result", "subtype": "success", "is_error": false, "result": text
        }))
        .unwrap();
        l.push(b'\n');
        l
    }

    #[test]
    fn the_result_is_kept_whole_up_to_the_output_cap() {
        // Far beyond the old 4096-character cut, with characters that JSON escapes.
        let text: String = "line \"quoted\"\t\u{e9}\n".repeat(40_000);
        let mut p = StreamParser::new(text.len() as u64);
        for c in result_line(&text).chunks(65536) {
            p.push(c);
        }
        let s = p.finish();
        assert!(s.result_seen && !s.is_error);
        assert_eq!(s.result().unwrap().as_deref(), Some(text.as_str()));
        assert_eq!(s.stats.result.as_deref(), Some(text.as_str()));
        // One byte over the cap: an error naming the cap, never a cut result.
        let mut p = StreamParser::new(text.len() as u64 - 1);
        p.push(&result_line(&text));
        let s = p.finish();
        assert!(s.result_seen);
        assert_eq!(s.stats.result, None);
        let e = s.result().unwrap_err();
        assert!(
            e.contains("the agent's result") && e.contains("--max-output"),
            "{e}"
        );
        // A result line beyond twice the cap is skipped and said so.
        let mut p = StreamParser::new(10);
        p.push(&result_line(&"x".repeat(MAX_LINE + 1)));
        let s = p.finish();
        assert!(!s.result_seen && s.skipped_lines == 1);
        assert!(s.missing_result_hint().contains("--max-output"));
    }

    #[test]
    fn skills_are_copied_under_the_claude_dir() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("skills/sum/refs")).unwrap();
        std::fs::write(
            d.path().join("skills/sum/SKILL.md"),
            "---\nname: sum\n---\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("skills/sum/refs/a.md"),
            "key=host-secret-value",
        )
        .unwrap();
        std::fs::write(d.path().join("plain.md"), "p").unwrap();
        let secrets = crate::kit::Secrets::new(["host-secret-value".to_string()]);
        let (files, summary) = skill_files(
            d.path(),
            &[
                SkillEntry::Simple("file:skills/sum".into()),
                SkillEntry::Simple("file:plain.md".into()),
                SkillEntry::Simple("agent:claude-code".into()),
            ],
            &secrets,
        )
        .unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "/home/sandbox/.claude/skills/sum/SKILL.md",
                "/home/sandbox/.claude/skills/sum/refs/a.md",
                "/home/sandbox/.claude/skills/plain/SKILL.md",
            ]
        );
        // What reaches the guest is the staged kit: redacted, plain skills with frontmatter,
        // read-only.
        assert_eq!(files[1].data, b"key=[REDACTED]");
        assert_eq!(
            files[2].data,
            b"---\nname: \"plain\"\ndescription: \"p\"\n---\n\np"
        );
        assert!(files.iter().all(|f| f.mode == 0o444));
        let names: Vec<(&str, u64, u64)> = summary
            .iter()
            .map(|k| (k.name.as_str(), k.files, k.redactions))
            .collect();
        assert_eq!(names, [("sum", 2, 1), ("plain", 1, 0)]);
        let none = crate::kit::Secrets::default();
        assert!(skill_files(d.path(), &[SkillEntry::Simple("remote:a/b".into())], &none).is_err());
    }
}

#[cfg(test)]
mod mock_runtime_tests {
    use super::*;

    /// Captured from `voidbox-mock-llm` (guest-agent/src/bin) on the host.
    const CAPTURED: &str = include_str!("testdata/mock-stream.jsonl");

    #[test]
    fn parses_the_mock_runtime_stream() {
        let mut p = StreamParser::default();
        p.push(CAPTURED.as_bytes());
        let s = p.finish();
        assert!(s.result_seen && !s.is_error);
        assert_eq!(s.stats.model.as_deref(), Some("voidbox-mock-1"));
        assert_eq!(s.stats.tool_calls, vec!["Skill", "Read", "Write"]);
        assert!(s.stats.input_tokens > 0 && s.stats.output_tokens > 0);
        assert!(s.stats.cost_usd > 0.0);
        assert!(s
            .stats
            .result
            .unwrap_or_default()
            .starts_with("mock result for"));
    }
}
