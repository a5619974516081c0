"""An OTLP/HTTP receiver for tests: POST /v1/metrics, /v1/logs and /v1/traces (protobuf) are decoded
with the official OpenTelemetry protobuf definitions (opentelemetry-proto, in the Phoenix
venv) and appended to OUT as one JSON object per line
({"signal": ..., "headers": {...}, "body": <OTLP JSON>}).

    python otlp_sink.py PORT OUT

Phoenix receives traces but not metrics or logs, so the tests read those from here. Anything else
gets 404; a body that does not decode gets 400. Listens on 127.0.0.1 only.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

KINDS = {
    "/v1/metrics": ("metrics", metrics_service_pb2.ExportMetricsServiceRequest,
                    metrics_service_pb2.ExportMetricsServiceResponse),
    "/v1/traces": ("traces", trace_service_pb2.ExportTraceServiceRequest,
                   trace_service_pb2.ExportTraceServiceResponse),
    "/v1/logs": ("logs", logs_service_pb2.ExportLogsServiceRequest,
                 logs_service_pb2.ExportLogsServiceResponse),
}
MAX_BODY = 64 << 20


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        kind = KINDS.get(self.path)
        length = int(self.headers.get("content-length") or 0)
        if kind is None or length > MAX_BODY:
            self.send_error(404 if kind is None else 413)
            return
        body = self.rfile.read(length)
        name, request, response = kind
        msg = request()
        try:
            msg.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - any decode failure is the client's
            self.send_error(400, str(e))
            return
        with open(OUT, "a", encoding="utf-8") as f:
            headers = {k.lower(): v for k, v in self.headers.items()}
            f.write(json.dumps({"signal": name, "headers": headers,
                                "body": MessageToDict(msg)}) + "\n")
        data = response().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    PORT = int(sys.argv[1])
    OUT = sys.argv[2]
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
