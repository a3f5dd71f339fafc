"""The MCP request path, one module per step, in reading order:

    asgi      /mcp/<endpoint> as plain ASGI in front of Quart: route, body cap, EdgeRequest
    exchange  the edge's plain view of one exchange (EdgeRequest, EdgeResponse), and the one
              owner of its audit record (Exchange)
    guards    Origin, media types, the caller's address, the parse
    eras      which era a message belongs to; the 2026-07-28 checks (seed 003's table)
    gateway   the spine: POST, GET, DELETE, top to bottom, one audit record each
    forwarding  what the spine asks of an upstream kind (`Forwarding`), chosen once per route
    call      a request from the chain's yes to its answer: in flight, forwarded, answered
    forward   a plain upstream's forwarding: sends, retries, one-way sends, the GET stream
    legs      the leg a call takes to a plain upstream: headers, session, the era bridge
    names     the tools and prompts a plain upstream lists (unknown names answered here)
    bridge    each upstream's era, and the legacy sessions held for sessionless callers
    relay     an upstream SSE stream relayed event by event; how a streamed call ends
    scan      what a streamed answer says (id, result or error, isError), read on the way
    resume    an answer on a resumed stream, recorded and held to the call's rules first
    listening  the GET streams open: each one's relay (resumed or not), their end at a drain
    sse       SSE framing

Identity (proxy/auth), the policies (policies/ through proxy/chain.py) and the upstream
boundary (proxy/upstream) are the steps this package calls; nothing here imports Quart.
"""
