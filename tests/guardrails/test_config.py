"""The guardrails' config keys: a bad value stops start-up with one clear line."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import ConfigError, from_dict


def load(guardrails: list[dict[str, Any]] | None = None, **upstream: Any) -> None:
    from_dict({"upstreams": [{"name": "e", "url": "http://u/", **upstream}],
               "guardrails": guardrails or []}, env={})


@pytest.mark.parametrize(("guardrails", "upstream", "message"), [
    ([{"name": "g", "action": "block"}], {}, "'guardrails[0].action' must be one of"),
    ([{"name": "g", "on": ["headers"]}], {}, "'guardrails[0].on' must list"),
    ([{"name": "g", "detect": ["ssn"]}], {}, "'guardrails[0].detect' must list some of"),
    ([{"name": "g", "endpoints": ["nope"]}], {}, "unknown endpoint 'nope'"),
    ([{"name": "g", "tools": []}], {}, "'guardrails[0].tools' must not be empty"),
    ([{"name": "g", "phone_region": "XX"}], {}, "'guardrails[0].phone_region'"),
    ([{"name": "g"}, {"name": "g"}], {}, "'guardrails[1].name'"),
    ([{"name": "g", "colour": "red"}], {}, "unknown key 'guardrails[0].colour'"),
    (None, {"screening": {"mode": "block"}}, "'upstreams.e.screening.mode' must be one of"),
    (None, {"pinning": {"mode": "on"}}, "'upstreams.e.pinning.mode' must be one of"),
    (None, {"screening": {"max_schema_bytes": 0}}, "max_schema_bytes' must be greater"),
])
def test_bad_values_are_refused(guardrails: list[dict[str, Any]] | None,
                                upstream: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(guardrails, **upstream)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_issue_s_example_loads() -> None:
    load([{"name": "no-secrets", "endpoints": [], "tools": ["*"], "on": ["arguments", "results"],
           "detect": ["secrets", "card_numbers", "iban", "email", "phone"], "action": "redact"}],
         screening={"mode": "hide"}, pinning={"mode": "approve"})
