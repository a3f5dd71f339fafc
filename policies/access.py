"""Who may use an endpoint, and which of its tools, prompts and resources they may see and use.

Caller rules (`allow_subjects`, `allow_groups`, `allow_scopes`, `allow_keys`) admit a caller
that matches any of them; all empty admits anyone authenticated. A tool profile is an
allowlist and a denylist of glob patterns: the endpoint's own plus those of `group_tools` for
each group the caller is in. An empty allowlist allows every name; a deny always wins. A name
the caller may not use is hidden from `*/list` results and answers exactly as an unknown name.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from proxy.auth.principal import Principal
from proxy.chain import CallContext
from proxy.config import AccessConfig, Config
from proxy.errors import Forbidden, HiddenTool
from proxy.jsonrpc import McpMessage
from proxy.published import Published

_REMEMBERED = 4096  # names (or group sets) whose verdict a profile (or rule set) keeps


@dataclass(frozen=True)
class Profile:
    allow: tuple[str, ...]
    deny: tuple[str, ...]
    # name -> verdict: the same few tool names are asked about on every call, and a profile
    # never changes (a changed rule set is a new Profile); emptied when it fills up
    _verdicts: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    def denial(self, name: str) -> str | None:
        """None when `name` may be used, else the rule that hides it."""
        verdicts = self._verdicts
        try:
            return verdicts[name]
        except KeyError:
            pass
        if len(verdicts) >= _REMEMBERED:
            verdicts.clear()
        verdict = verdicts[name] = self._judge(name)
        return verdict

    def _judge(self, name: str) -> str | None:
        for pattern in self.deny:
            if fnmatch.fnmatchcase(name, pattern):
                return f"matches deny pattern '{pattern}'"
        if self.allow and not any(fnmatch.fnmatchcase(name, p) for p in self.allow):
            return "matches no allow pattern"
        return None


@dataclass(frozen=True)
class _Rules:
    subjects: frozenset[str]
    groups: frozenset[str]
    scopes: frozenset[str]
    keys: frozenset[str]
    tools: Profile
    group_tools: dict[str, Profile]
    prompts: Profile
    resources: Profile
    # a caller's groups -> their tool profile, built once per distinct set of groups (so its
    # verdicts are kept too); emptied when it fills up
    _by_groups: dict[frozenset[str], Profile] = field(default_factory=dict, compare=False,
                                                      repr=False)

    @property
    def restricts(self) -> bool:
        return bool(self.subjects or self.groups or self.scopes or self.keys)

    def tool_profile(self, principal: Principal) -> Profile:
        if not self.group_tools or not principal.groups:
            return self.tools
        groups = principal.groups
        profile = self._by_groups.get(groups)
        if profile is None:
            if len(self._by_groups) >= _REMEMBERED:
                self._by_groups.clear()
            profile = self._by_groups[groups] = self._combined(groups)
        return profile

    def _combined(self, groups: frozenset[str]) -> Profile:
        extra = [self.group_tools[g] for g in sorted(groups) if g in self.group_tools]
        if not extra:
            return self.tools
        return Profile(self.tools.allow + tuple(p for e in extra for p in e.allow),
                       self.tools.deny + tuple(p for e in extra for p in e.deny))

    @property
    def filters(self) -> bool:
        return bool(self.tools.allow or self.tools.deny or self.group_tools or self.prompts.allow
                    or self.prompts.deny or self.resources.allow or self.resources.deny)


def _compile(access: AccessConfig) -> _Rules:
    return _Rules(
        frozenset(access.allow_subjects), frozenset(access.allow_groups),
        frozenset(access.allow_scopes), frozenset(access.allow_keys),
        Profile(tuple(access.tools_allow), tuple(access.tools_deny)),
        {g: Profile(tuple(p.tools_allow), tuple(p.tools_deny))
         for g, p in access.group_tools.items()},
        Profile(tuple(access.prompts_allow), tuple(access.prompts_deny)),
        Profile(tuple(access.resources_allow), tuple(access.resources_deny)))


# list method -> (key in the result holding the list, field naming each item, which profile)
_LISTS = {"tools/list": ("tools", "name", "tools"), "prompts/list": ("prompts", "name", "prompts"),
          "resources/list": ("resources", "uri", "resources"),
          "resources/templates/list": ("resourceTemplates", "uriTemplate", "resources")}
# method naming one tool, prompt or resource -> (params field, which profile, noun); every
# such method is decided by the rules for that name, subscriptions and completions included
_USES = {"tools/call": ("name", "tools", "tool"), "prompts/get": ("name", "prompts", "prompt"),
         "resources/read": ("uri", "resources", "resource"),
         "resources/subscribe": ("uri", "resources", "resource"),
         "resources/unsubscribe": ("uri", "resources", "resource")}
# completion/complete names what it completes in params.ref: a prompt by name, a resource
# template by its URI template (the field templates are listed, and filtered, by)
_REFS = {"ref/prompt": ("name", "prompts", "prompt"),
         "ref/resource": ("uri", "resources", "resource")}
_SAFE = re.compile(r"[^A-Za-z0-9_./:*?\[\]-]")


class Access:
    name: ClassVar[str] = "access"
    order: ClassVar[int] = 100

    def __init__(self, cfg: Config, added: Published[_Rules] | None = None) -> None:
        """`added`: the rules of the endpoints the management API added (`published()`),
        which its registries publish; the config file's are compiled here."""
        self._rules = {u.name: _compile(u.access) for u in cfg.upstreams}
        self._rules.update({e.name: _compile(e.access) for e in cfg.endpoints})
        self._added = added if added is not None else self.published()
        self._public_url = cfg.server.public_url.rstrip("/")

    @staticmethod
    def published() -> Published[_Rules]:
        """The table the management API's rules are published in (endpoint -> AccessConfig)."""
        return Published(_compile)

    def _of(self, endpoint: str) -> _Rules | None:
        return self._rules.get(endpoint) or self._added.current.get(endpoint)

    def refusal(self, endpoint: str, principal: Principal) -> str | None:
        """Why `principal` may not use `endpoint` at all, or None: what the consent page
        answers before a token is issued that every call would refuse. Names the rules (and a
        bare name in allow_subjects that differs from the caller's subject only by its
        `local:` prefix), never other people's names."""
        rules = self._of(endpoint)
        if rules is None or not rules.restricts or _admitted(rules, principal):
            return None
        why = (f"{principal.subject} is not in the access rules of endpoint {endpoint} "
               "(allow_subjects, allow_groups)")
        if rules.scopes and not (rules.subjects or rules.groups):
            why += "; it admits only tokens with scopes, which this gateway does not grant"
        bare = principal.subject.partition(":")[2]
        if bare and bare in rules.subjects:
            why += f"; allow_subjects names '{bare}', which matches only '{bare}', " \
                   f"not '{principal.subject}'"
        return why

    @classmethod
    def wanted(cls, cfg: Config) -> bool:
        return any(u.access != AccessConfig() for u in cfg.upstreams) or \
            any(e.access != AccessConfig() for e in cfg.endpoints)

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        rules = self._rules.get(ctx.endpoint) or self._added.current.get(ctx.endpoint)
        if rules is None:
            return
        principal = ctx.principal
        if rules.restricts and not _admitted(rules, principal):
            headers = None
            if rules.scopes and not (principal.scopes & rules.scopes):
                scope = " ".join(sorted(rules.scopes))
                headers = {"WWW-Authenticate":
                           f'Bearer error="insufficient_scope", scope="{scope}", '
                           f'resource_metadata="{self._public_url}/.well-known/'
                           f'oauth-protected-resource/mcp/{ctx.endpoint}"'}
            raise Forbidden(f"access: caller not allowed on endpoint {ctx.endpoint}",
                            headers=headers)
        named = _named(call)
        if named is None:
            return
        name, kind, noun = named
        profile = rules.tool_profile(principal) if kind == "tools" else getattr(rules, kind)
        denial = profile.denial(name)
        if denial is not None:
            shown = _SAFE.sub("?", name[:100])
            raise HiddenTool(f"access: {noun} {shown} {denial}", name) \
                if kind == "tools" else _hidden(noun, shown, denial, name)

    def rewriter(self, call: McpMessage, ctx: CallContext
                 ) -> Callable[[dict[str, Any]], bool] | None:
        """For a */list call on an endpoint with a profile: a function that removes what the
        caller may not use from the result, in place. None where there is nothing to hide."""
        listing = _LISTS.get(call.method or "")
        if listing is None:  # (a tools/call: the common case)
            return None
        rules = self._of(ctx.endpoint)
        if rules is None or not rules.filters:
            return None
        key, field, kind = listing
        profile = rules.tool_profile(ctx.principal) if kind == "tools" else getattr(rules, kind)
        if not profile.allow and not profile.deny:
            return None

        def rewrite(result: dict[str, Any]) -> bool:
            items = result.get(key)
            if not isinstance(items, list):
                return False
            kept = [i for i in items if isinstance(i, dict) and isinstance(i.get(field), str)
                    and profile.denial(i[field]) is None]
            private = result.get("cacheScope") == "public"
            if private:  # filtered per caller: no shared cache may serve it to another one
                result["cacheScope"] = "private"
            if len(kept) == len(items):
                return private
            result[key] = kept
            return True

        return rewrite


def _named(call: McpMessage) -> tuple[str, str, str] | None:
    """(name, which profile, noun) of what `call` uses; None for a method that names nothing,
    or a malformed one (the upstream answers it)."""
    if call.task_tool is not None:  # a tasks/* request: decided by its task's tool
        return call.task_tool, "tools", "tool"
    params: dict[str, Any] | None = call.params
    if params is None:
        return None
    use = _USES.get(call.method or "")
    if use is None and call.method == "completion/complete":
        ref = params.get("ref")
        kind = ref.get("type") if isinstance(ref, dict) else None
        use = _REFS.get(kind) if isinstance(kind, str) else None
        params = ref if use is not None else None
    if use is None or params is None:
        return None
    field, profile, noun = use
    name = params.get(field)
    return (name, profile, noun) if isinstance(name, str) else None


def _admitted(rules: _Rules, principal: Principal) -> bool:
    return (principal.subject in rules.subjects or bool(principal.groups & rules.groups)
            or bool(principal.scopes & rules.scopes)
            or (principal.api_key_id is not None and principal.api_key_id in rules.keys))


def _hidden(noun: str, shown: str, denial: str, name: str) -> HiddenTool:
    exc = HiddenTool(f"access: {noun} {shown} {denial}", name)
    exc.detail = f"Unknown {noun}: {name}" if noun == "prompt" else f"Resource not found: {name}"
    return exc

