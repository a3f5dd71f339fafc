"""No input produces a 500 or a traceback: arbitrary bodies and header values against a real
gateway, each answered in one of the documented shapes."""

from __future__ import annotations

import asyncio

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import MCP_HEADERS, make_config, mock_upstream, running_gateway

ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=12)
messages = st.fixed_dictionaries(
    {}, optional={"jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
                  "id": st.one_of(ints, st.text(max_size=8), st.none(), st.floats()),
                  "method": st.one_of(st.sampled_from(["initialize", "tools/call", "ping",
                                                       "notifications/cancelled"]),
                                      st.text(max_size=10), ints),
                  "params": json_values, "result": json_values, "error": json_values})
bodies = st.one_of(st.binary(max_size=200), messages.map(orjson.dumps),
                   st.just(b'{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"x"}'),
                   st.just(b"[" * 5000 + b"]" * 5000),
                   json_values.map(lambda v: orjson.dumps(
                       {"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": v}})),
                   st.lists(messages, max_size=3).map(orjson.dumps))
header_text = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                      max_size=40)


def test_arbitrary_requests_get_documented_answers() -> None:
    async def scenario() -> None:
        async with running_gateway(make_config(), mock_upstream().transport) as gw:
            @settings(max_examples=300, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])
            @given(body=bodies, session=st.one_of(st.none(), header_text),
                   origin=st.one_of(st.none(), header_text),
                   auth=st.one_of(st.none(), header_text),
                   method=st.sampled_from(["POST", "POST", "POST", "GET", "DELETE"]))
            def check(body: bytes, session: str | None, origin: str | None, auth: str | None,
                      method: str) -> None:
                headers = dict(MCP_HEADERS)
                for name, value in (("Mcp-Session-Id", session), ("Origin", origin),
                                    ("Authorization", auth)):
                    if value is not None:
                        headers[name] = value
                future = asyncio.run_coroutine_threadsafe(
                    gw.client.request(method, gw.endpoint(), content=body, headers=headers), loop)
                response = future.result(timeout=10)
                if response.status_code == 502:  # an upstream failure with no call to answer
                    obj = response.json()
                    assert set(obj) == {"jsonrpc", "error"} and obj["error"]["code"] == -32000
                    return
                assert response.status_code < 500, (response.status_code, response.text)
                if response.content:
                    obj = response.json()
                    assert isinstance(obj, dict)
                    assert "error" in obj or "result" in obj
                    if "jsonrpc" in obj and "error" in obj:
                        assert isinstance(obj["error"]["code"], int)
                        assert isinstance(obj["error"]["message"], str)

            loop = asyncio.get_running_loop()
            await asyncio.to_thread(check)
            await gw.audit.wait_for(1)

    asyncio.run(scenario())
