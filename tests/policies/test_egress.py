import ipaddress
import socket
from typing import Any

import orjson
import pytest

from policies.egress import (
    API_DEFAULT_ZONES,
    Egress,
    EgressDenied,
    EgressDestinationDenied,
    UpstreamEgress,
    decide,
)
from proxy.auth.principal import ANONYMOUS, Principal
from proxy.chain import CallContext, Chain
from proxy.config import EgressConfig, parse_networks, validate_egress
from proxy.destinations import Destinations, SystemResolver, classify, is_metadata, parse_addresses
from proxy.errors import UpstreamUnavailable, render
from proxy.jsonrpc import McpMessage
from tests.builders import context, principal, tool_call
from tests.helpers import Clock

ALICE = principal("alice", "https://idp")
CALL = tool_call("find", id=7)
POLICIES = {"customers": "lan", "secrets": "local_only", "docs": "remote"}


class FakeResolver:
    """DNS as a table; counts questions, so a test can tell a pin from a fresh lookup."""

    def __init__(self, answers: dict[str, list[str]] | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[tuple[str, int]] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(self.answers[host])


def upstream(url: str = "http://crm.internal:9000/mcp", name: str = "crm",
             zones: tuple[str, ...] = ("loopback", "lan", "remote"),
             collections: tuple[str, ...] = ()) -> UpstreamEgress:
    return UpstreamEgress.from_url(name, url, zones, collections)


def make_destinations(resolver: FakeResolver, clock: Clock | None = None,
                      cfg: EgressConfig | None = None) -> Destinations:
    """The mechanism the policy asks, as create_app builds it."""
    return Destinations((), resolver, parse_addresses((cfg or EgressConfig()).metadata_addresses),
                        clock or Clock())


def make_egress(*upstreams: UpstreamEgress, answers: dict[str, list[str]] | None = None,
                trusted: tuple[str, ...] = (), clock: Clock | None = None,
                resolver: FakeResolver | None = None,
                destinations: Destinations | None = None) -> Egress:
    resolver = resolver or FakeResolver({"crm.internal": ["10.0.0.5"]} if answers is None
                                        else answers)
    return Egress(EgressConfig(collections=dict(POLICIES)), upstreams or (upstream(),),
                  destinations or make_destinations(resolver, clock),
                  parse_networks(trusted, "server.trusted_proxies"))


def make_ctx(peer: str | None = "127.0.0.1", principal: Principal = ALICE,
             endpoint: str = "crm", headers: tuple[tuple[str, str], ...] = ()) -> CallContext:
    return context(principal, endpoint, peer_ip=peer, headers=headers)


async def refusal(policy: Egress, ctx: CallContext,
                  call: McpMessage = CALL) -> Exception | None:
    try:
        await policy.check(call, ctx)
    except (EgressDenied, EgressDestinationDenied, UpstreamUnavailable) as exc:
        return exc
    return None


# -- classification ----------------------------------------------------------------------------

@pytest.mark.parametrize(("address", "zone"), [
    ("127.0.0.1", "loopback"),
    ("127.255.0.9", "loopback"),
    ("0.0.0.0", "loopback"),            # connect() to 0.0.0.0 reaches this host
    ("::1", "loopback"),
    ("::", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),   # IPv4-mapped
    ("64:ff9b::7f00:1", "loopback"),    # NAT64 of 127.0.0.1
    ("10.0.0.5", "lan"),
    ("172.16.0.1", "lan"),
    ("172.31.255.254", "lan"),
    ("192.168.1.1", "lan"),
    ("100.64.0.1", "lan"),              # CGNAT shared space
    ("169.254.169.254", "lan"),         # link-local
    ("fc00::1", "lan"),
    ("fd12:3456::1", "lan"),
    ("fe80::1", "lan"),
    ("::ffff:10.0.0.5", "lan"),
    ("::ffff:192.168.0.1", "lan"),
    ("192.0.2.1", "lan"),               # documentation: not globally routable
    ("224.0.0.1", "lan"),               # multicast
    ("240.0.0.1", "lan"),               # reserved
    ("255.255.255.255", "lan"),
    ("ff02::1", "lan"),
    ("2001:db8::1", "lan"),
    ("172.32.0.1", "remote"),
    ("100.128.0.1", "remote"),
    ("93.184.216.34", "remote"),
    ("8.8.8.8", "remote"),
    ("2606:4700::1111", "remote"),
    ("::ffff:8.8.8.8", "remote"),
])
def test_classify(address: str, zone: str) -> None:
    assert classify(ipaddress.ip_address(address)) == zone


@pytest.mark.parametrize(("address", "metadata"), [
    ("169.254.169.254", True),
    ("::ffff:169.254.169.254", True),
    ("fd00:ec2::254", True),
    ("169.254.170.2", True),
    ("100.100.100.200", True),
    ("fd20:ce::254", True),
    ("169.254.169.253", False),
    ("10.0.0.5", False),
])
def test_metadata_addresses(address: str, metadata: bool) -> None:
    assert is_metadata(ipaddress.ip_address(address)) is metadata


# -- where requests may go -----------------------------------------------------------------------

async def test_a_name_resolving_to_a_metadata_address_is_refused_naming_no_address() -> None:
    policy = make_egress(upstream("http://meta.internal/"),
                         answers={"meta.internal": ["169.254.169.254"]})
    exc = await refusal(policy, make_ctx())
    assert isinstance(exc, EgressDestinationDenied)
    assert exc.audit_reason == "egress_destination_denied"
    assert exc.audit_status == "error"
    assert "169.254.169.254" in str(exc)  # the operator's log names it ...
    status, _, body = render(exc, 7)
    assert status == 200
    assert orjson.loads(body) == {"jsonrpc": "2.0", "id": 7, "error": {
        "code": -32000, "message": "upstream not reachable under the egress policy"}}
    assert b"169.254" not in body  # ... the wire never does
    assert policy.pinned("crm") is None


@pytest.mark.parametrize("answer", ["::ffff:169.254.169.254", "fd00:ec2::254"])
async def test_metadata_is_refused_in_any_spelling(answer: str) -> None:
    policy = make_egress(answers={"crm.internal": [answer]})
    assert isinstance(await refusal(policy, make_ctx()), EgressDestinationDenied)


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest", "http://[fd00:ec2::254]/x"])
async def test_an_upstream_naming_a_metadata_address_literally_may_use_it(url: str) -> None:
    resolver = FakeResolver()
    policy = make_egress(upstream(url), resolver=resolver)
    assert await refusal(policy, make_ctx()) is None
    assert policy.pinned("crm") == [url.split("/")[2].strip("[]")]
    assert resolver.asked == []  # a literal needs no resolution


async def test_metadata_list_is_configurable() -> None:
    cfg = EgressConfig(metadata_addresses=["10.0.0.5"])
    policy = Egress(cfg, [upstream()],
                    make_destinations(FakeResolver({"crm.internal": ["10.0.0.5"]}), cfg=cfg), ())
    assert isinstance(await refusal(policy, make_ctx()), EgressDestinationDenied)


@pytest.mark.parametrize(("zones", "answer", "allowed"), [
    (("loopback", "lan", "remote"), "127.0.0.1", True),   # the config file's default: all
    (("loopback", "lan", "remote"), "10.0.0.5", True),
    (("loopback", "lan", "remote"), "93.184.216.34", True),
    (("lan",), "10.0.0.5", True),
    (("lan",), "fe80::1", True),
    (("lan",), "127.0.0.1", False),
    (("lan",), "93.184.216.34", False),
    (API_DEFAULT_ZONES, "93.184.216.34", True),          # registered at run time: remote only
    (API_DEFAULT_ZONES, "10.0.0.5", False),
    (API_DEFAULT_ZONES, "::ffff:127.0.0.1", False),
    (API_DEFAULT_ZONES, "0.0.0.0", False),
    (("loopback",), "127.0.0.1", True),
])
async def test_zones(zones: tuple[str, ...], answer: str, allowed: bool) -> None:
    policy = make_egress(upstream(zones=zones), answers={"crm.internal": [answer]})
    exc = await refusal(policy, make_ctx())
    assert (exc is None) is allowed
    assert policy.pinned("crm") == ([answer] if allowed else None)


async def test_a_rebinding_answer_mixing_zones_is_refused_whole() -> None:
    resolver = FakeResolver({"crm.internal": ["93.184.216.34"]})
    policy = make_egress(upstream(zones=("remote",)), resolver=resolver)
    assert await refusal(policy, make_ctx()) is None
    assert policy.pinned("crm") == ["93.184.216.34"]
    resolver.answers["crm.internal"] = ["93.184.216.34", "127.0.0.1"]
    assert isinstance(await refusal(policy, make_ctx()), EgressDestinationDenied)
    assert policy.pinned("crm") is None  # nothing left to dial


async def test_pins_expire_and_the_transport_rechecks_then() -> None:
    clock = Clock()
    resolver = FakeResolver({"crm.internal": ["10.0.0.5", "10.0.0.6"]})
    destinations = make_destinations(resolver, clock)
    policy = make_egress(destinations=destinations)
    await policy.check(CALL, make_ctx())
    assert policy.pinned("crm") == ["10.0.0.5", "10.0.0.6"]
    assert await destinations.admit("crm") == ["10.0.0.5", "10.0.0.6"]
    assert len(resolver.asked) == 1  # the transport used the pin: no second resolution
    clock.advance(30)
    assert policy.pinned("crm") is None
    resolver.answers["crm.internal"] = ["127.0.0.1"]
    assert await destinations.admit("crm") == ["127.0.0.1"]  # zones: all
    assert resolver.asked == [("crm.internal", 9000)] * 2


async def test_the_transport_check_refuses_too() -> None:
    destinations = make_destinations(FakeResolver({"crm.internal": ["10.0.0.5"]}))
    make_egress(upstream(zones=("remote",)), destinations=destinations)
    with pytest.raises(EgressDestinationDenied):
        await destinations.admit("crm")


async def test_a_name_that_does_not_resolve_is_unavailable_and_not_dialled() -> None:
    policy = make_egress(answers={})
    exc = await refusal(policy, make_ctx())
    assert isinstance(exc, UpstreamUnavailable)
    assert policy.pinned("crm") is None


async def test_an_upstream_without_an_egress_entry_is_refused() -> None:
    exc = await refusal(make_egress(), make_ctx(endpoint="nobody"))
    assert isinstance(exc, EgressDestinationDenied)


async def test_upstreams_added_and_removed_at_run_time() -> None:
    policy = make_egress(answers={"api.example": ["10.1.2.3"], "crm.internal": ["10.0.0.5"]})
    policy.add(upstream("https://api.example/mcp", name="api", zones=API_DEFAULT_ZONES))
    exc = await refusal(policy, make_ctx(endpoint="api"))
    assert isinstance(exc, EgressDestinationDenied)
    policy.discard("crm")
    assert isinstance(await refusal(policy, make_ctx()), EgressDestinationDenied)
    with pytest.raises(ValueError, match="'wan' is not one of"):
        policy.add(upstream(name="bad", zones=("wan",)))


# -- the caller's zone (the address itself: tests/proxy/auth/test_peer.py) -----------------------

async def test_every_x_forwarded_for_header_counts_in_order() -> None:
    policy = make_egress(upstream(collections=("customers",)), trusted=("10.0.0.1",))
    headers = (("x-forwarded-for", "10.0.0.7"), ("X-Forwarded-For", "8.8.8.8"))
    exc = await refusal(policy, make_ctx(peer="10.0.0.1", headers=headers))
    assert isinstance(exc, EgressDenied) and exc.egress_reason == "POLICY_LAN_ONLY"


# -- where data may go ---------------------------------------------------------------------------

@pytest.mark.parametrize(("policy", "zone", "authenticated", "reason"), [
    ("local_only", "loopback", False, None),
    ("local_only", "loopback", True, None),
    ("local_only", "lan", True, "POLICY_LOCAL_ONLY"),
    ("local_only", "lan", False, "POLICY_LOCAL_ONLY"),
    ("local_only", "remote", True, "POLICY_LOCAL_ONLY"),
    ("local_only", "remote", False, "POLICY_LOCAL_ONLY"),
    ("lan", "loopback", False, None),
    ("lan", "loopback", True, None),
    ("lan", "lan", True, None),
    ("lan", "lan", False, "AUTHENTICATION_REQUIRED"),
    ("lan", "remote", True, "POLICY_LAN_ONLY"),
    ("lan", "remote", False, "POLICY_LAN_ONLY"),
    ("remote", "loopback", False, None),
    ("remote", "loopback", True, None),
    ("remote", "lan", True, None),
    ("remote", "lan", False, "AUTHENTICATION_REQUIRED"),
    ("remote", "remote", True, None),
    ("remote", "remote", False, "AUTHENTICATION_REQUIRED"),
    ("remote", "unknown", True, "UNKNOWN_DESTINATION"),
    ("local_only", "unknown", True, "UNKNOWN_DESTINATION"),
])
def test_decide(policy: Any, zone: Any, authenticated: bool, reason: str | None) -> None:
    assert decide(policy, zone, authenticated) == reason


@pytest.mark.parametrize(("label", "peer", "principal", "reason"), [
    ("secrets", "127.0.0.1", ANONYMOUS, None),
    ("secrets", "10.0.0.9", ALICE, "POLICY_LOCAL_ONLY"),
    ("customers", "10.0.0.9", ALICE, None),
    ("customers", "10.0.0.9", ANONYMOUS, "AUTHENTICATION_REQUIRED"),
    ("customers", "8.8.8.8", ALICE, "POLICY_LAN_ONLY"),
    ("docs", "8.8.8.8", ALICE, None),
    ("docs", "8.8.8.8", ANONYMOUS, "AUTHENTICATION_REQUIRED"),
    ("docs", None, ALICE, "UNKNOWN_DESTINATION"),
])
async def test_the_policy_applies_the_table(label: str, peer: str | None, principal: Principal,
                                            reason: str | None) -> None:
    policy = make_egress(upstream(collections=(label,)))
    exc = await refusal(policy, make_ctx(peer=peer, principal=principal))
    if reason is None:
        assert exc is None
    else:
        assert isinstance(exc, EgressDenied) and exc.egress_reason == reason


async def test_unlabelled_upstreams_serve_anyone() -> None:
    assert await refusal(make_egress(), make_ctx(peer="8.8.8.8", principal=ANONYMOUS)) is None


async def test_the_most_restrictive_label_decides_and_a_denied_call_is_never_resolved() -> None:
    resolver = FakeResolver({"crm.internal": ["10.0.0.5"]})
    policy = make_egress(upstream(collections=("docs", "secrets", "customers")),
                         resolver=resolver)
    exc = await refusal(policy, make_ctx(peer="192.168.1.20"))
    assert isinstance(exc, EgressDenied)
    assert exc.audit_reason == "egress: POLICY_LOCAL_ONLY collection secrets"
    assert resolver.asked == []


# seed 000's closed enums, copied by hand from the schema
ACTIONS = {"retrieve", "serve", "publish", "remote_inference", "export", "clip_write", "unknown"}
ZONES = {"local_process", "loopback", "lan", "remote", "unknown"}
CONTENT = {"source", "snippet", "metadata", "attachment", "embedding", "capsule", "audit_log",
           "retrieval_trace", "unknown"}
EFFECTIVE = {"local_only", "lan", "remote", "unknown"}
SOURCES = {"explicit", "config_default", "legacy_default", "mixed", "unknown"}
REASONS = {"LOCAL_DESTINATION", "LAN_POLICY_AUTHENTICATED", "REMOTE_POLICY_AUTHENTICATED",
           "INVALID_INPUT", "NO_COLLECTION_POLICY", "COLLECTION_LIMIT_EXCEEDED",
           "INVALID_COLLECTION", "UNKNOWN_ACTION", "UNKNOWN_DESTINATION",
           "ACTION_DESTINATION_MISMATCH", "UNKNOWN_CONTENT_CLASS", "UNKNOWN_POLICY",
           "UNKNOWN_POLICY_SOURCE", "INVALID_POLICY_SOURCE_PAIR", "INVALID_CALLER",
           "CALLER_NOT_AUTHORIZED", "AUTHENTICATION_REQUIRED", "POLICY_LOCAL_ONLY",
           "POLICY_LAN_ONLY"}
AUDIT_KEYS = {"action", "destinationZone", "contentClass", "collectionCount", "collections",
              "effectivePolicy", "effectivePolicySource", "callerAuthenticated",
              "callerOperationAuthorized"}


def assert_seed_000(body: dict[str, Any]) -> None:
    assert set(body) == {"jsonrpc", "error", "id"} and body["jsonrpc"] == "2.0"
    assert isinstance(body["id"], (int, str, type(None)))
    error = body["error"]
    assert set(error) == {"code", "message", "data"}
    assert error["code"] in (-32000, -32003)
    data = error["data"]
    assert set(data) == {"code", "message", "reason", "audit"}
    assert data["code"] == "EGRESS_DENIED"
    assert data["message"] == error["message"] == "Operation blocked by collection egress policy"
    assert data["reason"] in REASONS
    audit = data["audit"]
    assert set(audit) == AUDIT_KEYS
    assert audit["action"] in ACTIONS
    assert audit["destinationZone"] in ZONES
    assert audit["contentClass"] in CONTENT
    assert isinstance(audit["collectionCount"], int) and audit["collectionCount"] >= 0
    assert isinstance(audit["collections"], list) and len(audit["collections"]) <= 64
    assert all(isinstance(c, str) for c in audit["collections"])
    assert audit["effectivePolicy"] in EFFECTIVE
    assert audit["effectivePolicySource"] in SOURCES
    assert audit["callerAuthenticated"] in (True, False, None)
    assert audit["callerOperationAuthorized"] in (True, False, None)


async def test_the_refusal_is_seed_000s_body_at_403() -> None:
    policy = make_egress(upstream(collections=("customers", "docs")))
    exc = await refusal(policy, make_ctx(peer="8.8.8.8"))
    assert isinstance(exc, EgressDenied)
    status, headers, raw = render(exc, 7)
    body = orjson.loads(raw)
    assert_seed_000(body)
    assert (status, headers["Content-Type"]) == (403, "application/json")
    assert body == {"jsonrpc": "2.0", "id": 7, "error": {
        "code": -32003,
        "message": "Operation blocked by collection egress policy",
        "data": {
            "code": "EGRESS_DENIED",
            "message": "Operation blocked by collection egress policy",
            "reason": "POLICY_LAN_ONLY",
            "audit": {
                "action": "serve",
                "destinationZone": "remote",
                "contentClass": "unknown",
                "collectionCount": 2,
                "collections": ["customers", "docs"],
                "effectivePolicy": "lan",
                "effectivePolicySource": "explicit",
                "callerAuthenticated": True,
                "callerOperationAuthorized": True,
            },
        },
    }}
    assert exc.audit == body["error"]["data"]["audit"]  # the same object for the audit record
    assert exc.audit_status == "denied"
    assert exc.audit_reason == "egress: POLICY_LAN_ONLY collection customers"


@pytest.mark.parametrize(("peer", "principal"), [
    (None, ALICE), ("10.0.0.9", ANONYMOUS), ("8.8.8.8", ANONYMOUS), ("10.0.0.9", ALICE)])
async def test_every_refusal_fits_the_schema(peer: str | None, principal: Principal) -> None:
    policy = make_egress(upstream(collections=("secrets",)))
    exc = await refusal(policy, make_ctx(peer=peer, principal=principal))
    assert isinstance(exc, EgressDenied)
    assert_seed_000(orjson.loads(render(exc, "req-1")[2]))


def test_the_bare_errors_still_speak_the_schema() -> None:
    denied = EgressDenied("egress: malformed")
    assert denied.egress_reason == "INVALID_INPUT" and denied.audit_reason == "egress: malformed"
    assert_seed_000(orjson.loads(render(denied, None)[2]))
    status, _, body = render(EgressDestinationDenied(), 1)
    assert status == 200
    message = orjson.loads(body)["error"]["message"]
    assert message == "upstream not reachable under the egress policy"


async def test_egress_runs_at_300_and_its_refusal_passes_the_chain_untouched() -> None:
    policy = make_egress(upstream(collections=("secrets",)))
    chain = Chain([policy])
    assert (policy.name, policy.order) == ("egress", 300)
    with pytest.raises(EgressDenied):
        await chain.run(CALL, make_ctx(peer="8.8.8.8"))


# -- resolution (the dial: tests/proxy/upstream/test_transport.py) ------------------------------------

async def test_the_system_resolver_answers_a_numeric_host_without_the_network() -> None:
    assert await SystemResolver().resolve("127.0.0.1", 80) == ["127.0.0.1"]


# -- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("collections", "metadata", "upstreams", "trusted", "message"), [
    ({"customers": "wan"}, None, [], [],
     "egress.collections.customers: 'wan' is not one of local_only, lan, remote"),
    ({"bad/label": "lan"}, None, [], [], "egress.collections: 'bad/label' must be 1-64"),
    ({}, ["169.254.169.254", "metadata"], [], [],
     "egress.metadata_addresses[1]: 'metadata' is not an IP address"),
    ({}, None, [("crm", "http://h/", ["lan", "wan"], [])], [],
     "upstreams[0].zones: 'wan' is not one of loopback, lan, remote"),
    ({}, None, [("crm", "http://h/", [], [])], [],
     "upstreams[0].zones: must name at least one of loopback, lan, remote"),
    ({"customers": "lan"}, None,
     [("a", "http://h/", ["lan"], ["customers"]), ("b", "http://h/", ["lan"], ["orders"])], [],
     "upstreams[1].collections: 'orders' has no policy in [egress.collections]"),
    ({"customers": "lan"}, None, [("a", "http://h/", ["lan"], ["customers", "customers"])], [],
     "upstreams[0].collections: a label appears twice"),
    ({f"c{i}": "lan" for i in range(65)}, None,
     [("a", "http://h/", ["lan"], [f"c{i}" for i in range(65)])], [],
     "upstreams[0].collections: more than 64 labels"),
    ({}, None, [("a", "http:///nohost", ["lan"], [])], [], "upstreams[0].url: "),
    ({}, None, [], ["10.0.0.1", "10.0.0.0/33"],
     "server.trusted_proxies[1]: '10.0.0.0/33' is not an IP address or network"),
])
def test_validation_names_the_key(collections: dict[str, str], metadata: list[str] | None,
                                  upstreams: list[Any], trusted: list[str],
                                  message: str) -> None:
    cfg = EgressConfig(collections=collections) if metadata is None else EgressConfig(
        collections=collections, metadata_addresses=metadata)
    with pytest.raises(ValueError) as info:
        validate_egress(cfg, upstreams, trusted)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_valid_config_passes() -> None:
    validate_egress(EgressConfig(collections={"customers": "lan"}),
                    [("crm", "http://10.0.0.5:9000/mcp", ["lan"], ["customers"]),
                     ("docs", "https://docs.example/mcp", ["loopback", "lan", "remote"], [])],
                    ["127.0.0.1", "10.0.0.0/8", "::1"])


def test_upstream_from_url() -> None:
    assert upstream("https://API.Example/mcp") == UpstreamEgress(
        "crm", "api.example", 443, ("loopback", "lan", "remote"), ())
    assert upstream("http://[::1]:8080/").host == "::1"
    assert upstream("http://[::1]:8080/").port == 8080
