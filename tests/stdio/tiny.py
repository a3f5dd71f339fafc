"""The smallest stdio MCP server: plain Python, no SDK, so it starts in milliseconds (the leak
count starts hundreds). Tools: echo; noise, which writes what a misbehaving server writes on
stdout (a line that is not JSON, JSON that is not JSON-RPC, a line over any sane cap) and a
burst on stderr before it answers; announce, which says its tool list changed."""

import json
import sys


def reply(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "noise", "announce")]

for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg or "method" not in msg:
        continue
    method, rid = msg["method"], msg["id"]
    if method == "initialize":
        reply({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "1"}}})
    elif method == "tools/list":
        reply({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        args = msg["params"].get("arguments") or {}
        if msg["params"]["name"] == "noise":
            sys.stdout.write("this is not JSON-RPC\n[1, 2]\n" + "x" * 100_000 + "\n")
            for i in range(500):
                sys.stderr.write(f"chatter {i}\n")
            sys.stderr.flush()
        if msg["params"]["name"] == "announce":  # for every session's GET stream
            reply({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        reply({"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": args.get("text", "noisy")}]}})
    else:
        reply({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
