-- wrk script: POST one MCP tools/call JSON-RPC request per call.
-- Optional, from the environment (bench/loadgen.py sets them): BENCH_BODY (the request body;
-- default: a 2025-11-25 tools/call of echo), and headers BENCH_AUTHORIZATION (a bearer
-- credential), BENCH_SESSION_ID (an Mcp-Session-Id from one initialize), BENCH_PROTOCOL
-- (MCP-Protocol-Version), BENCH_MCP_METHOD and BENCH_MCP_NAME (a 2026-07-28 request's
-- Mcp-Method and Mcp-Name). done() prints one machine-readable line for bench/loadgen.py.
wrk.method = "POST"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
local body = os.getenv("BENCH_BODY")
if body and body ~= "" then wrk.body = body end
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
local headers = {BENCH_AUTHORIZATION = "Authorization", BENCH_SESSION_ID = "Mcp-Session-Id",
                 BENCH_PROTOCOL = "MCP-Protocol-Version", BENCH_MCP_METHOD = "Mcp-Method",
                 BENCH_MCP_NAME = "Mcp-Name"}
for var, name in pairs(headers) do
  local value = os.getenv(var)
  if value and value ~= "" then wrk.headers[name] = value end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH_JSON {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d," ..
    "\"connect\":%d,\"read\":%d,\"write\":%d,\"status\":%d,\"timeout\":%d," ..
    "\"p50_us\":%d,\"p90_us\":%d,\"p99_us\":%d,\"mean_us\":%.1f,\"max_us\":%d}\n",
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
