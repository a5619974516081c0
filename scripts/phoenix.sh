#!/usr/bin/env bash
# Arize Phoenix as a real OpenTelemetry (OTLP) trace receiver on loopback, for tests.
#
#   scripts/phoenix.sh install                          create the venv and pip-install the pinned
#                                                       arize-phoenix; a no-op once installed
#   scripts/phoenix.sh serve WORKDIR HTTP_PORT GRPC_PORT
#                                                       exec the server in the foreground on
#                                                       127.0.0.1 with its sqlite db in WORKDIR
#   scripts/phoenix.sh python [ARGS...]                 run the venv's python (OTel SDK included)
#
# Serving (HTTP_PORT):  POST /v1/traces  (OTLP/HTTP, content-type exactly application/x-protobuf;
#                                         OTLP/JSON is refused with 415; /v1/metrics and /v1/logs
#                                         do not exist)
#                       GET  /healthz -> "OK" once it accepts requests; GET /readyz also pings the db
#                       GET  /v1/projects/{name}/spans?limit=N  (spans land in the project named by
#                                         the resource attribute openinference.project.name, else
#                                         "default"; ingestion is asynchronous, poll for them)
# Serving (GRPC_PORT):  OTLP/gRPC TraceService only. NOTE: Phoenix binds gRPC on [::] (all
#                       interfaces) whatever PHOENIX_HOST says; only the HTTP port is loopback-only.
#
# Nothing is fetched from the network at startup: telemetry, external resources (WASM sandbox
# download, docs MCP, UI trackers) and the agent assistant are off; auth is off. All state goes
# to WORKDIR (phoenix.db, inferences/, trace_datasets/, wasm/, tmp/ for the pid file).
# Ready ~6-8 s after exec (2-core host; first start runs the db migrations). SIGTERM shuts it
# down cleanly (exit status 143); a port already in use makes it exit non-zero (gRPC: 3).
#
# Environment: PHOENIX_VENV (default ${XDG_CACHE_HOME:-~/.cache}/voidbox/phoenix-venv),
#              PHOENIX_PYTHON (interpreter used to create the venv; default python3, needs >= 3.10).
set -euo pipefail

PHOENIX_VERSION="20.26.1"
VENV="${PHOENIX_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/voidbox/phoenix-venv}"

# Every dependency at the version tested with arize-phoenix 20.26.1 on CPython 3.11
# (pip freeze of a clean install), so later releases of its ~150 dependencies cannot break it.
constraints() {
  tr ' ' '\n' <<'EOF'
aiofile==3.12.3 aioitertools==0.13.0 aiosqlite==0.22.1 alembic==1.20.1 annotated-doc==0.0.7
annotated-types==0.8.0 anthropic==1.17.0 anyio==4.16.0 arize-phoenix-client==3.5.0
arize-phoenix-evals==3.9.4 arize-phoenix-otel==0.17.2 arize-phoenix-sqlean==0.2.1 attrs==26.1.0
Authlib==1.9.9 backports.tarfile==1.2.0 bashkit==0.20.1 beartype==0.23.1 boto3==1.44.5
botocore==1.44.5 cachetools==8.0.1 caio==0.12.10 certifi==2026.10.18 cffi==2.1.1
charset-normalizer==3.5.2 click==8.5.1 cross-web==0.9.0 cryptography==50.0.2 cyclopts==5.4.0
distro==1.9.0 dnspython==2.9.2 docstring_parser==0.18.0 email-validator==2.4.0
exceptiongroup==1.3.1 fastapi==0.165.0 fastmcp-slim==4.1.2 genai-prices==0.2.3
google-auth==2.62.2 google-genai==2.34.0 googleapis-common-protos==1.76.0 graphql-core==3.3.2
greenlet==3.5.6 griffelib==2.4.1 grpc-interceptor==0.15.4 grpcio==1.85.1 h11==0.16.0 h2==4.4.1
hpack==4.2.0 httpcore==1.0.9 httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2 hyperframe==6.1.0
idna==3.20 importlib_metadata==10.2.0 jaraco.classes==3.4.0 jaraco.context==6.1.2
jaraco.functools==4.6.0 jeepney==0.9.0 Jinja2==3.1.6 jiter==0.19.0 jmespath==1.1.0 joserfc==1.8.0
jsonpath-ng==1.16.0 jsonref==1.1.0 jsonschema==4.26.0 jsonschema-path==0.5.0
jsonschema-specifications==2025.9.1 keyring==25.7.0 lazy-importer==0.1.0 ldap3==2.9.1
logfire-api==5.6.0 Mako==1.4.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mcp==2.3.0
mcp-types==2.3.0 mdurl==0.1.2 more-itertools==11.2.1 numpy==2.4.6 openai==3.54.0
openapi-pydantic==0.6.0 openinference-instrumentation==0.1.72
openinference-instrumentation-openai==0.1.66 openinference-semantic-conventions==0.1.42
opentelemetry-api==1.45.2 opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-instrumentation==0.66b2
opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
orjson==3.13.0 packaging==26.3 pandas==3.1.1 pathable==0.6.0 platformdirs==4.14.7
prometheus_client==0.26.0 protobuf==7.36.2 psutil==7.2.2 py-key-value-aio==0.4.6 pyarrow==26.0.1
pyasn1==0.6.5 pyasn1_modules==0.4.2 pycparser==3.12 pydantic==2.14.3 pydantic-ai-slim==2.68.0
pydantic-graph==2.68.0 pydantic-monty==1.1.0 pydantic-monty-client==1.1.0
pydantic-monty-runtime==1.1.0 pydantic-settings==2.16.3 pydantic_core==2.50.4 Pygments==2.21.0
PyJWT==2.15.1 pyperclip==1.11.0 pystache==0.6.8 python-dateutil==2.9.0.post0 python-dotenv==1.2.4
python-multipart==0.0.34 PyYAML==6.0.3 referencing==0.37.0 regex==2026.11.15 requests==2.34.2
rich==15.0.0 rich-rst==2.2.0 rpds-py==2026.9.1 s3transfer==0.19.3 SecretStorage==3.5.0
six==1.17.0 sniffio==1.3.1 snowballstemmer==3.1.1 SQLAlchemy==2.1.9 sqlglot==30.21.0
sse-starlette==3.7.0 starlette==1.10.0 strawberry-graphql==0.335.0 tenacity==9.1.4
tiktoken==0.14.0 tqdm==4.70.1 truststore==0.10.5 typing-inspection==0.4.5
typing_extensions==4.16.0 uncalled-for==0.6.1 urllib3==2.8.0 uvicorn==0.54.0 watchfiles==1.3.0
websockets==17.4 wrapt==2.5.2 zipp==4.1.2
EOF
}

usage() {
  sed -n '2,9p' "$0" >&2
  exit 2
}

installed() {
  [ -x "$VENV/bin/python" ] &&
    [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("arize-phoenix"))' 2>/dev/null)" = "$PHOENIX_VERSION" ]
}

install() {
  if installed; then
    return 0
  fi
  local py="${PHOENIX_PYTHON:-python3}"
  if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    "$py" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --constraint <(constraints) "arize-phoenix==$PHOENIX_VERSION"
  installed || {
    echo "phoenix.sh: arize-phoenix $PHOENIX_VERSION not importable after install" >&2
    exit 1
  }
}

serve() {
  [ $# -eq 3 ] || usage
  local workdir="$1" http_port="$2" grpc_port="$3"
  installed || {
    echo "phoenix.sh: not installed; run: $0 install" >&2
    exit 1
  }
  mkdir -p "$workdir/tmp"
  workdir="$(cd "$workdir" && pwd)"
  # Drop any inherited Phoenix/OTel configuration so the test always gets the same server.
  local var
  for var in $(compgen -e); do
    case "$var" in PHOENIX_* | OTEL_*) unset "$var" ;; esac
  done
  export PHOENIX_WORKING_DIR="$workdir"
  export PHOENIX_SQL_DATABASE_URL="sqlite:///$workdir/phoenix.db"
  export PHOENIX_HOST=127.0.0.1
  export PHOENIX_PORT="$http_port"
  export PHOENIX_GRPC_PORT="$grpc_port"
  export PHOENIX_ENABLE_AUTH=false
  export PHOENIX_TELEMETRY_ENABLED=false
  export PHOENIX_ALLOW_EXTERNAL_RESOURCES=false
  export PHOENIX_DISABLE_AGENT_ASSISTANT=true
  export PHOENIX_ENABLE_PROMETHEUS=false
  export PHOENIX_ENABLE_MCP_SERVER=false
  export PHOENIX_LOG_MIGRATIONS=false # else every migration statement is echoed (~4k lines)
  export TMPDIR="$workdir/tmp" # pid file: $TMPDIR/.arize-phoenix/pids/<pid>
  exec "$VENV/bin/python" -m phoenix.server.main serve
}

case "${1:-}" in
  install) install ;;
  serve) shift && serve "$@" ;;
  python) shift && exec "$VENV/bin/python" "$@" ;;
  *) usage ;;
esac
