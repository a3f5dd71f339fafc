"""Policy as code (issue 37): Cedar policies that decide on the call itself, evaluated by the
Cedar engine through `cedarpy`. Framework-free: nothing here knows of Quart, httpx or the web
layers; the request path (the policy chain, audit, metrics, API, console) calls this.

The entity model, namespace `Tollhouse` (the schema is generated, `schema.Catalog`):
- principal `Caller::"<issuer>|<subject>"` (an API key: `"key|<key id>"`): `groups`
  (Set<String>), `claims` (record of the configured `[policy] claims`, each an optional
  String), `attributes` (the person's attributes, optional Strings), `client` (String);
- action `Action::"<method>"`: `tools/call`, `resources/read`, `prompts/get` (resource a
  `Tool`, `Resource` or `Prompt`) and `tools/list`, `resources/list`,
  `resources/templates/list`, `prompts/list` (resource the `Endpoint`);
- resource `Tool::"<endpoint>/<tool>"` (likewise `Prompt`, `Resource` with the URI) in
  `Endpoint::"<endpoint>"`, with `name`, `endpoint` and the tool's annotations `readOnlyHint`,
  `destructiveHint`, `idempotentHint`, `openWorldHint` (optional Booleans);
- context: `input` (the arguments, typed per tool from its inputSchema: see `schema`), `hour`
  (0-23, UTC), `weekday` (Long, ISO 8601: 1 Monday .. 7 Sunday, UTC, so `context.weekday <= 5`
  is Monday to Friday), `zone` (String), `era` (String). List methods have no `input`.

The API the gateway calls:

    catalog = Catalog(targets: Iterable[Target], claims: Iterable[str],
                      attributes: Iterable[str])        # Target.tool(endpoint, tool_dict)
    policies: list[Policy] = load(patterns, base_dir: Path, catalog, mode="enforce")
                                                        # raises PolicyError (one line)
    compiled = Policies(policies, catalog, claims=())   # build once per change
    decision = compiled.decide(Caller(...), Call(method, endpoint, name, arguments,
                                                  zone=, era=), now=None) -> Decision
        # Decision.allowed, .policies (deciding ids), .reason (the @reason text, or a
        # default), .errors (evaluation errors: they deny), .shadow (Verdict | None),
        # .shadow_denied
    could_permit(compiled, caller, method, endpoint, name, zone=, era=, now=) -> bool
        # list a tool exactly when this is true; Lister(compiled) to hold it explicitly

An empty policy list (no `[policy] files`) decides nothing: every call is allowed and every
tool listed, at the cost of one attribute test. Validation needs the targets: a policy naming
an argument of a tool not in the catalog is refused (its arguments are unknown), so the
catalog given to `load` must hold the tools as last seen.
"""

from policies.cedar.decide import (
    ALLOWED,
    DEFAULT_ERROR,
    DEFAULT_FORBID,
    DEFAULT_NO_PERMIT,
    Call,
    Caller,
    Decision,
    Policies,
    Verdict,
)
from policies.cedar.listing import Lister, could_permit
from policies.cedar.load import Policy, PolicyError, load, parse, read_policies, validate
from policies.cedar.schema import Catalog, Target

__all__ = [
    "ALLOWED", "DEFAULT_ERROR", "DEFAULT_FORBID", "DEFAULT_NO_PERMIT", "Call", "Caller",
    "Catalog", "Decision", "Lister", "Policies", "Policy", "PolicyError", "Target", "Verdict",
    "could_permit", "load", "parse", "read_policies", "validate",
]
