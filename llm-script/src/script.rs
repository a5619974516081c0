//! The script: which answer the server gives at which point of a conversation.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the server answers, turn by turn.
///
/// The turn for a request is chosen by its position in the conversation: the number of
/// assistant turns the request already carries (Anthropic: `assistant` messages; OpenAI
/// Responses: assistant `message` and `function_call` items in `input`). [`Turn::Error`]
/// turns take no position: one placed before the turn at position `n` answers requests at
/// position `n` (up to `times` of them) before that turn does.
///
/// JSON form (the bin's script file):
/// `{"turns": [{"error": {"status": 500, "message": "boom", "times": 1}},
///  {"tool": {"input": {"command": "echo hi"}}}, {"text": "done"}],
///  "usage": {"input_tokens": 20, "output_tokens": 5, "cached_tokens": 0},
///  "expect_key": "sk-real"}` (all but `turns` optional; a bare array of turns is accepted too).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The turns, in order.
    pub turns: Vec<Turn>,
    /// Token usage reported for every answered turn.
    #[serde(default)]
    pub usage: Usage,
    /// When set, a request must carry this key (`x-api-key` or `Authorization: Bearer`);
    /// any other gets the provider's 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_key: Option<String>,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Turn {
    /// A text reply that ends the model's turn.
    Text(String),
    /// A tool call. With `name`, `input` is sent as it is (Anthropic `tool_use` input, or the
    /// OpenAI `function_call` arguments). Without, it is the runtime's shell tool running
    /// `input.command` (a string): Claude Code's `Bash` with `{"command"}`, Codex's
    /// `exec_command` with `{"cmd"}` (or `shell_command` / `shell`, whichever the request
    /// offers).
    Tool {
        /// Tool name; `None` for the runtime's shell tool.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// Tool input.
        input: Value,
    },
    /// An HTTP error with the provider's error JSON (500, 401, 429, ...).
    Error {
        /// HTTP status.
        status: u16,
        /// The error message in the body.
        message: String,
        /// How many requests it answers before the next turn does; `None`: all of them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        times: Option<u32>,
    },
}

impl Turn {
    /// A text turn.
    pub fn text(s: impl Into<String>) -> Turn {
        Turn::Text(s.into())
    }

    /// The runtime's shell tool running `command`.
    pub fn shell(command: impl Into<String>) -> Turn {
        Turn::Tool {
            name: None,
            input: serde_json::json!({ "command": command.into() }),
        }
    }

    /// An error answered for every request at its position.
    pub fn error(status: u16, message: impl Into<String>) -> Turn {
        Turn::Error {
            status,
            message: message.into(),
            times: None,
        }
    }
}

/// Token usage of one answered turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Input tokens not read from a cache.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cached_tokens: u64,
}

impl Default for Usage {
    fn default() -> Self {
        Usage {
            input_tokens: 20,
            output_tokens: 5,
            cached_tokens: 0,
        }
    }
}

impl Script {
    /// A script of `turns` with the default usage and no key check.
    pub fn new(turns: impl IntoIterator<Item = Turn>) -> Script {
        Script {
            turns: turns.into_iter().collect(),
            ..Script::default()
        }
    }

    /// Parses a script file's JSON: a [`Script`] object or a bare array of turns.
    pub fn from_json(data: &[u8]) -> Result<Script, String> {
        let v: Value = serde_json::from_slice(data).map_err(|e| format!("script: {e}"))?;
        if v.is_array() {
            let turns: Vec<Turn> =
                serde_json::from_value(v).map_err(|e| format!("script turns: {e}"))?;
            return Ok(Script::new(turns));
        }
        serde_json::from_value(v).map_err(|e| format!("script: {e}"))
    }
}

/// What a request at some position gets.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Pick {
    /// Answer with this turn (index into the script).
    Turn(usize),
    /// The script has no turn at this position.
    Exhausted,
}

/// Chooses the turn for `position`, counting served errors in `served` (one per turn).
pub(crate) fn pick(turns: &[Turn], served: &mut [u32], position: usize) -> Pick {
    let mut k = 0usize;
    for (i, t) in turns.iter().enumerate() {
        match t {
            Turn::Error { times, .. } => {
                if k == position && times.is_none_or(|n| served[i] < n) {
                    served[i] = served[i].saturating_add(1);
                    return Pick::Turn(i);
                }
            }
            _ => {
                if k == position {
                    return Pick::Turn(i);
                }
                k += 1;
            }
        }
    }
    Pick::Exhausted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_answer_their_position_then_give_way() {
        let turns = vec![
            Turn::Error {
                status: 500,
                message: "a".into(),
                times: Some(2),
            },
            Turn::shell("ls"),
            Turn::error(429, "b"),
            Turn::text("end"),
        ];
        let mut served = vec![0; turns.len()];
        assert_eq!(pick(&turns, &mut served, 0), Pick::Turn(0));
        assert_eq!(pick(&turns, &mut served, 0), Pick::Turn(0));
        assert_eq!(pick(&turns, &mut served, 0), Pick::Turn(1));
        assert_eq!(pick(&turns, &mut served, 1), Pick::Turn(2));
        assert_eq!(pick(&turns, &mut served, 1), Pick::Turn(2));
        assert_eq!(pick(&turns, &mut served, 2), Pick::Exhausted);
    }

    #[test]
    fn script_json_forms() {
        let s = Script::from_json(
            br#"{"turns":[{"text":"hi"},{"tool":{"input":{"command":"ls"}}},{"tool":{"name":"Read","input":{"file_path":"/x"}}},{"error":{"status":401,"message":"no"}}],"usage":{"input_tokens":1,"output_tokens":2},"expect_key":"k"}"#,
        )
        .unwrap();
        assert_eq!(s.turns[0], Turn::text("hi"));
        assert_eq!(s.turns[1], Turn::shell("ls"));
        assert_eq!(s.turns[3], Turn::error(401, "no"));
        assert_eq!(s.usage.output_tokens, 2);
        assert_eq!(s.expect_key.as_deref(), Some("k"));
        let bare = Script::from_json(br#"[{"text":"x"}]"#).unwrap();
        assert_eq!(bare, Script::new([Turn::text("x")]));
        assert!(Script::from_json(br#"[{"txt":"x"}]"#).is_err());
        assert!(Script::from_json(b"nope").is_err());
    }
}
