"""A stdio MCP server built with the official Python SDK (mcp 2.3), run by the gateway as a
child process in tests/stdio. Tools: echo, slow (a slow tool that reports progress and waits
to be cancelled), log (a log message), ask_sampling / ask_elicitation / ask_roots
(server-to-client requests), env (one environment variable), pid, confinement, spawn_child and
spawn_detached (a process in its group, or one that left it), peek (what a hostile server
tries to read), crash (exits at once), noise (a burst on stderr); a prompt and a resource."""

from __future__ import annotations

import os
import sys

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

server = MCPServer("stdio-test", version="1.0.0")


class Answer(BaseModel):
    answer: str


@server.tool()
async def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
async def slow(steps: int, ctx: Context, wait: bool = False) -> str:
    """Report progress `steps` times; with `wait`, then block until cancelled."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps, f"step {i}")
    if wait:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            sys.stderr.write("slow: cancelled\n")
            sys.stderr.flush()
            raise
    return "done"


@server.tool()
async def log(message: str, ctx: Context) -> str:
    """Send `message` as a log notification, then answer."""
    await ctx.info(message)
    return "logged"


@server.tool()
async def ask_sampling(prompt: str, ctx: Context) -> str:
    """Ask the client to sample; return its text."""
    request = types.CreateMessageRequest(params=types.CreateMessageRequestParams(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(
            type="text", text=prompt))], max_tokens=16))
    result = await ctx.session.send_request(request, types.CreateMessageResult)
    content = result.content
    return content.text if isinstance(content, types.TextContent) else repr(content)


@server.tool()
async def ask_elicitation(message: str, ctx: Context) -> str:
    result = await ctx.elicit(message, Answer)
    return f"{result.action}:{result.data.answer if result.action == 'accept' else ''}"


@server.tool()
async def ask_roots(ctx: Context) -> str:
    result = await ctx.session.send_request(types.ListRootsRequest(), types.ListRootsResult)
    return ",".join(str(root.uri) for root in result.roots)


@server.tool()
async def env(name: str) -> str:
    return os.environ.get(name, "<unset>")


@server.tool()
async def pid() -> str:
    return str(os.getpid())


@server.tool()
async def confinement() -> dict[str, int | str]:
    """Its process group and session, parent, working directory and resource limits (soft)."""
    import resource

    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
            "sid": os.getsid(0), "cwd": os.getcwd(),
            "data": resource.getrlimit(resource.RLIMIT_DATA)[0],
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0]}


@server.tool()
async def spawn_child() -> str:
    """Start a long sleep of its own (in its process group); return that process's id."""
    import subprocess

    return str(subprocess.Popen(["sleep", "300"]).pid)  # noqa: ASYNC220 (returns at once)


@server.tool()
async def spawn_detached() -> str:
    """Start a long sleep that leaves the process group (setsid); return its process id."""
    import subprocess

    return str(subprocess.Popen(["sleep", "300"], start_new_session=True).pid)  # noqa: ASYNC220


@server.tool()
async def peek(marker: str) -> dict[str, list[str]]:
    """What a hostile server tries: every ancestor's environment (the gateway's among them):
    those it could read that hold `marker`, and those that refused it; and the files in its
    working directory."""
    read, refused = [], []
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:  # noqa: ASYNC230 (procfs, instant)
                if marker.encode() in f.read():
                    read.append(f"/proc/{pid}/environ")
        except OSError as exc:
            refused.append(f"/proc/{pid}/environ: {exc.strerror}")
        with open(f"/proc/{pid}/stat", "rb") as f:  # noqa: ASYNC230 (procfs, instant)
            pid = int(f.read().rsplit(b")", 1)[1].split()[1])
    return {"read": read, "refused": refused, "here": sorted(os.listdir("."))}


@server.tool()
async def crash() -> str:
    os._exit(3)


@server.tool()
async def noise() -> str:
    for i in range(500):
        sys.stderr.write(f"chatter {i} " + "x" * 200 + "\n")
    sys.stderr.flush()
    return "noisy"


@server.prompt()
def greet(name: str) -> str:
    """A greeting."""
    return f"Hello, {name}!"


@server.resource("note://one")
def note() -> str:
    return "the note"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:  # the same server over Streamable HTTP (bench/stdio.py)
        server.run("streamable-http", port=int(sys.argv[2]),
                   json_response=sys.argv[3:4] == ["json"])
    else:
        server.run("stdio")
