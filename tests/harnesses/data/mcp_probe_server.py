"""A one-tool MCP server for the harness tests, standard library only, so it runs in any sandbox image.

    python3 mcp_probe_server.py stdio              # JSON-RPC lines on stdin/stdout
    python3 mcp_probe_server.py http PORT          # streamable HTTP on 127.0.0.1:PORT/mcp (JSON replies)

Its one tool, `harbor_probe_<transport>`, answers with PROBE_REPLY. It appends each request to $MCP_PROBE_LOG (default
/tmp/mcp-probe.log), prefixed by its transport, so a test can see that the agent listed the tool and
called it, and which headers reached it. It echoes the
client's protocol version, which every MCP client accepts.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOL = f"harbor_probe_{sys.argv[1] if len(sys.argv) > 1 else 'stdio'}"
"""One name per transport, so an agent's two servers never offer the same name."""
PROBE_REPLY = "harbor-probe-reply-7f3a"
LOG = os.environ.get("MCP_PROBE_LOG", "/tmp/mcp-probe.log")


def note(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as handle:
        handle.write(f"{sys.argv[1]} {line}\n")


def answer(message: dict) -> dict | None:
    """The JSON-RPC reply to `message`; None for a notification."""
    method, ident = message.get("method"), message.get("id")
    note(f"method {method}")
    if ident is None:
        return None
    if method == "initialize":
        version = (message.get("params") or {}).get("protocolVersion") or "2025-03-26"
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "harbor-probe", "version": "1.0.0"},
        }
    elif method == "tools/list":
        result = {
            "tools": [
                {
                    "name": TOOL,
                    "description": "Answers with a fixed probe string (harness tests).",
                    "inputSchema": {"type": "object", "properties": {}},
                }
            ]
        }
    elif method == "tools/call":
        note(f"call {(message.get('params') or {}).get('name')}")
        result = {"content": [{"type": "text", "text": PROBE_REPLY}], "isError": False}
    elif method == "ping" or method.endswith("/list"):
        result = {} if method == "ping" else {method.split("/")[0]: []}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def serve_stdio() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = answer(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
        note("headers " + json.dumps({k.lower(): v for k, v in self.headers.items()}))
        replies = [r for r in map(answer, body if isinstance(body, list) else [body]) if r is not None]
        if not replies:
            self.send_response(202)
            self.end_headers()
            return
        data = json.dumps(replies if isinstance(body, list) else replies[0]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - no server-initiated stream
        self.send_response(405)
        self.send_header("Allow", "POST")
        self.end_headers()

    do_DELETE = do_GET

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        serve_stdio()
    else:
        ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
