"""The upstream the conformance suite is run against: an "everything"-style server on the
official Python SDK (mcp 2.3), serving both protocol eras on one Streamable HTTP endpoint.

The suite's server scenarios call fixtures by name (tools `test_simple_text`,
`test_tool_with_progress`, ..., resources `test://static-text`, ..., prompts
`test_simple_prompt`, ...); this module provides them with nothing but the SDK's own server
machinery, so that whatever the suite finds when it talks to this server directly is the SDK's
behaviour, and whatever changes when it talks to it through Tollhouse is the gateway's.

`build_app()` returns a fresh ASGI app each time (an SDK app's session manager runs once):
stateful sessions with SSE answers for 2025-11-25, the SDK's sessionless handler for
2026-07-28, an in-memory event store so that SSE streams can be resumed (`Last-Event-ID`),
and the SDK's own DNS-rebinding guard (loopback Host and Origin only).
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Annotated, Any

import anyio
from mcp import types
from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer, RequestStateSecurity
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, Field

# a 1x1 PNG and a tiny WAV header: the suite checks type and mimeType, not the pixels
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
       "rkJggg==")
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

# 2026-07-28 requestState is sealed by the SDK with this key (the suite tampers with it and
# expects a refusal); a fixture value, at least 32 bytes
STATE_KEY = b"tollhouse-conformance-fixture-request-state-key!"


class MemoryEventStore(EventStore):
    """Every SSE event kept in order, so a client that reconnects with `Last-Event-ID` gets
    what came after it on the same stream."""

    def __init__(self) -> None:
        self._events: list[tuple[str, str, types.JSONRPCMessage | None]] = []
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = str(next(self._ids))
        self._events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str,
                                  send_callback: EventCallback) -> str | None:
        stream = next((s for s, e, _ in self._events if e == last_event_id), None)
        if stream is None:
            return None
        after = int(last_event_id)
        for s, e, message in list(self._events):
            if s == stream and int(e) > after and message is not None:
                await send_callback(EventMessage(message, e))
        return stream


def _text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


async def _log(ctx: Context, level: types.LoggingLevel, text: str) -> None:
    """A `notifications/message` on this request's stream (the typed notification, not the
    SDK's deprecated logging helpers)."""
    note = types.LoggingMessageNotification(
        params=types.LoggingMessageNotificationParams(level=level, data=text))
    await ctx.session.send_notification(note, related_request_id=ctx.request_id)


async def _ask(ctx: Context, request: Any, result_type: type[Any]) -> Any:
    """A server-to-client request on the tool call's own stream."""
    metadata = ServerMessageMetadata(related_request_id=ctx.request_context.request_id)
    return await ctx.session.send_request(request, result_type, metadata=metadata)


def _elicit_request(message: str, schema: dict[str, Any]) -> types.ElicitRequest:
    return types.ElicitRequest(params=types.ElicitRequestFormParams(
        message=message, requested_schema=schema))


def _string_schema(field: str) -> dict[str, Any]:
    return {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}


def _sampling_request(prompt: str) -> types.CreateMessageRequest:
    return types.CreateMessageRequest(params=types.CreateMessageRequestParams(
        messages=[types.SamplingMessage(role="user", content=_text(prompt))], max_tokens=64))


class _Answer(BaseModel):
    response: str = Field(description="The user's answer")


class _Defaults(BaseModel):
    name: str = Field(default="John Doe", description="User name")
    age: int = Field(default=30, description="User age")
    score: float = Field(default=95.5, description="User score")
    status: str = Field(default="active", description="User status",
                        json_schema_extra={"enum": ["active", "inactive", "pending"]})
    verified: bool = Field(default=True, description="Verification status")


class _Enums(BaseModel):
    untitledSingle: str = Field(description="Plain enum",
                                json_schema_extra={"enum": ["active", "inactive", "pending"]})
    titledSingle: str = Field(description="Titled single choice", json_schema_extra={
        "oneOf": [{"const": "low", "title": "Low"}, {"const": "medium", "title": "Medium"},
                  {"const": "high", "title": "High"}]})
    untitledMulti: list[str] = Field(description="Plain multiple choice", json_schema_extra={
        "items": {"type": "string", "enum": ["read", "write", "execute"]}})
    titledMulti: list[str] = Field(description="Titled multiple choice", json_schema_extra={
        "items": {"anyOf": [{"const": "feature", "title": "Feature"},
                            {"const": "bug", "title": "Bug"},
                            {"const": "docs", "title": "Docs"}]}})
    legacyEnum: str = Field(description="Enum with enumNames", json_schema_extra={
        "enum": ["small", "medium", "large"], "enumNames": ["Small", "Medium", "Large"]})


SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                          "properties": {"street": {"type": "string"},
                                         "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                   "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                   "phone": {"type": "string"}, "email": {"type": "string"}},
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _schema_tool() -> Tool:
    def json_schema_2020_12_tool() -> str:
        """Carries a JSON Schema 2020-12 inputSchema, kept as written in tools/list."""
        return "ok"

    return Tool.from_function(json_schema_2020_12_tool).model_copy(
        update={"parameters": SCHEMA_2020_12})


def build_server() -> MCPServer:
    server = MCPServer("tollhouse-conformance-upstream", version="1.0.0", tools=[_schema_tool()],
                       request_state_security=RequestStateSecurity(keys=[STATE_KEY]))
    subscriptions: set[str] = set()

    # ---- tools -------------------------------------------------------------------------
    @server.tool()
    def test_simple_text() -> str:
        """Answers one text block."""
        return "This is a simple text response for testing."

    @server.tool()
    def test_image_content() -> list[types.ImageContent]:
        """Answers one PNG image."""
        return [types.ImageContent(type="image", data=PNG, mime_type="image/png")]

    @server.tool()
    def test_audio_content() -> list[types.AudioContent]:
        """Answers one WAV clip."""
        return [types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]

    @server.tool()
    def test_embedded_resource() -> list[types.EmbeddedResource]:
        """Answers an embedded text resource."""
        return [types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="test://embedded-resource", mime_type="text/plain",
            text="This is an embedded resource content."))]

    @server.tool()
    def test_multiple_content_types() -> list[types.TextContent | types.ImageContent
                                              | types.EmbeddedResource]:
        """Answers text, an image and a resource together."""
        return [_text("Multiple content types test:"),
                types.ImageContent(type="image", data=PNG, mime_type="image/png"),
                types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
                    uri="test://mixed-content-resource", mime_type="application/json",
                    text='{"test": "data", "value": 123}'))]

    @server.tool()
    async def test_tool_with_logging(ctx: Context) -> str:
        """Sends three log notifications while it runs."""
        for step in ("Tool execution started", "Tool processing data",
                     "Tool execution completed"):
            await _log(ctx, "info", step)
            await anyio.sleep(0.02)
        return "Tool with logging executed successfully"

    @server.tool()
    async def test_logging_tool(ctx: Context) -> str:
        """Logs only what the request's log level lets through (2026-07-28)."""
        if ctx.session.protocol_version == "2026-07-28":
            # on this revision a log is sent only when the request asked for one
            level = (ctx.request_context.meta or {}).get("io.modelcontextprotocol/logLevel")
            if level:
                await _log(ctx, "info", "logging tool ran")
        else:
            await _log(ctx, "info", "logging tool ran")
        return "logged"

    @server.tool()
    async def test_tool_with_progress(ctx: Context) -> str:
        """Reports progress 0, 50 and 100 of 100."""
        for value in (0, 50, 100):
            await ctx.report_progress(progress=value, total=100,
                                      message=f"Completed step {value} of 100")
            await anyio.sleep(0.02)
        meta = ctx.request_context.meta or {}
        return str(meta.get("progress_token", meta.get("progressToken", 0)))

    @server.tool()
    def test_error_handling() -> str:
        """Fails: the SDK answers a tool result with isError."""
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool()
    async def test_sampling(prompt: str, ctx: Context) -> str:
        """Asks the client to sample (sampling/createMessage)."""
        result = await _ask(ctx, _sampling_request(prompt), types.CreateMessageResult)
        content = result.content
        text = content.text if isinstance(content, types.TextContent) else "No response"
        return f"LLM response: {text}"

    @server.tool()
    async def test_elicitation(message: str, ctx: Context) -> str:
        """Asks the user for one string (elicitation/create)."""
        result = await ctx.elicit(message=message, schema=_Answer)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"User response: action={result.action}, content={content}"

    @server.tool()
    async def test_streaming_elicitation(ctx: Context) -> str | types.InputRequiredResult:
        """Elicits one string (on 2026-07-28, which has no server-to-client requests, as an
        input-required result)."""
        if ctx.session.protocol_version != "2026-07-28":
            result = await ctx.elicit(message="What is your name?", schema=_Answer)
            return f"action={result.action}"
        answer = (ctx.input_responses or {}).get("name")
        if answer is not None:
            return "answered"
        return types.InputRequiredResult(input_requests={
            "name": _elicit_request("What is your name?", _string_schema("name"))})

    @server.tool()
    async def test_elicitation_sep1034_defaults(ctx: Context) -> str:
        """Elicits fields that all have defaults (SEP-1034)."""
        result = await ctx.elicit(message="Please provide user information", schema=_Defaults)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation result: action={result.action}, content={content}"

    @server.tool()
    async def test_elicitation_sep1330_enums(ctx: Context) -> str:
        """Elicits every kind of enum schema (SEP-1330)."""
        result = await ctx.elicit(message="Please choose", schema=_Enums)
        content = result.data.model_dump_json() if result.action == "accept" else "{}"
        return f"Elicitation completed: action={result.action}, content={content}"

    @server.tool()
    async def test_reconnection(ctx: Context) -> str:
        """Closes its SSE stream mid-call; the client resumes it with Last-Event-ID."""
        await _log(ctx, "info", "Before disconnect")
        await ctx.close_sse_stream()
        await anyio.sleep(0.2)
        await _log(ctx, "info", "After reconnect")
        return "Reconnection test completed"

    @server.tool()
    def test_x_mcp_header(region: Annotated[str, Field(
            description="Mirrored in the Mcp-Param-Region header",
            json_schema_extra={"x-mcp-header": "Region"})] = "<none>") -> str:
        """Has a parameter mirrored in a header (SEP-2243)."""
        return f"region={region}"

    @server.tool()
    async def test_missing_capability(ctx: Context) -> str:
        """Needs the client's sampling capability: -32021 without it."""
        caps = ctx.session.client_capabilities
        if caps is None or caps.sampling is None:
            raise MCPError(code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                           message="This tool requires the client 'sampling' capability",
                           data={"requiredCapabilities": {"sampling": {}}})
        return "sampling declared"

    @server.tool()
    async def test_trigger_tool_change(ctx: Context) -> str:
        """Adds and removes a tool, then says the list changed."""
        server.add_tool(lambda: "dynamic", name="test_dynamic_tool", description="dynamic")
        server.remove_tool("test_dynamic_tool")
        await ctx.notify_tools_changed()
        return "tool list changed"

    @server.tool()
    async def test_trigger_prompt_change(ctx: Context) -> str:
        """Says the prompt list changed."""
        await ctx.notify_prompts_changed()
        return "prompt list changed"

    # ---- 2026-07-28 input-required results (SEP-2322) ------------------------------------
    @server.tool()
    async def test_input_required_result_elicitation(
            ctx: Context) -> str | types.InputRequiredResult:
        """Asks for a name through an input-required result."""
        answer = (ctx.input_responses or {}).get("user_name")
        if answer is not None:
            name = (answer.content or {}).get("name", "?") \
                if isinstance(answer, types.ElicitResult) else "?"
            return f"Hello, {name}!"
        return types.InputRequiredResult(input_requests={
            "user_name": _elicit_request("What is your name?", _string_schema("name"))})

    @server.tool()
    async def test_input_required_result_sampling(
            ctx: Context) -> str | types.InputRequiredResult:
        """Asks for a sample through an input-required result."""
        answer = (ctx.input_responses or {}).get("capital_question")
        if answer is not None:
            text = answer.content.text if isinstance(answer, types.CreateMessageResult) \
                and isinstance(answer.content, types.TextContent) else "?"
            return f"Model said: {text}"
        return types.InputRequiredResult(input_requests={
            "capital_question": _sampling_request("What is the capital of France?")})

    @server.tool()
    async def test_input_required_result_list_roots(
            ctx: Context) -> str | types.InputRequiredResult:
        """Asks for the client's roots through an input-required result."""
        answer = (ctx.input_responses or {}).get("client_roots")
        if answer is not None:
            count = len(answer.roots) if isinstance(answer, types.ListRootsResult) else 0
            return f"Client exposed {count} root(s)."
        return types.InputRequiredResult(input_requests={"client_roots": types.ListRootsRequest()})

    confirm_schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                      "required": ["ok"]}

    @server.tool()
    async def test_input_required_result_request_state(
            ctx: Context) -> str | types.InputRequiredResult:
        """Round-trips a requestState."""
        if "confirm" in (ctx.input_responses or {}) and ctx.request_state == "state-nonce":
            return "state-ok: confirmation received"
        return types.InputRequiredResult(
            input_requests={"confirm": _elicit_request("Please confirm", confirm_schema)},
            request_state="state-nonce")

    @server.tool()
    async def test_input_required_result_multiple_inputs(
            ctx: Context) -> str | types.InputRequiredResult:
        """Asks for an elicitation, a sample and the roots at once."""
        if {"user_name", "greeting", "client_roots"} <= set(ctx.input_responses or {}):
            return "All inputs received."
        return types.InputRequiredResult(input_requests={
            "user_name": _elicit_request("What is your name?", _string_schema("name")),
            "greeting": _sampling_request("Generate a greeting"),
            "client_roots": types.ListRootsRequest()}, request_state="multiple-inputs")

    @server.tool()
    async def test_input_required_result_multi_round(
            ctx: Context) -> str | types.InputRequiredResult:
        """Three rounds, the state growing on each."""
        state = json.loads(ctx.request_state) if ctx.request_state else {"round": 0}
        responses = ctx.input_responses or {}
        step1 = _elicit_request("Step 1: What is your name?", _string_schema("name"))
        if state.get("round") == 1 and isinstance(responses.get("step1"), types.ElicitResult):
            name = (responses["step1"].content or {}).get("name")
            return types.InputRequiredResult(
                input_requests={"step2": _elicit_request("Step 2: What is your favorite color?",
                                                         _string_schema("color"))},
                request_state=json.dumps({"round": 2, "name": name}))
        if state.get("round") == 2 and isinstance(responses.get("step2"), types.ElicitResult):
            color = (responses["step2"].content or {}).get("color")
            return f"{state.get('name')} likes {color}."
        return types.InputRequiredResult(input_requests={"step1": step1},
                                         request_state=json.dumps({"round": 1}))

    @server.tool()
    async def test_input_required_result_tampered_state(
            ctx: Context) -> str | types.InputRequiredResult:
        """The SDK refuses a requestState that was not the one it sealed."""
        if ctx.request_state is None:
            return types.InputRequiredResult(
                input_requests={"confirm": _elicit_request("Please confirm", confirm_schema)},
                request_state="round-1")
        return f"state-ok: {ctx.request_state}"

    @server.tool()
    async def test_input_required_result_capabilities(ctx: Context) -> types.InputRequiredResult:
        """Asks only for what the client declared it can answer."""
        caps = ctx.client_capabilities
        wanted: dict[str, Any] = {}
        if caps is None or caps.sampling is not None:
            wanted["sample"] = _sampling_request("Say hello")
        if caps is None or caps.elicitation is not None:
            wanted["ask"] = _elicit_request("What is your name?", _string_schema("name"))
        return types.InputRequiredResult(input_requests=wanted, request_state="capability-gated")

    # ---- resources -----------------------------------------------------------------------
    @server.resource("test://static-text", mime_type="text/plain")
    def static_text() -> str:
        """A static text resource."""
        return "This is the content of the static text resource."

    @server.resource("test://static-binary", mime_type="image/png")
    def static_binary() -> bytes:
        """A static binary resource (a PNG)."""
        return base64.b64decode(PNG)

    @server.resource("test://template/{id}/data", mime_type="application/json")
    def template(id: str) -> str:
        """A resource template with one parameter."""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.resource("test://watched-resource", mime_type="text/plain")
    def watched() -> str:
        """A resource that can be subscribed to."""
        return "Watched resource content"

    # ---- prompts -------------------------------------------------------------------------
    @server.prompt()
    def test_simple_prompt() -> list[UserMessage]:
        """A prompt without arguments."""
        return [UserMessage(role="user", content=_text("This is a simple prompt for testing."))]

    @server.prompt()
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        """A prompt with two required arguments."""
        return [UserMessage(role="user", content=_text(
            f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))]

    @server.prompt()
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        """A prompt carrying an embedded resource."""
        return [UserMessage(role="user", content=types.EmbeddedResource(
                    type="resource", resource=types.TextResourceContents(
                        uri=resourceUri, mime_type="text/plain",
                        text="Embedded resource content for testing."))),
                UserMessage(role="user", content=_text("Please process the resource above."))]

    @server.prompt()
    def test_prompt_with_image() -> list[UserMessage]:
        """A prompt carrying an image."""
        return [UserMessage(role="user", content=types.ImageContent(
                    type="image", data=PNG, mime_type="image/png")),
                UserMessage(role="user", content=_text("Please analyze the image above."))]

    @server.prompt()
    async def test_input_required_result_prompt(
            ctx: Context) -> list[UserMessage] | types.InputRequiredResult:
        """A prompts/get answered with an input-required result first."""
        answer = (ctx.input_responses or {}).get("user_context")
        if isinstance(answer, types.ElicitResult):
            text = (answer.content or {}).get("context", "?")
            return [UserMessage(role="user", content=_text(f"Use the following context: {text}"))]
        return types.InputRequiredResult(input_requests={"user_context": _elicit_request(
            "What context should the prompt use?", _string_schema("context"))})

    # ---- completion, logging level, subscriptions ----------------------------------------
    @server.completion()
    async def complete(ref: Any, argument: types.CompletionArgument,
                       context: types.CompletionContext | None) -> types.Completion:
        return types.Completion(values=[], total=0, has_more=False)

    async def set_level(ctx: ServerRequestContext[Any],
                        params: types.SetLevelRequestParams) -> types.EmptyResult:
        return types.EmptyResult()

    async def subscribe(ctx: ServerRequestContext[Any],
                        params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscriptions.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(ctx: ServerRequestContext[Any],
                          params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        subscriptions.discard(str(params.uri))
        return types.EmptyResult()

    # MCPServer has no public hook for these three (its low-level Server takes them as
    # constructor arguments, which MCPServer does not pass through)
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    lowlevel.add_request_handler("resources/subscribe", types.SubscribeRequestParams, subscribe)
    lowlevel.add_request_handler("resources/unsubscribe", types.UnsubscribeRequestParams,
                                 unsubscribe)
    return server


def build_app(*, dns_rebinding_protection: bool = True) -> Any:
    """A fresh upstream ASGI app serving `/mcp` (serve it once). Without
    `dns_rebinding_protection` it accepts any Host and Origin, as the SDK does for a server
    that listens on a non-loopback address."""
    security = None if dns_rebinding_protection else TransportSecuritySettings(
        enable_dns_rebinding_protection=False)
    return build_server().streamable_http_app(
        streamable_http_path="/mcp", event_store=MemoryEventStore(), retry_interval=100,
        transport_security=security)
