"""The management API's access body and the config's access table are one definition
(proxy.strict.body_of): a field added to `AccessConfig` is in the API's bodies and its OpenAPI
document, and a validated body holds the config's own dataclass, which the access policy reads
with nothing converted by hand."""

from __future__ import annotations

import dataclasses

from proxy.api.openapi import document
from proxy.config import AccessConfig, EndpointConfig, ToolProfile, from_dict
from proxy.strict import ServerIn, ServerOut
from proxy.virtual.schema import EndpointIn

ACCESS = {"allow_groups": ["eng"], "tools_deny": ["delete_*"],
          "group_tools": {"eng": {"tools_allow": ["read_*"]}}}


def test_the_access_body_has_the_config_tables_fields_and_defaults() -> None:
    schemas = document()["components"]["schemas"]
    for name, table in (("AccessIn", AccessConfig), ("ToolProfileIn", ToolProfile)):
        assert list(schemas[name]["properties"]) == [f.name for f in dataclasses.fields(table)]
        assert schemas[name]["additionalProperties"] is False
    assert schemas["ServerIn"]["properties"]["access"] == {"$ref": "#/components/schemas/AccessIn"}


def test_a_validated_body_holds_the_config_dataclass() -> None:
    server = ServerIn.model_validate({"name": "crm", "url": "http://crm.test/mcp",
                                      "access": ACCESS})
    endpoint = EndpointIn.model_validate_json(
        '{"name": "all", "members": ["crm"], "access": {"allow_groups": ["eng"], '
        '"group_tools": {"eng": {"tools_allow": ["read_*"]}}}}')
    expected = AccessConfig(allow_groups=["eng"], tools_deny=["delete_*"],
                            group_tools={"eng": ToolProfile(tools_allow=["read_*"])})
    assert server.access == expected and type(server.access) is AccessConfig
    assert endpoint.access == dataclasses.replace(expected, tools_deny=[])
    assert type(endpoint.access.group_tools["eng"]) is ToolProfile
    assert ServerIn.model_validate({"name": "x", "url": "http://x.test/"}).access == AccessConfig()
    # and an endpoint's body is its config table's fields
    assert set(EndpointIn.model_fields) == {f.name for f in dataclasses.fields(EndpointConfig)}


def test_the_config_files_access_is_answered_as_the_bodys() -> None:
    cfg = from_dict({"auth": {"mode": "jwt", "issuers": [{"issuer": "i", "hs256_secret": "s" * 32,
                                                          "algorithms": ["HS256"]}]},
                     "upstreams": [{"name": "crm", "url": "http://crm.test/mcp",
                                    "access": ACCESS}]})
    out = ServerOut(name="crm", url="http://crm.test/mcp", timeout_s=1, total_timeout_s=1,
                    zones=["remote"], era="auto", source="config", mcp_url="http://gw/mcp/crm",
                    access=cfg.upstreams[0].access)
    assert out.access is cfg.upstreams[0].access
    assert out.model_dump(mode="json")["access"] == ServerIn.model_validate(
        {"name": "crm", "url": "http://crm.test/mcp", "access": ACCESS}).model_dump(
        mode="json")["access"]
