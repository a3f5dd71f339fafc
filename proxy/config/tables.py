"""Every table of the TOML config file as a frozen dataclass: the field names are the keys, and
the defaults are the values a file leaves out. This is the one definition of the config's shape:
proxy.config.load builds these from the file, the section checks (one module each) read them,
and the management API's access body (proxy.strict) is derived from `AccessConfig`."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config.approvals import ApprovalRule, ApprovalsWebhookConfig
from proxy.config.policy import PolicyConfig
from proxy.config.zones import DEFAULT_METADATA_ADDRESSES, ZONES


@dataclass(frozen=True)
class ServerConfig:
    """`[server]`: where the gateway listens and how clients reach it, its limits, and its
    processes."""

    listen: str = "127.0.0.1:8080"  # host:port the gateway listens on
    # how clients reach the gateway: in hints, metadata and JWT audiences
    public_url: str = "http://127.0.0.1:8080"
    # a larger request body, declared or streamed: 413 before any other check
    max_request_bytes: int = 4 * 1024 * 1024
    # an answer the gateway must hold whole to rewrite it (a filtered list, a bridged result);
    # one nobody rewrites streams through at any size
    max_response_bytes: int = 16 * 1024 * 1024
    # browser Origins allowed on /mcp besides public_url's; any other: 403
    allowed_origins: list[str] = field(default_factory=list)
    # a session unused this long is forgotten (the client re-initializes)
    session_idle_timeout_s: float = 3600.0
    max_sessions: int = 100_000  # sessions kept at most; the least recently used go first
    shutdown_grace_s: float = 10.0  # on SIGTERM/SIGINT: how long calls in flight get to finish
    # a comment line on an SSE response this long idle, so proxies keep it open; 0: none
    sse_heartbeat_s: float = 15.0
    # proxies (IPs or CIDR ranges) whose X-Forwarded-For decides the caller's zone
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
    # a connect link the gateway hands a client that declared URL-mode elicitation (a per_user
    # upstream not connected yet) works this long, once, for the caller alone (30-3600)
    connect_link_ttl_s: float = 300.0

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


@dataclass(frozen=True)
class IssuerConfig:
    """One `[[auth.issuers]]` table: an issuer whose JWTs the gateway accepts, with exactly one
    of `jwks_url`, `public_key_pem` or `hs256_secret`."""

    issuer: str = ""  # must equal the token's "iss" (entra and google presets fill it)
    jwks_url: str = ""  # where the issuer publishes its keys
    public_key_pem: str = ""  # or its key: a PEM file (relative to the config) or PEM text
    hs256_secret: str = ""  # or a shared secret for HS* tokens (use ${ENV})
    # the algorithms accepted; each must fit the key type
    algorithms: list[str] = field(default_factory=lambda: ["RS256"])
    audience: str = ""  # empty: the endpoint's resource URL, public_url + "/mcp/<name>"
    subject_claim: str = "sub"  # the claim that names the caller
    # a list, or a space or comma separated string; dots name a nested claim
    # ("realm_access.roles"); empty: none
    groups_claim: str = "groups"
    scopes_claim: str = "scope"  # space separated, as OAuth's "scope"
    name_claim: str = "name"  # the caller's display name
    leeway_s: float = 30.0  # clock skew allowed on exp and nbf
    jwks_refresh_s: float = 3600.0  # the JWKS is refetched this often (keys are kept on failure)
    jwks_min_refetch_s: float = 60.0  # an unknown kid refetches at most this often
    # "entra", "okta", "keycloak" or "google": fills what that provider's tokens need and the
    # table leaves unset (issuer, jwks_url, audience, groups_claim); docs/identity.md
    preset: str = ""
    tenant: str = ""  # entra: the directory (tenant) id
    # entra: the API's application (client) id; google: the OAuth client id (the ID token's aud)
    client_id: str = ""
    # entra: the access token version the API's app registration asks for: 2 (aud is the
    # application id) or 1 (aud is api://<application id>, iss https://sts.windows.net/...)
    token_version: int = 2


@dataclass(frozen=True)
class LockoutConfig:
    """`[auth.lockout]`: repeated bad credentials from one client address (read through
    `server.trusted_proxies`), or for one account at password sign-in, answer 429 for a while."""

    max_failures: int = 10  # failures within window_s that lock
    window_s: float = 60.0  # the window failures are counted in
    lockout_s: float = 300.0  # how long a lock lasts (Retry-After)
    max_tracked: int = 100_000  # addresses and credentials tracked at most


@dataclass(frozen=True)
class OidcConfig:
    """`[auth.oidc]`: federated sign-in (OpenID Connect, code + PKCE); off while `issuer` is
    empty."""

    issuer: str = ""  # the provider's issuer URL; empty: federated sign-in off
    client_id: str = ""  # this gateway's client at the provider
    client_secret: str = ""  # e.g. "${OIDC_CLIENT_SECRET}"
    admin_group: str = ""  # members of this group are Tollhouse administrators
    # asked for at sign-in; must include openid
    scopes: list[str] = field(default_factory=lambda: ["openid", "profile", "email"])
    # where the ID token lists the user's groups; dots name a nested claim; empty: none
    groups_claim: str = "groups"
    name_claim: str = "preferred_username"  # the user name (else the email, then sub)
    # "entra", "okta", "keycloak" or "google": fills the provider's issuer (entra, google),
    # groups claim and scopes where left unset; docs/identity.md
    preset: str = ""
    tenant: str = ""  # entra: the directory (tenant) id

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)


@dataclass(frozen=True)
class OAuthClientConfig:
    """One `[[oauth_server.clients]]`: a confidential client an administrator registered (a
    machine client, an agent), which authenticates with a secret or `private_key_jwt` and gets
    tokens by the grants it is given (docs/identity.md#machine-clients)."""

    client_id: str  # what it names itself by; never a URL, never one a dynamic client holds
    name: str = ""  # shown in the audit and to policies as its display name
    # the SHA-256 (hex) of its secret (client_secret_basic or client_secret_post): the secret
    # itself is never in the file; `printf %s "$SECRET" | sha256sum`
    secret_sha256: str = ""
    # or private_key_jwt (RFC 7523 section 2.2): where the client publishes its public keys
    jwks_url: str = ""
    # the roles its own tokens carry: they act as groups (allow_groups, group_tools, Cedar)
    roles: list[str] = field(default_factory=list)
    # the endpoints it may get tokens for (RFC 8707 resource); empty: every endpoint
    endpoints: list[str] = field(default_factory=list)
    # client_credentials; urn:ietf:params:oauth:grant-type:jwt-bearer (an enterprise IdP's
    # identity assertion); urn:ietf:params:oauth:grant-type:token-exchange (acting for a person)
    grant_types: list[str] = field(default_factory=lambda: ["client_credentials"])


@dataclass(frozen=True)
class EnterpriseIdpConfig:
    """One `[[oauth_server.enterprise_idps]]`: an enterprise identity provider whose Identity
    Assertion JWT Authorization Grants (ID-JAG, the MCP enterprise-managed-authorization
    extension) the token endpoint takes through the JWT bearer grant."""

    issuer: str  # must equal the assertion's "iss"
    jwks_url: str  # where the IdP publishes its keys
    algorithms: list[str] = field(default_factory=lambda: ["RS256", "ES256"])  # accepted
    leeway_s: float = 30.0  # clock skew allowed on exp, nbf and iat
    # an assertion valid for longer than this is refused (each is used once, remembered this
    # long at most)
    max_lifetime_s: float = 600.0
    name_claim: str = "name"  # the person's display name, if the assertion has one
    # where the assertion lists groups, if it does; none there: the person's groups are kept
    groups_claim: str = "groups"
    jwks_refresh_s: float = 3600.0  # the JWKS is refetched this often (keys kept on failure)
    jwks_min_refetch_s: float = 60.0  # an unknown kid refetches at most this often


@dataclass(frozen=True)
class OAuthServerConfig:
    """`[oauth_server]`: Tollhouse as the OAuth 2.1 authorization server of its endpoints
    (needs auth.mode = "jwt" and TOLLHOUSE_SECRET_KEY)."""

    enabled: bool = False  # MCP clients register and send people through /signin and consent
    access_token_ttl_s: int = 600  # access tokens: ES256 JWTs for one endpoint (RFC 8707)
    # refresh tokens rotate on every use; reuse revokes the family
    refresh_token_ttl_s: int = 2592000
    code_ttl_s: int = 60  # authorization codes, used once
    key_rotation_s: int = 86400  # a new signing key this often (old ones stay published)
    browser_session_ttl_s: int = 28800  # the sign-in cookie's server-side session
    # a rotated refresh token its client presents again this soon gets the same new tokens; 0:
    # every reuse revokes the family
    refresh_grace_s: int = 10
    # http://127.0.0.1 and [::1] redirect URIs match any port (RFC 8252 7.3)
    loopback_any_port: bool = True
    reverse_domain_schemes: bool = True  # com.example.app:/cb redirect URIs (RFC 8252 7.1)
    # the private-use redirect URI schemes of IDEs' MCP clients
    private_use_schemes: list[str] = field(default_factory=lambda: [
        "cursor", "vscode", "vscode-insiders", "windsurf"])
    # confidential clients registered by an administrator (client credentials, identity
    # assertions, token exchange)
    clients: list[OAuthClientConfig] = field(default_factory=list)
    # identity providers whose ID-JAGs the token endpoint takes
    enterprise_idps: list[EnterpriseIdpConfig] = field(default_factory=list)


@dataclass(frozen=True)
class AuthConfig:
    """`[auth]`: who callers are: one anonymous principal, or bearer JWTs and API keys."""

    # "none": one anonymous principal, loopback only; "jwt": bearer JWTs and API keys
    mode: str = "none"
    issuers: list[IssuerConfig] = field(default_factory=list)  # the issuers whose JWTs are accepted
    # named in each endpoint's protected-resource metadata (RFC 9728)
    authorization_servers: list[str] = field(default_factory=list)
    # likewise (each endpoint adds its access.allow_scopes)
    scopes_supported: list[str] = field(default_factory=list)
    # EC P-256 key (PEM file or text) signing the identity tokens upstreams with identity = "jwt"
    # get; empty: one made at start-up
    signing_key_pem: str = ""
    lockout: LockoutConfig = field(default_factory=LockoutConfig)
    oidc: OidcConfig = field(default_factory=OidcConfig)
    # a group (a SCIM group's displayName, or a name in a token's groups claim) -> a role
    # (docs/provisioning.md); more mappings through /api/v1/group-roles
    group_roles: list[GroupRole] = field(default_factory=list)


@dataclass(frozen=True)
class GroupRole:
    """One `[[auth.group_roles]]`: the people in `group` hold `role`."""

    group: str  # a SCIM group's displayName, or a name in a token's groups claim
    role: str  # a built-in role (admin, user, auditor) or a custom role's name


@dataclass(frozen=True)
class ScimConfig:
    """`[scim]`: SCIM 2.0 provisioning at /scim/v2 (RFC 7643/7644, docs/provisioning.md): an
    identity provider creates, changes, deactivates and deletes people and groups."""

    enabled: bool = False  # serve /scim/v2; off: it answers 404
    # the bearer token the identity provider's provisioning client sends (use ${ENV}; at
    # least 32 characters); compared in constant time, never logged
    token: str = field(default="", repr=False)


@dataclass(frozen=True)
class ToolProfile:
    # glob patterns the group's callers also get
    tools_allow: list[str] = field(default_factory=list)
    tools_deny: list[str] = field(default_factory=list)  # glob patterns denied to them


@dataclass(frozen=True)
class AccessConfig:
    """Who may use the endpoint, and which tools, prompts and resources (glob patterns)."""

    # callers admitted by subject; all four empty: anyone authenticated
    allow_subjects: list[str] = field(default_factory=list)
    allow_groups: list[str] = field(default_factory=list)  # callers admitted by group
    # by scope; a caller lacking them gets 403 insufficient_scope
    allow_scopes: list[str] = field(default_factory=list)
    allow_keys: list[str] = field(default_factory=list)  # callers admitted by API key id
    # glob patterns ("search_*"); empty: every tool
    tools_allow: list[str] = field(default_factory=list)
    tools_deny: list[str] = field(default_factory=list)  # glob patterns; a deny always wins
    # more tool patterns for the callers of a group
    group_tools: dict[str, ToolProfile] = field(default_factory=dict)
    prompts_allow: list[str] = field(default_factory=list)  # the same for prompts, by name
    prompts_deny: list[str] = field(default_factory=list)  # the same for prompts, by name
    # and for resources, by URI or URI template
    resources_allow: list[str] = field(default_factory=list)
    # and for resources, by URI or URI template
    resources_deny: list[str] = field(default_factory=list)

    @property
    def restricts_callers(self) -> bool:
        return bool(self.allow_subjects or self.allow_groups or self.allow_scopes
                    or self.allow_keys)


@dataclass(frozen=True)
class DatabaseConfig:
    """`[database]`: where everything persisted is kept (audit log, usage outbox, keys,
    users, tokens, registered servers); its migrations run at start-up."""

    # sqlite:///PATH (relative to the working directory) or postgresql://USER:PW@HOST:PORT/DB
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

    url: str = "memory"  # "memory", or redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for TLS)
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

    client_id: str = ""  # an explicit client; empty with discover: one is registered (RFC 7591)
    client_secret: str = ""  # e.g. "${GITHUB_CLIENT_SECRET}"
    authorization_endpoint: str = ""  # the upstream's authorization server; unless discover
    token_endpoint: str = ""  # likewise, unless discover
    revocation_endpoint: str = ""  # RFC 7009; used on disconnect when set
    scopes: list[str] = field(default_factory=list)  # the scopes asked for
    discover: bool = False  # find the endpoints from the upstream's metadata (RFC 9728, RFC 8414)
    refresh_margin_s: float = 60.0  # a token is refreshed this long before it expires
    # the RFC 8707 resource the tokens are asked for; empty: the upstream's url (a stdio
    # upstream has none, so none is named unless set)
    resource: str = ""


@dataclass(frozen=True)
class ScreeningConfig:
    """`[upstreams.screening]`: the definitions an upstream lists, checked
    (docs/guardrails.md). "warn" audits a flagged one and passes it; "hide" also hides it."""

    mode: str = "warn"  # "off" | "warn" | "hide"
    max_description_chars: int = 4096  # a longer description is flagged "oversized"
    max_schema_bytes: int = 65536  # so is a schema over this many bytes (serialized)


@dataclass(frozen=True)
class PinningConfig:
    """`[upstreams.pinning]`: tool definitions pinned on first sight; a change is hidden until
    approved ("approve") or only audited ("warn")."""

    mode: str = "off"  # "off" | "warn" | "approve"


@dataclass(frozen=True)
class GuardrailRule:
    """One `[[guardrails]]` table: where to look for secrets and personal data, and what to do
    with what is found."""

    name: str  # named in the audit record
    endpoints: list[str] = field(default_factory=list)  # empty: all
    tools: list[str] = field(default_factory=lambda: ["*"])  # tool, prompt names; resource URIs
    on: list[str] = field(default_factory=lambda: ["arguments", "results"])  # where to look
    # what to look for ("entropy" too flags UUIDs and hashes)
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
    """One `[[upstreams]]` table: an MCP server served at /mcp/<name>, over HTTP or stdio."""

    name: str  # served at /mcp/<name>: letters, digits, '-', '_', '.'
    url: str = ""  # required for transport "http"; none for "stdio"
    # static headers sent upstream (a credential); the client's are never sent
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0  # connect and idle-read timeout
    total_timeout_s: float = 300.0  # a call's ceiling; past it the call is cancelled
    # who may use it, and which tools, prompts and resources
    access: AccessConfig = field(default_factory=AccessConfig)
    identity: str = "none"  # what the upstream learns of the caller: "none", "headers" or "jwt"
    identity_audience: str = ""  # the identity token's audience; empty: the upstream's url
    era: str = "auto"  # its protocol era: "auto" (learned), "legacy" (2025-11-25) or "modern"
    # the destination zones it may be dialled in
    zones: list[str] = field(default_factory=lambda: list(ZONES))
    # data-policy labels of what it serves (see [egress])
    collections: list[str] = field(default_factory=list)
    auth: str = "static"  # "static": the headers; "per_user": each person's own token
    # auth = "per_user": how each person's token is got
    oauth: UpstreamOAuthConfig = field(default_factory=UpstreamOAuthConfig)
    screening: ScreeningConfig = field(default_factory=ScreeningConfig)
    pinning: PinningConfig = field(default_factory=PinningConfig)
    # a per-caller url's {name}s: where each value comes from
    placeholders: dict[str, PlaceholderConfig] = field(default_factory=dict)
    max_resolved: int = 256  # per-caller URL: resolved upstreams (and pools) kept, LRU

    @property
    def templated(self) -> bool:
        """A per-caller upstream: its URL has placeholders."""
        return "{" in self.url or bool(self.placeholders)

    # a local MCP server the gateway runs and speaks to on stdin/stdout
    # (docs/per-caller-and-stdio.md); every key below is for transport = "stdio" only
    transport: str = "http"
    command: str = ""  # the program, looked up on the PATH
    args: list[str] = field(default_factory=list)  # its arguments
    env: dict[str, str] = field(default_factory=dict)  # the process's only environment
    cwd: str = ""  # empty: / (never the gateway's own directory, where its data may be)
    process: str = "shared"  # "shared": one for all callers; "per_user": one per person
    max_processes: int = 50  # per_user: at most this many at once
    idle_stop_s: float = 600.0  # a process unused this long is stopped
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
class SearchConfig:
    """`[endpoints.search]`: tool search (proxy/virtual/search.py). With mode "search", the
    endpoint's tools/list shows `search_tools` and `call_tool` (and the `always` tools) in
    place of every member's tools; each caller searches and calls only what it may see."""

    mode: str = "off"  # "off": every tool listed; "search": the two meta-tools listed instead
    max_results: int = 8  # tools a search returns at most (a search's `limit` is capped here)
    always: list[str] = field(default_factory=list)  # exposed names still listed in full


@dataclass(frozen=True)
class EndpointConfig:
    """One `[[endpoints]]` table: a virtual endpoint, several upstreams behind one
    /mcp/<name> (proxy/virtual/)."""

    name: str  # served at /mcp/<name>; not an upstream's name
    members: list[str]  # the upstreams behind it ([[upstreams]] or registered servers)
    separator: str = "__"  # an exposed name is <member><separator><name>
    list_timeout_s: float = 2.0  # a member slower than this is left out of a list answer
    aliases: dict[str, str] = field(default_factory=dict)  # exposed name = "<member>:<tool>"
    # as an upstream's, by exposed name; each member's own still applies
    access: AccessConfig = field(default_factory=AccessConfig)
    total_timeout_s: float = 300.0  # a call's ceiling, as for an upstream
    search: SearchConfig = field(default_factory=SearchConfig)  # tool search (mode "search")


@dataclass(frozen=True)
class MeteringConfig:
    """`[metering]`: the hook or webhook asked before each metered call, and sent one usage
    event after it."""

    hook: str = ""        # "module:object" with async authorize(request) and record(event)
    url: str = ""         # or the HTTP webhook
    secret: str = ""      # HMAC-SHA256 key for the webhook's X-Tollhouse-Signature
    timeout_ms: int = 500  # authorize must answer within this
    on_error: str = "deny"  # "deny" (fail closed) or "allow" when authorize cannot answer
    # the JSON-RPC methods metered
    methods: list[str] = field(default_factory=lambda: ["tools/call"])
    retry_max_s: float = 300.0  # the longest wait between usage delivery attempts
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

    name: str  # named in the audit record
    key: str = "principal"  # what one bucket counts for
    # the JSON-RPC methods counted
    methods: list[str] = field(default_factory=lambda: ["tools/call"])
    rate: str = "10/s"  # n/s, n/min or n/h
    burst: int = 0  # calls allowed at once; 0: the rate's own count
    endpoints: list[str] = field(default_factory=list)  # empty: all


@dataclass(frozen=True)
class EgressConfig:
    """`[egress]`. `collections` maps a data label to the farthest zone its data may be served
    to. `metadata_addresses` replaces, not extends, the built-in list."""

    # label = the farthest zone its data may be served to
    collections: dict[str, str] = field(default_factory=dict)
    # refused unless an upstream's url names one
    metadata_addresses: list[str] = field(default_factory=lambda: list(DEFAULT_METADATA_ADDRESSES))


@dataclass(frozen=True)
class ObservabilityConfig:
    """`[observability]`: the Prometheus scrape endpoint, tracing and the log line format
    (docs/operations.md). `metrics_token` is a secret (use `${ENV}`)."""

    metrics: bool = True  # false: /metrics answers 404 and nothing is measured
    metrics_token: str = ""  # empty: no token, and /metrics answers only on loopback
    metrics_public: bool = False  # true: /metrics answers any peer, not only loopback
    otlp_endpoint: str = ""  # empty: tracing off
    service_name: str = "tollhouse"  # the spans' service.name
    log_format: str = "text"  # "text" or "json" (one JSON object a line)


@dataclass(frozen=True)
class ConsoleConfig:
    """`[console]`: the web console at /console/ (docs/console.md), behind the sign-in
    pages, which it turns on."""

    enabled: bool = True  # false: /console/ answers 404


@dataclass(frozen=True)
class ExportConfig:
    """One `[[audit.exports]]` table: a receiver every audit record is streamed to, at least
    once, through a durable outbox (docs/audit-export.md). `token` and `secret` are secrets
    (use `${ENV}`): never logged."""

    name: str  # names the export in metrics, logs and the console
    kind: str  # "syslog" | "otlp" | "splunk_hec" | "webhook"
    # syslog: tcp://host:port or tls://host:port; the others: an http:// or https:// URL
    # (otlp: the full logs URL, e.g. http://collector:4318/v1/logs; splunk_hec: the HEC's
    # address, /services/collector/event added when the URL has no path)
    url: str
    format: str = "ocsf"  # "ocsf" (OCSF 1.x API Activity, class 6003) or "native"
    # splunk_hec only: the HEC token, sent as "Authorization: Splunk <token>"
    token: str = field(default="", repr=False)
    # webhook only (required there): the HMAC-SHA256 key of the Tollhouse-Signature header
    secret: str = field(default="", repr=False)
    # a PEM file of the CA certificates to trust for tls:// and https:// (relative to the
    # working directory); empty: the system's
    ca_file: str = ""
    # otlp, splunk_hec and webhook: headers sent with every request (an Authorization, say;
    # never logged)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    facility: int = 13  # syslog: the RFC 5424 facility (13: log audit)
    # records queued for this export at most; beyond, new records are not queued for it and
    # are counted as dropped (they stay in the audit log), until the backlog falls below
    max_backlog: int = 1_000_000
    batch: int = 100  # records sent at a time (one request, or one burst of syslog frames)
    timeout_s: float = 10.0  # one send's limit (connect, write, the receiver's answer)
    retry_max_s: float = 300.0  # the longest wait between attempts while the receiver fails


@dataclass(frozen=True)
class ChainConfig:
    """`[audit.chain]`: tamper evidence (docs/audit-evidence.md). Each writer links every
    record it commits to the one before it (SHA-256) and signs the chains' heads with an
    Ed25519 key every `checkpoint_every_s`; `tollhouse audit verify` checks both. Read at
    start-up: a change takes effect at the next start."""

    enabled: bool = False  # link each record to the one before it, and sign checkpoints
    # the Ed25519 private key (PEM, inline or a file relative to the config) that signs the
    # checkpoints, e.g. "${TOLLHOUSE_AUDIT_SIGNING_KEY}"; required when enabled. Never
    # logged; `tollhouse audit public-key` prints the public key an auditor verifies with
    signing_key: str = field(default="", repr=False)
    # a signed checkpoint of the chains' heads at least this often while records arrive
    # (and at a clean stop): records a tail cut could remove unnoticed are those of the
    # last interval
    checkpoint_every_s: float = 60.0


@dataclass(frozen=True)
class AuditConfig:
    """`[audit]`: the audit log beyond the database it is written to (docs/audit-export.md,
    docs/audit-evidence.md)."""

    # every audit record streamed to each receiver listed here (a SIEM, a log pipeline)
    exports: list[ExportConfig] = field(default_factory=list)
    # records older than this many days are removed by a background task, in small batches
    # (the rollups, and so the usage totals, keep them); 0: keep forever
    retention_days: int = 0
    # tamper evidence: hash-chained records and signed checkpoints
    chain: ChainConfig = field(default_factory=ChainConfig)


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
    audit: AuditConfig = field(default_factory=AuditConfig)
    scim: ScimConfig = field(default_factory=ScimConfig)
    # tool calls held for a person's yes (proxy/approvals.py), and the webhook told of each
    approvals: list[ApprovalRule] = field(default_factory=list)
    approvals_webhook: ApprovalsWebhookConfig = field(default_factory=ApprovalsWebhookConfig)

    def upstream(self, name: str) -> UpstreamConfig | None:
        return next((u for u in self.upstreams if u.name == name), None)
