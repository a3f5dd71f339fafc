"""The one TOML file that configures a gateway, validated before anything starts.

Every table is a frozen dataclass whose field names are the TOML keys; `load` walks the
dataclasses, so an unknown key, a wrong type or a bad URL is refused with one line that names
the key. `${VAR}` inside any string is replaced from the environment, for secrets.

The policies' tables (`[[rate_limits]]`, `[egress]`) are here too, with their validation:
policies/ read their config from this module, and nothing here imports a policy.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import phonenumbers

from proxy.egress import DEFAULT_METADATA_ADDRESSES, ZONES, IPNetwork, UpstreamEgress
from proxy.state.ratelimit import US


class ConfigError(Exception):
    """Start-up refused: the message is one line that names the offending key."""

    def __init__(self, message: str) -> None:
        # a key or a value from the file it echoes stays on the line, escaped
        super().__init__(_LINE_BREAKS.sub(_escape, message))


# what would end or break a line in a terminal or a log: C0 and C1 controls, DEL, LS, PS
_LINE_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class ServerConfig:
    listen: str = "127.0.0.1:8080"
    public_url: str = "http://127.0.0.1:8080"
    max_request_bytes: int = 4 * 1024 * 1024
    # an answer the gateway must hold whole to rewrite it (a filtered list, a bridged result);
    # one nobody rewrites streams through at any size
    max_response_bytes: int = 16 * 1024 * 1024
    allowed_origins: list[str] = field(default_factory=list)
    session_idle_timeout_s: float = 3600.0
    max_sessions: int = 100_000
    shutdown_grace_s: float = 10.0
    # a comment line on an SSE response this long idle, so proxies keep it open; 0: none
    sse_heartbeat_s: float = 15.0
    trusted_proxies: list[str] = field(default_factory=list)
    # worker processes sharing the listen address (one socket, bound once by `tollhouse
    # serve`); more than one needs a shared [state] url (Redis)
    workers: int = 1
    # the event loop `tollhouse serve` runs on: "asyncio" (the standard library's) or
    # "uvloop" (libuv's; Linux and macOS, installed with Tollhouse there)
    event_loop: str = "asyncio"
    # once started, `tollhouse serve` collects the garbage of start-up and moves every object
    # then alive out of the cycle collector's reach (gc.freeze): a full collection then scans
    # what calls made, not the ~270,000 objects of the imported libraries (bench/README.md)
    gc_freeze: bool = True
    # the cycle collector's young-generation threshold (gc.set_threshold's first number;
    # Python's default 700): net allocations of tracked objects between two automatic
    # collections. Calls in flight allocate in bursts that pass 700 every few calls, and each
    # collection then walks every young object alive, more of them the more calls are in
    # flight; the timed collections below are what bounds cyclic garbage
    gc_threshold: int = 10_000
    # every this many seconds the young and middle generations are collected (gc.collect(1)),
    # and all of them (gc.collect(2)) once the heap has grown by a quarter since the last
    # time or an hour has passed: cyclic garbage is found within that time whatever the
    # threshold; 0: only the interpreter's automatic collections
    gc_sweep_s: float = 1.0

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


@dataclass(frozen=True)
class IssuerConfig:
    issuer: str
    jwks_url: str = ""
    public_key_pem: str = ""
    hs256_secret: str = ""
    algorithms: list[str] = field(default_factory=lambda: ["RS256"])
    audience: str = ""
    subject_claim: str = "sub"
    groups_claim: str = "groups"
    scopes_claim: str = "scope"
    name_claim: str = "name"
    leeway_s: float = 30.0
    jwks_refresh_s: float = 3600.0
    jwks_min_refetch_s: float = 60.0


@dataclass(frozen=True)
class LockoutConfig:
    max_failures: int = 10
    window_s: float = 60.0
    lockout_s: float = 300.0
    max_tracked: int = 100_000


@dataclass(frozen=True)
class OidcConfig:
    issuer: str = ""
    client_id: str = ""
    client_secret: str = ""
    admin_group: str = ""
    scopes: list[str] = field(default_factory=lambda: ["openid", "profile", "email"])
    groups_claim: str = "groups"
    name_claim: str = "preferred_username"

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)


@dataclass(frozen=True)
class OAuthServerConfig:
    enabled: bool = False
    access_token_ttl_s: int = 600
    refresh_token_ttl_s: int = 2592000
    code_ttl_s: int = 60
    key_rotation_s: int = 86400
    browser_session_ttl_s: int = 28800
    refresh_grace_s: int = 10
    loopback_any_port: bool = True
    reverse_domain_schemes: bool = True
    private_use_schemes: list[str] = field(default_factory=lambda: [
        "cursor", "vscode", "vscode-insiders", "windsurf"])


@dataclass(frozen=True)
class AuthConfig:
    mode: str = "none"
    issuers: list[IssuerConfig] = field(default_factory=list)
    authorization_servers: list[str] = field(default_factory=list)
    scopes_supported: list[str] = field(default_factory=list)
    signing_key_pem: str = ""
    lockout: LockoutConfig = field(default_factory=LockoutConfig)
    oidc: OidcConfig = field(default_factory=OidcConfig)


@dataclass(frozen=True)
class ToolProfile:
    tools_allow: list[str] = field(default_factory=list)
    tools_deny: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AccessConfig:
    allow_subjects: list[str] = field(default_factory=list)
    allow_groups: list[str] = field(default_factory=list)
    allow_scopes: list[str] = field(default_factory=list)
    allow_keys: list[str] = field(default_factory=list)
    tools_allow: list[str] = field(default_factory=list)
    tools_deny: list[str] = field(default_factory=list)
    group_tools: dict[str, ToolProfile] = field(default_factory=dict)
    prompts_allow: list[str] = field(default_factory=list)
    prompts_deny: list[str] = field(default_factory=list)
    resources_allow: list[str] = field(default_factory=list)
    resources_deny: list[str] = field(default_factory=list)

    @property
    def restricts_callers(self) -> bool:
        return bool(self.allow_subjects or self.allow_groups or self.allow_scopes
                    or self.allow_keys)


@dataclass(frozen=True)
class DatabaseConfig:
    url: str = "sqlite:///tollhouse.db"
    # how long a statement waits for a lock another writer holds before the operation gives
    # up (the management API answers 503 with Retry-After)
    busy_timeout_s: float = 10.0
    # where an answer's audit record is made durable before the answer leaves: "auto" (the
    # journal with SQLite, a commit with PostgreSQL), "on" (the journal: one append to a local
    # file, committed later), "off" (a database commit, waited for)
    audit_journal: str = "auto"
    # the journal's files are <this>.<pid>-<n>.<seq>.jsonl; default: beside a SQLite file,
    # else ./tollhouse.audit-journal. It must be on a volume that outlives the process.
    audit_journal_path: str = ""
    # with the journal on: how long the audit writer lets records gather before it commits
    # them together (0: each as soon as the writer is free); no answer waits for it, only how
    # soon another process reads a record (this one's audit queries commit what it holds)
    # and its usage event is sent; 100 ms: a batch's fixed cost (five rollups, the commit)
    # shared by five times the records of 20 ms, 3-4 % of a call's CPU at c=16-64
    audit_commit_window_ms: float = 100.0

    def journal(self, sqlite_path: str | None) -> str | None:
        """The journal's base path, or None when answers wait for a commit instead."""
        on = self.audit_journal == "on" or (self.audit_journal == "auto"
                                            and sqlite_path is not None)
        if not on:
            return None
        if self.audit_journal_path:
            return self.audit_journal_path
        return f"{sqlite_path}.audit-journal" if sqlite_path else "tollhouse.audit-journal"


@dataclass(frozen=True)
class StateConfig:
    """Where the live state is kept (proxy.state): "memory", in this one process, or a Redis
    (`redis://` or `rediss://` for TLS) that every gateway process of a deployment shares."""

    url: str = "memory"
    key_prefix: str = "tollhouse:"  # every key and pub/sub channel starts with it
    # how long one Redis command may take before the request is answered 503 (and how long
    # connecting may take): the bound on detecting an unreachable Redis
    timeout_s: float = 1.0

    @property
    def shared(self) -> bool:
        return self.url != "memory"


@dataclass(frozen=True)
class UpstreamOAuthConfig:
    """How Tollhouse gets each person's own token for a per_user upstream."""

    client_id: str = ""
    client_secret: str = ""
    authorization_endpoint: str = ""
    token_endpoint: str = ""
    revocation_endpoint: str = ""
    scopes: list[str] = field(default_factory=list)
    discover: bool = False
    refresh_margin_s: float = 60.0
    # the RFC 8707 resource the tokens are asked for; empty: the upstream's url (a stdio
    # upstream has none, so none is named unless set)
    resource: str = ""


@dataclass(frozen=True)
class ScreeningConfig:
    """`[upstreams.screening]`: the definitions an upstream lists, checked (README,
    "Guardrails"). "warn" audits a flagged one and passes it; "hide" also hides it."""

    mode: str = "warn"  # "off" | "warn" | "hide"
    max_description_chars: int = 4096
    max_schema_bytes: int = 65536


@dataclass(frozen=True)
class PinningConfig:
    """`[upstreams.pinning]`: tool definitions pinned on first sight; a change is hidden until
    approved ("approve") or only audited ("warn")."""

    mode: str = "off"  # "off" | "warn" | "approve"


@dataclass(frozen=True)
class GuardrailRule:
    """One `[[guardrails]]` table: where to look for secrets and personal data, and what to do
    with what is found."""

    name: str
    endpoints: list[str] = field(default_factory=list)  # empty: all
    tools: list[str] = field(default_factory=lambda: ["*"])  # tool, prompt names; resource URIs
    on: list[str] = field(default_factory=lambda: ["arguments", "results"])
    detect: list[str] = field(default_factory=lambda: [
        "secrets", "card_numbers", "iban", "email", "phone"])
    action: str = "redact"  # "redact" | "deny" | "audit"
    phone_region: str = "US"  # how a phone number without a +country prefix is read


@dataclass(frozen=True)
class PlaceholderConfig:
    """Where a `{name}` of a per-caller upstream URL comes from (proxy.upstream.template)."""

    claim: str = ""  # the token claim (default: the placeholder's name)
    attribute: str = ""  # the person's attribute, failing the claim (default: the claim)
    pattern: str = "[a-z0-9-]{1,63}"  # anchored


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    url: str = ""  # required for transport "http"; none for "stdio"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    total_timeout_s: float = 300.0
    access: AccessConfig = field(default_factory=AccessConfig)
    identity: str = "none"
    identity_audience: str = ""
    era: str = "auto"
    zones: list[str] = field(default_factory=lambda: list(ZONES))
    collections: list[str] = field(default_factory=list)
    auth: str = "static"
    oauth: UpstreamOAuthConfig = field(default_factory=UpstreamOAuthConfig)
    screening: ScreeningConfig = field(default_factory=ScreeningConfig)
    pinning: PinningConfig = field(default_factory=PinningConfig)
    placeholders: dict[str, PlaceholderConfig] = field(default_factory=dict)
    max_resolved: int = 256  # per-caller URL: resolved upstreams (and pools) kept, LRU

    @property
    def templated(self) -> bool:
        """A per-caller upstream: its URL has placeholders."""
        return "{" in self.url or bool(self.placeholders)

    # a local MCP server the gateway runs and speaks to on stdin/stdout (README, "Local
    # upstreams: stdio servers"); every key below is for transport = "stdio" only
    transport: str = "http"
    command: str = ""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the process's only environment
    cwd: str = ""  # empty: / (never the gateway's own directory, where its data may be)
    process: str = "shared"  # or "per_user": one process per person
    max_processes: int = 50
    idle_stop_s: float = 600.0
    start_timeout_s: float = 30.0  # spawn to the answer to `initialize`
    token_env: str = ""  # per_user: the variable that carries the person's upstream token
    run_as: str = ""  # a user to run the process as (the gateway must be root to switch)
    memory_limit_mb: int = 2048  # RLIMIT_DATA; 0: none
    open_files_limit: int = 1024  # RLIMIT_NOFILE; 0: the gateway's
    cpu_limit_s: int = 0  # RLIMIT_CPU; 0: none
    max_line_bytes: int = 16 * 1024 * 1024  # one JSON-RPC message on stdout, at most

    @property
    def stdio(self) -> bool:
        return self.transport == "stdio"


@dataclass(frozen=True)
class EndpointConfig:
    """One `[[endpoints]]` table: a virtual endpoint, several upstreams behind one
    /mcp/<name> (proxy/virtual/)."""

    name: str
    members: list[str]
    separator: str = "__"
    list_timeout_s: float = 2.0
    aliases: dict[str, str] = field(default_factory=dict)
    access: AccessConfig = field(default_factory=AccessConfig)
    total_timeout_s: float = 300.0


@dataclass(frozen=True)
class MeteringConfig:
    hook: str = ""        # "module:object" with async authorize(request) and record(event)
    url: str = ""         # or the HTTP webhook
    secret: str = ""      # HMAC-SHA256 key for the webhook's X-Tollhouse-Signature
    timeout_ms: int = 500
    on_error: str = "deny"
    methods: list[str] = field(default_factory=lambda: ["tools/call"])
    retry_max_s: float = 300.0
    # a delivered usage event stays in the outbox this long (to see what was sent), then goes
    keep_delivered_h: float = 24.0

    @property
    def enabled(self) -> bool:
        return bool(self.hook or self.url)


@dataclass(frozen=True)
class RateLimitRule:
    """One `[[rate_limits]]` table. `burst` is how many calls may arrive at once after a quiet
    spell; 0 means the rate's own count, so "100/h" lets the hour's 100 calls come together,
    as "100 per hour" reads. A burst of 1 spaces every call evenly."""

    name: str
    key: str = "principal"
    methods: list[str] = field(default_factory=lambda: ["tools/call"])
    rate: str = "10/s"
    burst: int = 0
    endpoints: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EgressConfig:
    """`[egress]`. `collections` maps a data label to the farthest zone its data may be served
    to. `metadata_addresses` replaces, not extends, the built-in list."""

    collections: dict[str, str] = field(default_factory=dict)
    metadata_addresses: list[str] = field(default_factory=lambda: list(DEFAULT_METADATA_ADDRESSES))


@dataclass(frozen=True)
class ObservabilityConfig:
    """`[observability]`: the Prometheus scrape endpoint, tracing and the log line format
    (README, "Operating Tollhouse"). `metrics_token` is a secret (use `${ENV}`)."""

    metrics: bool = True
    metrics_token: str = ""  # empty: no token, and /metrics answers only on loopback
    metrics_public: bool = False  # unless this is true
    otlp_endpoint: str = ""  # empty: tracing off
    service_name: str = "tollhouse"
    log_format: str = "text"  # or "json"


@dataclass(frozen=True)
class ConsoleConfig:
    """`[console]`: the web console at /console/ (README, "Web console"), behind the sign-in
    pages, which it turns on."""

    enabled: bool = True


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    state: StateConfig = field(default_factory=StateConfig)
    upstreams: list[UpstreamConfig] = field(default_factory=list)
    endpoints: list[EndpointConfig] = field(default_factory=list)
    rate_limits: list[RateLimitRule] = field(default_factory=list)
    metering: MeteringConfig = field(default_factory=MeteringConfig)
    egress: EgressConfig = field(default_factory=EgressConfig)
    oauth_server: OAuthServerConfig = field(default_factory=OAuthServerConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    guardrails: list[GuardrailRule] = field(default_factory=list)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)

    def upstream(self, name: str) -> UpstreamConfig | None:
        return next((u for u in self.upstreams if u.name == name), None)


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_AUTH_MODES = ("none", "jwt")
_IDENTITY_MODES = ("none", "headers", "jwt")
_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
               "EdDSA", "HS256", "HS384", "HS512")


def load(path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None) -> Config:
    """Read, substitute and validate the file at `path`; raise ConfigError on the first fault."""
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
    return from_dict(raw, os.environ if env is None else env, base_dir=Path(path).parent)


def from_dict(raw: dict[str, Any], env: typing.Mapping[str, str] | None = None,
              base_dir: Path | None = None) -> Config:
    cfg: Config = _build(Config, raw, "", os.environ if env is None else env)
    validate(cfg, base_dir or Path.cwd())
    return cfg


def validate(cfg: Config, base_dir: Path) -> None:
    """Every check across keys and tables; raise ConfigError on the first fault. A reload
    runs it again on the config it would apply (proxy.reload)."""
    _check(cfg, base_dir)
    _check_endpoints(cfg)
    _check_observability(cfg.observability)
    _check_policies(cfg)


def _build(cls: type[Any], raw: Any, where: str, env: typing.Mapping[str, str]) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {where or 'the file'} must be a table")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in fields:
            raise ConfigError(f"config: unknown key '{_join(where, key)}'")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key = _join(where, name)
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"config: missing required key '{key}'")
            continue
        kwargs[name] = _value(hints[name], raw[name], key, env)
    return cls(**kwargs)


def _value(tp: Any, raw: Any, key: str, env: typing.Mapping[str, str]) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, raw, key, env)  # type: ignore[arg-type]
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(raw, list):
            raise ConfigError(f"config: '{key}' must be an array, got {_kind(raw)}")
        return [_value(item, v, f"{key}[{i}]", env) for i, v in enumerate(raw)]
    if origin is dict:
        _, item = typing.get_args(tp)
        if not isinstance(raw, dict):
            raise ConfigError(f"config: '{key}' must be a table, got {_kind(raw)}")
        return {str(k): _value(item, v, f"{key}.{k}", env) for k, v in raw.items()}
    if tp is str:
        if not isinstance(raw, str):
            raise ConfigError(f"config: '{key}' must be a string, got {_kind(raw)}")
        return _substitute(raw, key, env)
    if tp is bool:
        if not isinstance(raw, bool):
            raise ConfigError(f"config: '{key}' must be true or false, got {_kind(raw)}")
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"config: '{key}' must be an integer, got {_kind(raw)}")
        return raw
    if tp is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ConfigError(f"config: '{key}' must be a number, got {_kind(raw)}")
        return float(raw)
    if isinstance(tp, types.UnionType):  # pragma: no cover - no optional fields yet
        raise ConfigError(f"config: '{key}' has an unsupported type")
    raise ConfigError(f"config: '{key}' has an unsupported type")  # pragma: no cover


STATE_SCHEMES = ("redis://", "rediss://")


def _check_state(cfg: Config) -> None:
    state = cfg.state
    # only the scheme is ever shown: a store URL may hold a password
    if state.url != "memory" and not state.url.startswith(STATE_SCHEMES):
        scheme = state.url.partition("://")[0] if "://" in state.url else state.url
        raise ConfigError(f"config: 'state.url' must be \"memory\", redis://HOST:PORT/DB or "
                          f"rediss://HOST:PORT/DB ({scheme[:20]!r} is not one)")
    if state.shared:
        from urllib.parse import urlsplit
        try:
            parts = urlsplit(state.url)
            port = parts.port
            db = parts.path.strip("/")
        except ValueError:
            raise ConfigError("config: 'state.url' is not a valid Redis URL (its port is not a "
                              "number)") from None
        if not parts.hostname or (db and not db.isdigit()) or port == 0:
            raise ConfigError("config: 'state.url' must name a host, and a database number "
                              "if any: redis://HOST:PORT/DB")
    if not state.key_prefix or len(state.key_prefix) > 64 or any(
            c.isspace() or not c.isprintable() for c in state.key_prefix):
        raise ConfigError("config: 'state.key_prefix' must be 1-64 printable characters "
                          "without spaces")
    if not 0.05 <= state.timeout_s <= 30:
        raise ConfigError("config: 'state.timeout_s' must be between 0.05 and 30 seconds")
    if not 1 <= cfg.server.workers <= 64:
        raise ConfigError("config: 'server.workers' must be between 1 and 64")
    if cfg.server.event_loop not in ("asyncio", "uvloop"):
        raise ConfigError("config: 'server.event_loop' must be asyncio or uvloop")
    if cfg.server.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise ConfigError("config: 'server.event_loop' = uvloop needs the uvloop package, "
                          "which is not installed here (pip install uvloop)")
    if cfg.server.workers > 1 and not state.shared:
        raise ConfigError(f"config: 'server.workers' = {cfg.server.workers} needs a shared "
                          "'state.url' (redis://...): with \"memory\" each worker would keep "
                          "its own sessions, cancellations and limits")


def _substitute(text: str, key: str, env: typing.Mapping[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ConfigError(f"config: '{key}' refers to ${{{name}}}, which is not set")
        return env[name]

    return _ENV_REF.sub(repl, text) if "${" in text else text


def _check(cfg: Config, base_dir: Path) -> None:
    server = cfg.server
    if ":" not in server.listen:
        raise ConfigError("config: 'server.listen' must be host:port")
    try:
        port = server.port
    except ValueError:
        raise ConfigError("config: 'server.listen' must end in a port number") from None
    if not 0 <= port <= 65535:
        raise ConfigError("config: 'server.listen' port must be between 0 and 65535")
    _url(server.public_url, "server.public_url")
    for i, origin in enumerate(server.allowed_origins):
        _url(origin, f"server.allowed_origins[{i}]")
    _positive(server.max_request_bytes, "server.max_request_bytes")
    _positive(server.max_response_bytes, "server.max_response_bytes")
    _positive(server.session_idle_timeout_s, "server.session_idle_timeout_s")
    _positive(server.max_sessions, "server.max_sessions")
    if not 0 < server.shutdown_grace_s <= 3600:
        raise ConfigError("config: 'server.shutdown_grace_s' must be greater than 0 and at most "
                          "3600 seconds")
    if not 100 <= server.gc_threshold <= 1_000_000:
        raise ConfigError("config: 'server.gc_threshold' must be between 100 and 1000000")
    if server.gc_sweep_s != 0 and not 0.01 <= server.gc_sweep_s <= 3600:
        raise ConfigError("config: 'server.gc_sweep_s' must be 0 (no timed collections) or "
                          "between 0.01 and 3600 seconds")
    if server.sse_heartbeat_s != 0 and not 0.05 <= server.sse_heartbeat_s <= 3600:
        raise ConfigError("config: 'server.sse_heartbeat_s' must be 0 (no heartbeat) or between "
                          "0.05 and 3600 seconds")
    if cfg.auth.mode not in _AUTH_MODES:
        raise ConfigError(f"config: 'auth.mode' must be one of {', '.join(_AUTH_MODES)}")
    if cfg.auth.mode == "none" and not _is_loopback(server.host):
        raise ConfigError("config: 'auth.mode' = \"none\" is refused on a non-loopback "
                          f"listen address ({server.host}); configure auth")
    for i, iss in enumerate(cfg.auth.issuers):
        _check_issuer(iss, f"auth.issuers[{i}]", base_dir)
    for i, server_url in enumerate(cfg.auth.authorization_servers):
        _url(server_url, f"auth.authorization_servers[{i}]")
    oidc = cfg.auth.oidc
    if oidc.enabled:
        _url(oidc.issuer, "auth.oidc.issuer")
        if not oidc.client_id:
            raise ConfigError("config: 'auth.oidc.client_id' is required with auth.oidc.issuer")
        if "openid" not in oidc.scopes:
            raise ConfigError("config: 'auth.oidc.scopes' must include openid")
    oauth = cfg.oauth_server
    for key in ("access_token_ttl_s", "refresh_token_ttl_s", "code_ttl_s", "key_rotation_s",
                "browser_session_ttl_s"):
        _positive(getattr(oauth, key), f"oauth_server.{key}")
    if not 0 <= oauth.refresh_grace_s <= 60:
        raise ConfigError("config: 'oauth_server.refresh_grace_s' must be between 0 (off) and "
                          "60 seconds")
    for scheme in oauth.private_use_schemes:
        if not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) or scheme in (
                "http", "https", "javascript", "data", "file", "blob", "about", "vbscript"):
            raise ConfigError(f"config: 'oauth_server.private_use_schemes' holds {scheme!r}: "
                              "a lower-case URI scheme an app claims, never one a browser "
                              "handles itself")
    if oauth.enabled and cfg.auth.mode != "jwt":
        raise ConfigError("config: 'oauth_server.enabled' needs auth.mode = \"jwt\"")
    lock = cfg.auth.lockout
    _positive(lock.max_failures, "auth.lockout.max_failures")
    _positive(lock.window_s, "auth.lockout.window_s")
    _positive(lock.lockout_s, "auth.lockout.lockout_s")
    _positive(lock.max_tracked, "auth.lockout.max_tracked")
    _positive(cfg.database.busy_timeout_s, "database.busy_timeout_s")
    if not 0 <= cfg.database.audit_commit_window_ms <= 1000:
        raise ConfigError("config: 'database.audit_commit_window_ms' must be between 0 and 1000")
    if cfg.database.audit_journal not in ("auto", "on", "off"):
        raise ConfigError("config: 'database.audit_journal' must be \"auto\", \"on\" or "
                          "\"off\"")
    if not cfg.database.url.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise ConfigError("config: 'database.url' must be sqlite:///PATH or "
                          "postgresql://USER:PASSWORD@HOST:PORT/DBNAME")
    _check_state(cfg)
    seen: set[str] = set()
    for i, up in enumerate(cfg.upstreams):
        where = f"upstreams[{i}]"
        _check_name(up.name, where, seen, "upstream")
        if up.transport not in ("http", "stdio"):
            raise ConfigError(f"config: '{where}.transport' must be http or stdio")
        if up.stdio:
            _check_stdio(up, where, cfg.auth.mode)
        else:
            if not up.url:
                raise ConfigError(f"config: missing required key '{where}.url'")
            if up.templated:
                _template(up, where)
            else:
                _url(up.url, f"{where}.url")
            for key in _STDIO_ONLY:
                if getattr(up, key):
                    raise ConfigError(f"config: '{where}.{key}' is for transport = \"stdio\"")
        _positive(up.timeout_s, f"{where}.timeout_s")
        _positive(up.total_timeout_s, f"{where}.total_timeout_s")
        for header in up.headers:
            if not re.match(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", header):
                raise ConfigError(f"config: '{where}.headers' has an invalid header name")
        if up.auth not in ("static", "per_user"):
            raise ConfigError(f"config: '{where}.auth' must be static or per_user")
        if up.auth == "per_user":
            o = up.oauth
            if up.stdio and o.discover:
                raise ConfigError(f"config: '{where}.oauth.discover' needs a URL to discover "
                                  "from; a stdio upstream names its endpoints")
            if not o.discover and not (o.authorization_endpoint and o.token_endpoint
                                       and o.client_id):
                raise ConfigError(f"config: '{where}.oauth' needs client_id, "
                                  "authorization_endpoint and token_endpoint, or discover = true")
            for key in ("authorization_endpoint", "token_endpoint", "revocation_endpoint",
                        "resource"):
                if getattr(o, key):
                    _url(getattr(o, key), f"{where}.oauth.{key}")
            if cfg.auth.mode != "jwt":
                raise ConfigError(f"config: '{where}.auth' = \"per_user\" needs auth.mode = "
                                  "\"jwt\": every caller is one anonymous principal otherwise")
            if any(h.lower() == "authorization" for h in up.headers):
                raise ConfigError(f"config: '{where}.headers' sets Authorization, which a "
                                  "per_user upstream takes from each person's connection")
        if up.era not in ("auto", "legacy", "modern"):
            raise ConfigError(f"config: '{where}.era' must be one of auto, legacy, modern")
        if up.identity not in _IDENTITY_MODES:
            raise ConfigError(f"config: '{where}.identity' must be one of "
                              f"{', '.join(_IDENTITY_MODES)}")
        if up.access.restricts_callers and cfg.auth.mode == "none":
            raise ConfigError(f"config: '{where}.access' restricts callers, which needs "
                              "auth.mode = \"jwt\" (every caller is anonymous in mode none)")


def _check_name(name: str, where: str, seen: set[str], noun: str) -> None:
    if not _NAME.match(name):
        raise ConfigError(f"config: '{where}.name' must be 1-64 letters, digits, '-', '_' "
                          "or '.', starting with a letter or digit")
    if name in seen:
        raise ConfigError(f"config: '{where}.name' repeats the {noun} name '{name}'")
    seen.add(name)


def _check_endpoints(cfg: Config) -> None:
    """Virtual endpoints: each collision the file itself shows stops start-up before any
    member is contacted (the rules are proxy.virtual.naming's, shared with /api/v1)."""
    from proxy.virtual.naming import SEPARATOR_RULE, config_collision

    seen: set[str] = set()
    for i, ep in enumerate(cfg.endpoints):
        where = f"endpoints[{i}]"
        _check_name(ep.name, where, seen, "endpoint")
        if not ep.members:
            raise ConfigError(f"config: '{where}.members' must name at least one upstream")
        for member in ep.members:
            if not _NAME.match(member):
                raise ConfigError(f"config: '{where}.members' has an invalid name {member!r}")
        if not SEPARATOR_RULE.match(ep.separator):
            raise ConfigError(f"config: '{where}.separator' must be 1-8 letters, digits, "
                              "'_', '-' or '.'")
        if not 0 < ep.list_timeout_s <= 60:
            raise ConfigError(f"config: '{where}.list_timeout_s' must be greater than 0 and "
                              "at most 60 seconds")
        _positive(ep.total_timeout_s, f"{where}.total_timeout_s")
        clash = config_collision(ep.name, ep.members, ep.separator, ep.aliases,
                                 [u.name for u in cfg.upstreams])
        if clash is not None:
            raise ConfigError(f"config: {clash}")
        if ep.access.restricts_callers and cfg.auth.mode == "none":
            raise ConfigError(f"config: '{where}.access' restricts callers, which needs "
                              "auth.mode = \"jwt\" (every caller is anonymous in mode none)")


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_STDIO_ONLY = ("command", "args", "env", "cwd", "token_env", "run_as")


def _check_stdio(up: UpstreamConfig, where: str, mode: str) -> None:
    if up.url:
        raise ConfigError(f"config: '{where}.url' is not for a stdio upstream (it has a "
                          "command)")
    if not up.command:
        raise ConfigError(f"config: missing required key '{where}.command'")
    if up.headers or up.identity != "none":
        raise ConfigError(f"config: '{where}' is a stdio upstream: headers and identity "
                          "are for HTTP upstreams")
    if up.era == "modern":
        raise ConfigError(f"config: '{where}.era' must be auto or legacy: a stdio server "
                          "speaks 2025-11-25")
    for name in (*up.env, *([up.token_env] if up.token_env else [])):
        if not _ENV_NAME.match(name):
            raise ConfigError(f"config: '{where}.env' has an invalid variable name")
    if up.process not in ("shared", "per_user"):
        raise ConfigError(f"config: '{where}.process' must be shared or per_user")
    if up.token_env and up.auth != "per_user":
        raise ConfigError(f"config: '{where}.token_env' needs auth = \"per_user\" (the "
                          "token is the person's own, from the connect flow)")
    if up.auth == "per_user" and (up.process != "per_user" or not up.token_env):
        raise ConfigError(f"config: '{where}.auth' = \"per_user\" on a stdio upstream needs "
                          "process = \"per_user\" and token_env: one process per person, "
                          "with that person's token")
    if up.max_processes < 1:
        raise ConfigError(f"config: '{where}.max_processes' must be at least 1")
    if up.process == "per_user" and mode != "jwt":
        raise ConfigError(f"config: '{where}.process' = \"per_user\" needs auth.mode = "
                          "\"jwt\": every caller is one anonymous principal otherwise")
    for key in ("idle_stop_s", "start_timeout_s"):
        _positive(getattr(up, key), f"{where}.{key}")
    for key in ("memory_limit_mb", "open_files_limit", "cpu_limit_s"):
        if getattr(up, key) < 0:
            raise ConfigError(f"config: '{where}.{key}' must be 0 (none) or more")
    if 0 < up.memory_limit_mb < 256:
        raise ConfigError(f"config: '{where}.memory_limit_mb' must be 0 or at least 256")
    if 0 < up.open_files_limit < 16:
        raise ConfigError(f"config: '{where}.open_files_limit' must be 0 or at least 16")
    if up.max_line_bytes < 1024:
        raise ConfigError(f"config: '{where}.max_line_bytes' must be at least 1024")
    if up.run_as:
        import pwd

        try:
            pwd.getpwnam(up.run_as)
        except KeyError:
            raise ConfigError(f"config: '{where}.run_as': no user {up.run_as!r} on this "
                              "host") from None


LOG_FORMATS = ("text", "json")
_SERVICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _check_observability(o: ObservabilityConfig) -> None:
    if o.log_format not in LOG_FORMATS:
        raise ConfigError(f"config: 'observability.log_format' must be one of "
                          f"{', '.join(LOG_FORMATS)}")
    if not _SERVICE_NAME.match(o.service_name):
        raise ConfigError("config: 'observability.service_name' must be 1-64 letters, digits, "
                          "'-', '_' or '.'")
    if o.otlp_endpoint:
        _url(o.otlp_endpoint, "observability.otlp_endpoint")
        if not _otel_installed():
            raise ConfigError("config: 'observability.otlp_endpoint' is set, and tracing needs "
                              "the otel extra: pip install 'tollhouse[otel]'")
    if o.metrics_token and (len(o.metrics_token) < 16 or not o.metrics_token.isprintable()
                            or " " in o.metrics_token):
        # never the value itself: it is a secret
        raise ConfigError("config: 'observability.metrics_token' must be at least 16 "
                          "printable characters without spaces")


def _otel_installed() -> bool:
    """The OpenTelemetry SDK and its OTLP/HTTP exporter (the `tollhouse[otel]` extra)."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _check_metering(m: MeteringConfig) -> None:
    if m.hook and m.url:
        raise ConfigError("config: 'metering' takes hook or url, not both")
    if m.hook and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", m.hook):
        raise ConfigError("config: 'metering.hook' must be module.path:object")
    if m.url:
        _url(m.url, "metering.url")
        if not m.secret:
            raise ConfigError("config: 'metering.secret' is required with metering.url")
    if m.on_error not in ("deny", "allow"):
        raise ConfigError("config: 'metering.on_error' must be deny or allow")
    _positive(m.timeout_ms, "metering.timeout_ms")
    _positive(m.retry_max_s, "metering.retry_max_s")
    _positive(m.keep_delivered_h, "metering.keep_delivered_h")
    if not m.methods:
        raise ConfigError("config: 'metering.methods' must name at least one method")


def _check_policies(cfg: Config) -> None:
    _check_metering(cfg.metering)
    _check_guardrails(cfg)
    try:
        validate_rules(cfg.rate_limits, known_endpoints={u.name for u in cfg.upstreams})
        validate_egress(cfg.egress,
                        [(u.name, "" if u.stdio else u.url, u.zones, u.collections)
                         for u in cfg.upstreams],
                        cfg.server.trusted_proxies)
    except ValueError as exc:
        raise ConfigError(f"config: {exc}") from None


# -- [[guardrails]], [upstreams.screening], [upstreams.pinning] --------------------------------

GUARDRAIL_DETECT = ("secrets", "card_numbers", "iban", "email", "phone", "entropy")


def _check_guardrails(cfg: Config) -> None:
    names: set[str] = set()
    known = {u.name for u in cfg.upstreams}
    for i, rule in enumerate(cfg.guardrails):
        where = f"guardrails[{i}]"
        if not _NAME.match(rule.name) or rule.name in names:
            raise ConfigError(f"config: '{where}.name' must be 1-64 letters, digits, '-', '_' "
                              "or '.', and unique")
        names.add(rule.name)
        _one_of(rule.action, ("redact", "deny", "audit"), f"{where}.action")
        if not rule.on or any(o not in ("arguments", "results") for o in rule.on):
            raise ConfigError(f"config: '{where}.on' must list arguments, results or both")
        if not rule.detect or any(d not in GUARDRAIL_DETECT for d in rule.detect):
            raise ConfigError(f"config: '{where}.detect' must list some of "
                              f"{', '.join(GUARDRAIL_DETECT)}")
        if not rule.tools:
            raise ConfigError(f"config: '{where}.tools' must not be empty (\"*\": every tool)")
        unknown = [e for e in rule.endpoints if e not in known]
        if unknown:
            raise ConfigError(f"config: '{where}.endpoints' names an unknown endpoint "
                              f"'{unknown[0]}'")
        if rule.phone_region not in phonenumbers.SUPPORTED_REGIONS:
            raise ConfigError(f"config: '{where}.phone_region' must be a two-letter region "
                              "code phonenumbers knows, such as US or DE")
    for up in cfg.upstreams:
        where = f"upstreams.{up.name}"
        _one_of(up.screening.mode, ("off", "warn", "hide"), f"{where}.screening.mode")
        _one_of(up.pinning.mode, ("off", "warn", "approve"), f"{where}.pinning.mode")
        _positive(up.screening.max_description_chars, f"{where}.screening.max_description_chars")
        _positive(up.screening.max_schema_bytes, f"{where}.screening.max_schema_bytes")


def _one_of(value: str, allowed: tuple[str, ...], key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"config: '{key}' must be one of {', '.join(allowed)}")


# -- [[rate_limits]] -------------------------------------------------------------------------------

RATE_LIMIT_KEYS = ("principal", "principal_endpoint", "principal_tool", "endpoint", "api_key")
_PERIODS_S = {"s": 1, "min": 60, "h": 3600}
_RATE = re.compile(r"^([1-9][0-9]{0,9})/(s|min|h)$")


def parse_rate(rate: str) -> tuple[int, int]:
    """'10/s' -> (10, 1): calls per period of that many seconds."""
    match = _RATE.match(rate)
    if match is None:
        raise ValueError(f"{rate!r} is not n/s, n/min or n/h")
    return int(match.group(1)), _PERIODS_S[match.group(2)]


def validate_rules(rules: list[RateLimitRule],
                   known_endpoints: typing.Collection[str] | None = None) -> None:
    """Raise ValueError naming the first offending rule and field; with `known_endpoints`, an
    endpoint no upstream has is refused too (a typo there would silently limit nothing)."""
    seen: dict[str, int] = {}
    for i, rule in enumerate(rules):
        where = f"rate_limits[{i}]"
        if not _NAME.match(rule.name):  # no ':', which delimits bucket keys
            raise ValueError(f"{where}.name: {rule.name!r} must be 1-64 letters, digits, '-', "
                             "'_' or '.', starting with a letter or digit")
        if rule.name in seen:
            raise ValueError(f"{where}.name: {rule.name!r} repeats rate_limits[{seen[rule.name]}]")
        seen[rule.name] = i
        if rule.key not in RATE_LIMIT_KEYS:
            raise ValueError(f"{where}.key: {rule.key!r} is not one of "
                             f"{', '.join(RATE_LIMIT_KEYS)}")
        if not rule.methods or not all(rule.methods):
            raise ValueError(f"{where}.methods: must list at least one method, none empty")
        if rule.key == "principal_tool" and "tools/call" not in rule.methods:
            raise ValueError(f"{where}.key: 'principal_tool' needs 'tools/call' in methods")
        try:
            count, period_s = parse_rate(rule.rate)
        except ValueError as exc:
            raise ValueError(f"{where}.rate: {exc}") from None
        if period_s * US // count == 0:
            raise ValueError(f"{where}.rate: {rule.rate!r} is more than one call per microsecond")
        if rule.burst < 0:
            raise ValueError(f"{where}.burst: {rule.burst} must be 0 (the rate's count) or more")
        for endpoint in rule.endpoints:
            if known_endpoints is not None and endpoint not in known_endpoints:
                raise ValueError(f"{where}.endpoints: {endpoint!r} is not a configured upstream")


# -- [egress] ----------------------------------------------------------------------------------

CollectionPolicy = typing.Literal["local_only", "lan", "remote"]
COLLECTION_POLICIES: tuple[CollectionPolicy, ...] = ("local_only", "lan", "remote")  # strictest first
MAX_COLLECTIONS = 64  # seed 000's cap on audit.collections
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def validate_egress(egress: EgressConfig,
                    upstreams: typing.Sequence[tuple[str, str, typing.Sequence[str],
                                                     typing.Sequence[str]]],
                    trusted_proxies: typing.Sequence[str] = ()) -> None:
    """Raise ValueError naming the first offending key. `upstreams` are (name, url, zones,
    collections) in config order."""
    for label, policy in egress.collections.items():
        if not _NAME.match(label):
            raise ValueError(f"egress.collections: {label!r} must be 1-64 letters, digits, "
                             "'-', '_' or '.', starting with a letter or digit")
        if policy not in COLLECTION_POLICIES:
            raise ValueError(f"egress.collections.{label}: {policy!r} is not one of "
                             f"{', '.join(COLLECTION_POLICIES)}")
    for i, address in enumerate(egress.metadata_addresses):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise ValueError(f"egress.metadata_addresses[{i}]: {address!r} is not an IP "
                             "address") from None
    for i, (_name, url, zones, labels) in enumerate(upstreams):
        try:
            if url:  # none: a local (stdio) process, nothing to dial
                UpstreamEgress.from_url("", url)
        except ValueError as exc:
            raise ValueError(f"upstreams[{i}].url: {exc}") from None
        validate_upstream_egress(f"upstreams[{i}]", zones, labels, egress.collections)
    parse_networks(trusted_proxies, "server.trusted_proxies")


def validate_upstream_egress(where: str, zones: typing.Sequence[str],
                             labels: typing.Sequence[str], policies: dict[str, str]) -> None:
    """One upstream's `zones` and `collections`, against `[egress.collections]`."""
    if not zones:
        raise ValueError(f"{where}.zones: must name at least one of {', '.join(ZONES)}")
    for zone in zones:
        if zone not in ZONES:
            raise ValueError(f"{where}.zones: {zone!r} is not one of {', '.join(ZONES)}")
    if len(labels) > MAX_COLLECTIONS:
        raise ValueError(f"{where}.collections: more than {MAX_COLLECTIONS} labels")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}.collections: a label appears twice")
    for label in labels:
        if label not in policies:
            raise ValueError(f"{where}.collections: {label!r} has no policy in "
                             "[egress.collections]")


def parse_networks(values: typing.Iterable[str], key: str) -> tuple[IPNetwork, ...]:
    """Addresses or CIDR networks; raise ValueError naming `key[i]` on the first bad one."""
    networks: list[IPNetwork] = []
    for i, value in enumerate(values):
        try:
            network = ipaddress.ip_network(value)
        except ValueError:
            raise ValueError(f"{key}[{i}]: {value!r} is not an IP address or network, "
                             "e.g. 10.0.0.1 or 10.0.0.0/8") from None
        if network.version == 6 and network.subnet_of(_MAPPED):  # as addresses are unwrapped
            network = ipaddress.IPv4Network(
                (int(network.network_address) & 0xFFFFFFFF, network.prefixlen - 96))
        networks.append(network)
    return tuple(networks)


def _check_issuer(iss: IssuerConfig, where: str, base_dir: Path) -> None:
    if not iss.issuer:
        raise ConfigError(f"config: '{where}.issuer' must not be empty")
    if sum(map(bool, (iss.jwks_url, iss.public_key_pem, iss.hs256_secret))) != 1:
        raise ConfigError(f"config: '{where}' needs exactly one of jwks_url, public_key_pem or "
                          "hs256_secret")
    if iss.jwks_url:
        _url(iss.jwks_url, f"{where}.jwks_url")
    if not iss.algorithms:
        raise ConfigError(f"config: '{where}.algorithms' must not be empty")
    for alg in iss.algorithms:
        if alg not in _ALGORITHMS:
            raise ConfigError(f"config: '{where}.algorithms' has an unsupported algorithm "
                              f"'{alg}' (allowed: {', '.join(_ALGORITHMS)})")
        if (alg.startswith("HS")) != bool(iss.hs256_secret):
            raise ConfigError(f"config: '{where}.algorithms' has '{alg}', which does not fit "
                              "the key type configured")
    if iss.public_key_pem and "-----BEGIN" not in iss.public_key_pem:
        pem_path = base_dir / iss.public_key_pem
        if not pem_path.is_file():
            raise ConfigError(f"config: '{where}.public_key_pem' names a file that does not "
                              f"exist: {pem_path}")


def _url(value: str, key: str) -> None:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"config: '{key}' is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"config: '{key}' must be an http:// or https:// URL with a host")


def _template(up: UpstreamConfig, where: str) -> None:
    from proxy.upstream.template import UrlTemplate

    try:
        UrlTemplate.parse(up.url, {n: (p.claim, p.attribute, p.pattern)
                                   for n, p in up.placeholders.items()})
    except ValueError as exc:
        raise ConfigError(f"config: '{where}.url' {exc}") from None
    if up.auth == "per_user" and up.oauth.discover:
        raise ConfigError(f"config: '{where}.oauth.discover' cannot be used with a per-caller "
                          "url: name the authorization server's endpoints")
    if not 1 <= up.max_resolved <= 100_000:
        raise ConfigError(f"config: '{where}.max_resolved' must be between 1 and 100000")


def _positive(value: float, key: str) -> None:
    if value <= 0:
        raise ConfigError(f"config: '{key}' must be greater than 0")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _kind(raw: Any) -> str:
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            list: "an array", dict: "a table"}.get(type(raw), type(raw).__name__)
