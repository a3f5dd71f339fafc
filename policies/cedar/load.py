"""Reading `[policy] files` and validating every policy against the generated schema before it
may decide anything.

Each file (globs relative to the config file's directory, sorted) is parsed by Cedar; each
policy gets an id (its `@id("...")`, else `<file>:<n>`, n counting from 1 in the file), its
`@reason("...")` (the text a refused caller reads) and its mode (`@mode("shadow"|"enforce")`;
`[policy] mode = "shadow"` makes every policy shadow). Then each policy is validated in Cedar's
strict mode against the schema variant of every tool and prompt its scope can reach
(policies.cedar.schema explains the variants). Any fault raises one `PolicyError`, one line
naming the file, the policy and the problem: a policy naming an attribute or an argument that
does not exist is refused here instead of denying every call at run time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any, Literal

import cedarpy

from policies.cedar.schema import CALL_ACTIONS, NAMESPACE, Catalog, Target

Mode = Literal["enforce", "shadow"]
_MODES = ("enforce", "shadow")


class PolicyError(ValueError):
    """A policy file that cannot be read, parsed or validated; the message is one line."""


@dataclass(frozen=True)
class Policy:
    id: str
    file: str  # as the config names it: relative to the config file's directory
    effect: Literal["permit", "forbid"]
    mode: Mode
    reason: str | None
    est: dict[str, Any] = field(repr=False, compare=False, hash=False)  # Cedar's JSON form

    @property
    def text(self) -> str:
        """The policy as Cedar text."""
        return cedarpy.policies_from_json_str(policy_set_json({self.id: self.est}))


def policy_set_json(static: dict[str, Any]) -> str:
    return json.dumps({"staticPolicies": static, "templates": {}, "templateLinks": []})


def files_of(patterns: Iterable[str], base_dir: Path) -> list[Path]:
    """The files the globs name, in order, each once; a pattern matching none is an error
    (a typo would otherwise leave the gateway without the policies it was given)."""
    found: dict[Path, None] = {}
    for pattern in patterns:
        root, rest = (Path("/"), pattern.lstrip("/")) if Path(pattern).is_absolute() else (
            base_dir, pattern)
        matches = sorted(p for p in root.glob(rest) if p.is_file())
        if not matches:
            raise PolicyError(f"policy: files pattern '{pattern}' matches no file")
        found.update(dict.fromkeys(matches))
    return list(found)


def read_policies(patterns: Iterable[str], base_dir: Path,
                  mode: Mode = "enforce") -> list[Policy]:
    """Every policy of the files `patterns` name, parsed but not validated."""
    policies: list[Policy] = []
    for path in files_of(patterns, base_dir):
        name = _shown(path, base_dir)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"policy: {name}: cannot read: {exc}") from None
        policies.extend(parse(text, name, mode))
    unique(policies)
    return policies


def unique(policies: Sequence[Policy]) -> None:
    """Raise PolicyError when two policies share an id (a decision names them by it)."""
    seen: dict[str, str] = {}
    for policy in policies:
        if policy.id in seen:
            raise PolicyError(f"policy: {policy.file}: policy id '{policy.id}' is also used "
                              f"in {seen[policy.id]}")
        seen[policy.id] = policy.file


def parse(text: str, file: str, mode: Mode = "enforce") -> list[Policy]:
    """The policies of one file's text; `file` names it in ids and errors."""
    try:
        doc = json.loads(cedarpy.policies_to_json_str(text))
    except ValueError as exc:
        raise PolicyError(f"policy: {file}: {_one_line(str(exc))}") from None
    if doc.get("templates"):
        raise PolicyError(f"policy: {file}: templates (?principal, ?resource) are not supported")
    static = doc.get("staticPolicies") or {}
    out: list[Policy] = []
    for n, key in enumerate(sorted(static, key=lambda k: int(k.removeprefix("policy"))), 1):
        est = static[key]
        notes = est.get("annotations") or {}
        pid = notes.get("id") or f"{file}:{n}"
        wanted = notes.get("mode", "enforce")
        if wanted not in _MODES:
            raise PolicyError(f"policy: {file}: policy {pid}: @mode must be \"shadow\" or "
                              f"\"enforce\", not {wanted!r}")
        out.append(Policy(pid, file, est["effect"], "shadow" if mode == "shadow" else wanted,
                          notes.get("reason"), est))
    return out


def load(patterns: Iterable[str], base_dir: Path, catalog: Catalog,
         mode: Mode = "enforce") -> list[Policy]:
    """Read, parse and validate; raise PolicyError on the first fault."""
    policies = read_policies(patterns, base_dir, mode)
    validate(policies, catalog)
    return policies


def validate(policies: Sequence[Policy], catalog: Catalog) -> None:
    """Validate each policy (strict) against the schema variants its scope can reach."""
    groups: dict[tuple[str, str], list[tuple[Policy, str]]] = {}
    for policy in policies:
        for tool_key, prompt_key, shown in _variants(policy, catalog):
            groups.setdefault((tool_key, prompt_key), []).append((policy, shown))
    problems: dict[str, None] = {}  # each problem once, though several variants show it
    for (tool_key, prompt_key), members in sorted(groups.items()):
        text = "\n".join(p.text for p, _ in members)
        result = cedarpy.validate_policies(text, json.dumps(catalog.variant(tool_key,
                                                                            prompt_key)))
        for error in result.errors:
            index = _index(error.policy_id)
            if index is None or index >= len(members):
                problems[f"policy: {_one_line(error.error)}"] = None
                continue
            policy, shown = members[index]
            problem = f"policy: {policy.file}: policy {policy.id}: {_problem(error.error)}"
            problems.setdefault(problem + (shown if "context" in problem else ""))
    if problems:
        first, *rest = problems
        raise PolicyError(first + (f" (and {len(rest)} more)" if rest else ""))


def _variants(policy: Policy, catalog: Catalog) -> list[tuple[str, str, str]]:
    """(tool input key, prompt input key, the targets named in an error) for each variant."""
    reach = reachable(policy.est, catalog.targets.values())
    per_kind: dict[str, dict[str, str]] = {"Tool": {}, "Prompt": {}}
    for target in reach:
        if target.kind in per_kind:
            key = catalog.input_of[(target.kind, target.uid)]
            per_kind[target.kind].setdefault(key, f"{target.kind.lower()} {target.uid}")
    tools = list(per_kind["Tool"].items()) or [(catalog.empty_key, "")]
    prompts = list(per_kind["Prompt"].items()) or [(catalog.empty_key, "")]
    out = []
    for tool, prompt in zip_longest(tools, prompts, fillvalue=None):
        t = tool or tools[0]
        p = prompt or prompts[0]
        shown = ", ".join(s for s in (t[1], p[1]) if s)
        out.append((t[0], p[0], f" (checked for {shown})" if shown else ""))
    return out


def reachable(est: dict[str, Any], targets: Iterable[Target]) -> list[Target]:
    """The targets a policy's scope (its action and resource constraints) can apply to."""
    kinds = _kinds(est.get("action") or {"op": "All"})
    resource = est.get("resource") or {"op": "All"}
    return [t for t in targets if t.kind in kinds and _in_scope(resource, t)]


def _kinds(action: dict[str, Any]) -> set[str]:
    if action.get("op") == "All":
        return set(CALL_ACTIONS.values())
    entities = action.get("entities") or ([action["entity"]] if "entity" in action else [])
    return {CALL_ACTIONS[e["id"]] for e in entities if e.get("id") in CALL_ACTIONS}


def _in_scope(resource: dict[str, Any], target: Target) -> bool:
    op = resource.get("op")
    if op == "All":
        return True
    if op == "is":
        if resource.get("entity_type") != f"{NAMESPACE}::{target.kind}":
            return False
        inner = resource.get("in")
        return inner is None or _under(inner["entity"], target)
    entity = resource.get("entity")
    if op == "==":
        return entity is not None and _same(entity, target)
    if op == "in":
        return entity is not None and _under(entity, target)
    return True  # anything newer than this reader knows: validate against every target


def _same(entity: dict[str, Any], target: Target) -> bool:
    return entity.get("type") == f"{NAMESPACE}::{target.kind}" and entity.get("id") == target.uid


def _under(entity: dict[str, Any], target: Target) -> bool:
    if entity.get("type") == f"{NAMESPACE}::Endpoint":
        return entity.get("id") == target.endpoint
    return _same(entity, target)


def _index(policy_id: str) -> int | None:
    tail = policy_id.removeprefix("policy")
    return int(tail) if policy_id.startswith("policy") and tail.isdigit() else None


def _problem(error: str) -> str:
    text = _one_line(error)
    if text.startswith("for policy `"):
        text = text.split("`, ", 1)[-1]
    return text


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shown(path: Path, base_dir: Path) -> str:
    try:
        return str(path.relative_to(base_dir))
    except ValueError:
        return str(path)
