"""The one TOML file that configures a gateway, validated before anything starts.

- `tables`: every table as a frozen dataclass, the field names its keys: the config's shape.
- `load`: the file read, `${VAR}` substituted, the dataclasses built (unknown keys refused),
  then `validate`, which runs the section checks in order.
- one module of checks per section: `server`, `auth`, `stores` ([database], [state]),
  `upstreams` and `stdio`, `endpoints`, `observability`, `metering`, `guardrails`, `rates`
  ([[rate_limits]]), `zones` ([egress]) and `policy` ([policy], the Cedar files); `values`
  has the checks of one value they share.
- the config language's own rules, which the features that apply them import from here
  (nothing here imports a feature): `zones` (zone names, metadata addresses, collection
  policies), `rates` (the rate grammar), `endpoints` (a virtual endpoint's naming rules),
  `template` (a per-caller upstream URL).

Every name below is importable from `proxy.config` itself.
"""

from proxy.config.errors import ConfigError
from proxy.config.guardrails import GUARDRAIL_DETECT
from proxy.config.load import from_dict, load, validate
from proxy.config.observability import LOG_FORMATS
from proxy.config.policy import POLICY_MODES, PolicyConfig
from proxy.config.rates import RATE_LIMIT_KEYS, parse_rate, validate_rules
from proxy.config.stores import STATE_SCHEMES
from proxy.config.tables import (
    AccessConfig,
    AuthConfig,
    Config,
    ConsoleConfig,
    DatabaseConfig,
    EgressConfig,
    EndpointConfig,
    EnterpriseIdpConfig,
    GroupRole,
    GuardrailRule,
    IssuerConfig,
    LockoutConfig,
    MeteringConfig,
    OAuthClientConfig,
    OAuthServerConfig,
    ObservabilityConfig,
    OidcConfig,
    PinningConfig,
    PlaceholderConfig,
    RateLimitRule,
    ScimConfig,
    ScreeningConfig,
    ServerConfig,
    StateConfig,
    ToolProfile,
    UpstreamConfig,
    UpstreamOAuthConfig,
)
from proxy.config.zones import (
    COLLECTION_POLICIES,
    MAX_COLLECTIONS,
    CollectionPolicy,
    parse_networks,
    validate_egress,
    validate_upstream_egress,
)

__all__ = [
    "COLLECTION_POLICIES", "GUARDRAIL_DETECT", "LOG_FORMATS", "MAX_COLLECTIONS", "POLICY_MODES",
    "RATE_LIMIT_KEYS", "STATE_SCHEMES", "AccessConfig", "AuthConfig", "CollectionPolicy", "Config",
    "ConfigError", "ConsoleConfig", "DatabaseConfig", "EgressConfig", "EndpointConfig",
    "EnterpriseIdpConfig", "GroupRole", "GuardrailRule", "IssuerConfig", "LockoutConfig", "MeteringConfig", "OAuthClientConfig",
    "OAuthServerConfig",
    "ObservabilityConfig", "OidcConfig", "PinningConfig", "PlaceholderConfig", "PolicyConfig",
    "RateLimitRule", "ScimConfig", "ScreeningConfig", "ServerConfig", "StateConfig", "ToolProfile",
    "UpstreamConfig", "UpstreamOAuthConfig", "from_dict", "load", "parse_networks", "parse_rate",
    "validate", "validate_egress", "validate_rules", "validate_upstream_egress",
]
