"""Every table of the TOML config file as a frozen dataclass: the field names are the keys, and
the defaults are the values a file leaves out. This is the one definition of the config's shape:
proxy.config.load builds these from the file, the section checks (one module each) read them,
and the management API's access body (proxy.strict) is derived from `AccessConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config.policy import PolicyConfig
from proxy.config.zones import DEFAULT_METADATA_ADDRESSES, ZONES


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
    """Who may use the endpoint, and which tools, prompts and resources (glob patterns)."""

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
    """Where a `{name}` of a per-caller upstream URL comes from (proxy.config.template)."""

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
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def upstream(self, name: str) -> UpstreamConfig | None:
        return next((u for u in self.upstreams if u.name == name), None)
