-- wrk script: POST one MCP tools/call JSON-RPC request per call.
-- Optional headers from the environment (bench/loadgen.py sets them): BENCH_AUTHORIZATION
-- (a bearer credential) and BENCH_SESSION_ID (an Mcp-Session-Id from one initialize).
-- done() prints one machine-readable line for bench/loadgen.py.
wrk.method = "POST"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello"}}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["MCP-Protocol-Version"] = "2025-11-25"
local authorization = os.getenv("BENCH_AUTHORIZATION")
if authorization and authorization ~= "" then wrk.headers["Authorization"] = authorization end
local session = os.getenv("BENCH_SESSION_ID")
if session and session ~= "" then wrk.headers["Mcp-Session-Id"] = session end

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
