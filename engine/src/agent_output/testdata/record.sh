#!/usr/bin/env bash
# Records the real CLIs' output against the scripted LLM server (llm-script/) into this
# directory. Usage: record.sh CLAUDE_BIN CODEX_BIN LLM_SCRIPT_BIN
# (e.g. the musl claude from @anthropic-ai/claude-code-linux-x64-musl, the static codex
# from @openai/codex's linux-x64 package, target/debug/voidbox-llm-script).
set -euo pipefail
CLAUDE=$1 CODEX=$2 LLM=$3
OUT=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d /var/tmp/vbx-record.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT

# A skill and a trivial stdio MCP server (python3), so init reports both.
mkdir -p "$T/home/.claude/skills/greet" "$T/home/.codex/skills/greet" "$T/work"
printf -- '---\nname: greet\ndescription: Greets the user politely.\n---\nSay hello.\n' \
  | tee "$T/home/.claude/skills/greet/SKILL.md" > "$T/home/.codex/skills/greet/SKILL.md"
echo '{"hasCompletedOnboarding":true}' > "$T/home/.claude.json"
cat > "$T/mcp.py" <<'PY'
import sys, json
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    i = m.get("id"); meth = m.get("method")
    if i is None: continue
    if meth == "initialize":
        r = {"protocolVersion": m["params"].get("protocolVersion", "2024-11-05"),
             "capabilities": {"tools": {}}, "serverInfo": {"name": "echo", "version": "1"}}
    elif meth == "tools/list":
        r = {"tools": [{"name": "echo", "description": "Echo text", "inputSchema":
             {"type": "object", "properties": {"text": {"type": "string"}}}}]}
    elif meth == "tools/call":
        r = {"content": [{"type": "text", "text": m["params"]["arguments"].get("text", "")}]}
    else:
        r = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": i, "result": r}) + "\n"); sys.stdout.flush()
PY
echo "{\"mcpServers\":{\"echo\":{\"type\":\"stdio\",\"command\":\"python3\",\"args\":[\"$T/mcp.py\"]}}}" > "$T/mcp.json"

# serve SCRIPT_JSON: starts the scripted server, sets PORT.
serve() {
  echo "$1" > "$T/script.json"
  rm -f "$T/port"
  "$LLM" "$T/script.json" > "$T/port" & SERVER=$!
  for _ in $(seq 50); do [ -s "$T/port" ] && break; sleep 0.1; done
  PORT=$(cat "$T/port")
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; }

# claude NAME SCRIPT [EXTRA ARGS...]
claude() {
  local name=$1; serve "$2"; shift 2
  (cd "$T/work" && HOME="$T/home" IS_SANDBOX=1 ANTHROPIC_BASE_URL="http://127.0.0.1:$PORT" \
    ANTHROPIC_API_KEY=sk-vbx-test CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
    CLAUDE_CODE_MAX_RETRIES=${RETRIES:-0} \
    "$CLAUDE" -p "Run the check." --output-format stream-json --verbose \
      --dangerously-skip-permissions --model claude-sonnet-4-5 \
      --mcp-config "$T/mcp.json" --strict-mcp-config "$@" \
      > "$OUT/claude/$name.jsonl" 2> "$T/stderr") || echo "claude $name: exit $?"
  stop
}

# codex NAME SCRIPT [STREAM_RETRIES]
codex() {
  local name=$1; serve "$2"
  cat > "$T/home/.codex/config.toml" <<TOML
model = "gpt-5.1-codex"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"

[model_providers.local]
name = "local"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
env_key = "VBX_KEY"
request_max_retries = 0
stream_max_retries = ${3:-0}

[mcp_servers.echo]
command = "python3"
args = ["$T/mcp.py"]
TOML
  (cd "$T/work" && HOME="$T/home" CODEX_HOME="$T/home/.codex" VBX_KEY=sk-vbx-test \
    "$CODEX" exec --json --skip-git-repo-check "Run the check." < /dev/null \
      > "$OUT/codex/$name.jsonl" 2> "$T/stderr") || echo "codex $name: exit $?"
  stop
}

U='"usage":{"input_tokens":120,"output_tokens":9,"cached_tokens":30}'
TEXT='{"turns":[{"text":"All checks passed."}],'$U'}'
TOOL='{"turns":[{"tool":{"input":{"command":"echo tool-output-$((6*7))"}}},{"text":"The command printed tool-output-42."}],'$U'}'
E500='{"turns":[{"error":{"status":500,"message":"scripted upstream failure"}}]}'
E401='{"turns":[{"error":{"status":401,"message":"invalid x-api-key"}}]}'
RETRY='{"turns":[{"error":{"status":500,"message":"scripted upstream failure","times":1}},{"text":"Recovered."}],'$U'}'

# Shell tool, then the MCP server's tool (Claude Code's `mcp__echo__echo`; Codex's
# `echo` in namespace `mcp__echo`), then text.
TOOLS='{"turns":[{"tool":{"input":{"command":"echo tool-output-$((6*7))"}}},{"tool":{"name":"mcp__echo__echo","input":{"text":"via-mcp"}}},{"text":"The command printed tool-output-42."}],'$U'}'

claude text "$TEXT"
claude tool "$TOOLS"
claude error-500 "$E500"
claude error-401 "$E401"
claude max-turns "$TOOL" --max-turns 1
RETRIES=1 claude retry-then-ok "$RETRY"
codex text "$TEXT"
codex tool "$TOOLS"
codex error-500 "$E500"
codex error-401 "$E401"
codex retry-then-ok "$RETRY" 1
