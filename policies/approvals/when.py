"""An approval rule's `when`: a Cedar condition over the entities of `[policy]` (principal,
action, resource, context with `input`, the call's arguments), compiled as the one policy
`permit(principal, action == Tollhouse::Action::"tools/call", resource) when { <when> };` and
decided with policies.cedar.decide.Policies, so it reads exactly what a `[policy]` file reads.

It is parsed and validated when the chain is built (a fault is one `PolicyError` line naming
the rule); what it says of the arguments is validated against a tool's schema once the tool is
known (as a `[policy]` file's is), and it is compiled again when the targets learned move.
An evaluation error holds the call (fail closed: the approval is asked for).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from policies.cedar.book import TargetBook
from policies.cedar.decide import Call, Caller, Policies
from policies.cedar.gate import CLIENT_CLAIMS, settle
from policies.cedar.load import Policy, PolicyError, parse
from policies.cedar.schema import Catalog
from proxy.auth.principal import Principal


class Condition:
    """One rule's `when`, compiled against the targets `book` knows."""

    def __init__(self, rule: str, when: str, book: TargetBook,
                 claims: tuple[str, ...] = ()) -> None:
        self.rule = rule
        self._book = book
        self._claims = claims
        text = f'permit(principal, action == Tollhouse::Action::"tools/call", resource)' \
               f' when {{ {when} }};'
        try:
            (policy,) = parse(text, f"approvals {rule}")
        except PolicyError as exc:
            raise PolicyError(f"approvals: rule {rule!r}: 'when' is not a Cedar condition: "
                              f"{str(exc).split(': ', 2)[-1]}") from None
        except ValueError:  # more than one policy: a `;` inside the condition
            raise PolicyError(f"approvals: rule {rule!r}: 'when' must be one condition") from None
        self._policy: Policy = replace(policy, id=f"approvals:{rule}", reason=None)
        self._seen = -1
        self._compiled: Policies | None = None
        self._current()  # raises PolicyError at load

    def _current(self) -> Policies:
        if self._compiled is None or self._book.version != self._seen:
            self._seen = self._book.version
            catalog = Catalog(self._book.targets(), self._claims)
            try:
                settle([self._policy], catalog)
            except PolicyError as exc:
                raise PolicyError(f"approvals: rule {self.rule!r}: 'when': "
                                  f"{str(exc).split(': ', 3)[-1]}") from None
            self._compiled = Policies([self._policy], catalog, self._claims)
        return self._compiled

    def holds(self, principal: Principal, endpoint: str, tool: str,
              arguments: Mapping[str, Any], era: str) -> bool:
        """Whether the condition holds for this call; an error holds it too (fail closed)."""
        try:
            compiled = self._current()
        except PolicyError:
            return True  # no longer validates against the tools as listed: ask a person
        decision = compiled.decide(caller_of(principal, self._claims),
                                   Call("tools/call", endpoint, tool, arguments, era=era))
        return decision.allowed or bool(decision.errors)


def caller_of(principal: Principal, claims: tuple[str, ...]) -> Caller:
    """The Cedar caller entity of `principal`, as the `[policy]` gate builds it."""
    all_claims = dict(principal.claims)
    client = next((all_claims[c] for c in CLIENT_CLAIMS if c in all_claims), "")
    kept = {k: v for k, v in all_claims.items() if k in claims}
    if principal.kind == "api_key" and principal.api_key_id is not None:
        return Caller.key(principal.api_key_id, groups=principal.groups, claims=kept,
                          client=client)
    return Caller.person(principal.issuer, principal.subject, groups=principal.groups,
                         claims=kept, client=client)
