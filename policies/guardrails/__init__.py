"""Guardrails for third-party servers (docs/guardrails.md): one policy, order 400, after
egress and before metering, so a call it denies is never billed.

- `check`: a tool, prompt or resource that screening or pinning hid answers as an unknown one
  would; a call's arguments are inspected by the `[[guardrails]]` rules that look there
  (redacted before forwarding, refused, or only audited).
- `rewriter`: a */list result is screened and its tools checked against their pins; a
  tools/call, prompts/get or resources/read result is inspected by the rules that look there.
  A call no guardrail reads the answer of gets no rewriter from here (None, checked once per
  call), so its answer may stream straight through.
- `noticer`: the notifications an upstream sends on such a call's stream (`notifications/
  message`, whose `data` is any JSON, every key of it read, and its `logger`; and
  `notifications/progress`, whose `message` is free text) are inspected by the same rules,
  one by one as they arrive: redacted, dropped (deny: the call goes on) or only audited; a
  `notifications/tasks/status` has its `statusMessage` read as a tasks/get's is (a denied one
  replaced by what a person reads of the refusal: the task's status still reaches the client).
Every decision goes in the call's audit note: the rule and the kinds found, never a value.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import orjson

from policies.guardrails.detect import Detector
from policies.guardrails.fold import table as fold_table
from policies.guardrails.inspect import scan
from policies.guardrails.pinning import Pins
from policies.guardrails.screen import Limits, screen
from proxy.chain import CallContext, Notice, Verdict
from proxy.config import Config, GuardrailRule, ScreeningConfig
from proxy.errors import GuardrailBlocked, GuardrailResultBlocked, HiddenTool, ToolResultDenial
from proxy.errors.render import tool_error_result
from proxy.jsonrpc import McpMessage

BLOCKED = "gateway.guardrail.blocked"
DEFAULT_SCREENING = ScreeningConfig()
# list method -> (key holding the list, field naming each item, kind)
_LISTS = {"tools/list": ("tools", "name", "tool"), "prompts/list": ("prompts", "name", "prompt"),
          "resources/list": ("resources", "uri", "resource"),
          "resources/templates/list": ("resourceTemplates", "uriTemplate", "resource")}
_RESULT_KIND = ("resultType",)  # what a denied tool result keeps of the upstream's
# a notification a call's stream may carry -> the params holding what it says (a progress
# notification's token is the client's own, and is not rewritten)
_NOTICES = {"notifications/message": ("data", "logger"), "notifications/progress": ("message",)}
# a task's status notification: its status message read as a tasks/get's is (`_status_rewriter`)
_STATUS = "notifications/tasks/status"
# a call -> (param naming what it uses, kind)
_USES = {"tools/call": ("name", "tool"), "prompts/get": ("name", "prompt"),
         "resources/read": ("uri", "resource")}
# a task's request (its tool is the message's `task_tool`, proxy.mcp.tasks) -> what of its
# answer a result rule reads: the tool's result itself, or the task's status message
_TASKS = {"tasks/result": None, "tasks/get": "statusMessage", "tasks/cancel": "statusMessage"}


@dataclass(frozen=True, slots=True)
class _Rule:
    cfg: GuardrailRule
    detector: Detector

    def applies(self, endpoint: str, name: str, where: str) -> bool:
        c = self.cfg
        return where in c.on and (not c.endpoints or endpoint in c.endpoints) and \
            any(fnmatch.fnmatchcase(name, p) for p in c.tools)

    def inspect(self, node: Any, ctx: CallContext, where: str) -> tuple[Any, str | None]:
        """`node` scanned (redacted in place when the action is redact) and the kinds found,
        comma-separated, noted for the audit record; None when nothing was found. A note
        already there is not repeated (a stream may carry many alike notifications)."""
        action = self.cfg.action
        node, kinds = scan(node, self.detector, redact=action == "redact",
                           result=where == "result")
        if not kinds:
            return node, None
        found = ",".join(sorted(kinds))
        text = f"guardrail {self.cfg.name}: {action} {found} in {where}"
        if text not in (ctx.audit_note or "").split("; "):
            _note(ctx, text)
        return node, found

    def blocked(self, found: str, where: str) -> str:
        """What a person reads: the rule and the kinds, never a value."""
        carrier = "arguments carry" if where == "arguments" else "result carries"
        return f"Blocked by guardrail '{self.cfg.name}': the {carrier} {found.replace(',', ', ')}."


class Hidden:
    """What the last lists of each endpoint hid (by screening or pinning): kept across
    reloads, like the pins, so a reload does not unhide a tool until it is listed again."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, str], set[str]] = {}

    def update(self, endpoint: str, kind: str, hidden: set[str], shown: set[str]) -> None:
        names = self._names.setdefault((endpoint, kind), set())
        names -= shown
        names |= hidden

    def __contains__(self, key: tuple[str, str, str]) -> bool:
        endpoint, kind, name = key
        names = self._names.get((endpoint, kind))
        return names is not None and name in names


class Guardrails:
    name: ClassVar[str] = "guardrails"
    order: ClassVar[int] = 400

    def __init__(self, cfg: Config, pins: Pins | None = None, hidden: Hidden | None = None
                 ) -> None:
        fold_table()  # screening and detection fold non-ASCII text: built at start-up
        self._rules = tuple(_Rule(r, Detector(r.detect, phone_region=r.phone_region))
                            for r in cfg.guardrails)
        self._screening = {u.name: u.screening for u in cfg.upstreams}
        self._pinning = {u.name: u.pinning.mode for u in cfg.upstreams}
        self.pins = pins or Pins()
        self.hidden = hidden or Hidden()

    @classmethod
    def wanted(cls, cfg: Config) -> bool:
        return bool(cfg.guardrails) or DEFAULT_SCREENING.mode != "off" or any(
            u.screening.mode != "off" or u.pinning.mode != "off" for u in cfg.upstreams)

    # -- before forwarding ---------------------------------------------------------------------

    async def check(self, call: McpMessage, ctx: CallContext) -> None:
        if call.task_tool is not None:  # a task's request: its tool hidden, it is too
            if (ctx.endpoint, "tool", call.task_tool) in self.hidden:
                raise HiddenTool("guardrails: tool hidden by screening or pinning",
                                 call.task_tool)
            return
        use = _USES.get(call.method or "")
        if use is None or call.params is None:
            return
        field, kind = use
        name = call.params.get(field)
        if not isinstance(name, str):
            return  # malformed: the upstream answers it
        if (ctx.endpoint, kind, name) in self.hidden:
            reason = f"guardrails: {kind} hidden by screening or pinning"
            exc = HiddenTool(reason, name)
            if kind != "tool":  # answered as an unknown prompt or resource
                exc.detail = f"Unknown prompt: {name}" if kind == "prompt" \
                    else f"Resource not found: {name}"
            raise exc
        arguments = call.params.get("arguments")
        if not isinstance(arguments, dict) or not arguments:
            return
        for rule in self._rules:
            if not rule.applies(ctx.endpoint, name, "arguments"):
                continue
            arguments, found = rule.inspect(arguments, ctx, "arguments")
            if found is None:
                continue
            action = rule.cfg.action
            if action == "deny":
                reason = f"guardrail {rule.cfg.name}: {found} in arguments"
                message = rule.blocked(found, "arguments")
                if kind == "tool":
                    raise ToolResultDenial(reason, message, BLOCKED)
                raise GuardrailBlocked(reason, message)
            if action == "redact":
                ctx.message = _with_arguments(ctx.message or call, arguments)

    # -- the answer ----------------------------------------------------------------------------

    def rewriter(self, call: McpMessage, ctx: CallContext
                 ) -> Callable[[dict[str, Any]], bool] | None:
        if self._lists(call, ctx):
            return self._list_rewriter(call, ctx)
        rules = self._result_rules(call, ctx)
        if not rules:
            return None
        method = call.method
        if method in _TASKS and _TASKS[method] is not None:
            return _status_rewriter(rules, ctx)

        def rewrite(result: dict[str, Any]) -> bool:
            changed = False
            for rule in rules:
                _, found = rule.inspect(result, ctx, "result")
                if found is None:
                    continue
                if rule.cfg.action == "redact":
                    changed = True
                elif rule.cfg.action == "deny":
                    _deny(result, method, rule, found)
                    return True
            return changed

        return rewrite

    def noticer(self, call: McpMessage, ctx: CallContext) -> Notice | None:
        """The rules that read this call's results read its stream's notifications too (a
        value a rule keeps out of the result must not reach the client beside it); None when
        no rule reads the results, so that call's events are not parsed for this."""
        rules = self._result_rules(call, ctx)
        if not rules:
            return None

        status = _status_rewriter(rules, ctx)

        def notice(message: dict[str, Any]) -> Verdict:
            method = message.get("method")
            params = message.get("params")
            if method == _STATUS and isinstance(params, dict):  # a task's state, kept
                return "changed" if status(params) else "kept"
            fields = _NOTICES.get(method, ()) if isinstance(method, str) else ()
            if not isinstance(params, dict):
                return "kept"
            said = {f: params[f] for f in fields if f in params}
            if not said:
                return "kept"
            verdict: Verdict = "kept"
            for rule in rules:
                said, found = rule.inspect(said, ctx, str(method))
                if found is None:
                    continue
                if rule.cfg.action == "deny":
                    return "dropped"
                if rule.cfg.action == "redact":
                    verdict = "changed"
            if verdict == "changed":
                params.update(said)
            return verdict

        return notice

    def notices(self, endpoint: str) -> bool:
        """Whether a rule reads the results (so the notifications) of some call on
        `endpoint`: a resumed stream holds its notifications for the answer's rules."""
        return any("results" in r.cfg.on and (not r.cfg.endpoints or endpoint in r.cfg.endpoints)
                   for r in self._rules)

    def _result_rules(self, call: McpMessage, ctx: CallContext) -> tuple[_Rule, ...]:
        if not self._rules:
            return ()
        if call.task_tool is not None:  # a task's: read as its tool's result is
            name: Any = call.task_tool if call.method in _TASKS else None
        else:
            use = _USES.get(call.method or "")
            name = call.params.get(use[0]) if use is not None and call.params else None
        if not isinstance(name, str):
            return ()
        return tuple(r for r in self._rules if r.applies(ctx.endpoint, name, "results"))

    def hides(self, call: McpMessage, ctx: CallContext) -> bool:
        """Whether screening or pinning may hide a name the list `call` gives (a flagged
        definition in mode "hide", a changed pinned tool in mode "approve"); "warn" hides
        nothing."""
        listing = _LISTS.get(call.method or "")
        if listing is None:
            return False
        if self._screening.get(ctx.endpoint, DEFAULT_SCREENING).mode == "hide":
            return True
        return listing[2] == "tool" and self._pinning.get(ctx.endpoint, "off") == "approve"

    def _lists(self, call: McpMessage, ctx: CallContext) -> bool:
        # a server added through /api/v1 has no table of its own: the defaults apply to it
        screening = self._screening.get(ctx.endpoint, DEFAULT_SCREENING)
        return call.method in _LISTS and (
            screening.mode != "off" or self._pinning.get(ctx.endpoint, "off") != "off")

    def _list_rewriter(self, call: McpMessage, ctx: CallContext
                       ) -> Callable[[dict[str, Any]], bool]:
        key, field, kind = _LISTS[call.method or ""]
        screening = self._screening.get(ctx.endpoint, DEFAULT_SCREENING)
        limits = Limits(screening.max_description_chars, screening.max_schema_bytes)
        pinning = self._pinning.get(ctx.endpoint, "off") if kind == "tool" else "off"
        endpoint = ctx.endpoint

        def rewrite(result: dict[str, Any]) -> bool:
            items = result.get(key)
            if not isinstance(items, list):
                return False
            kept: list[Any] = []
            hidden: set[str] = set()
            shown: set[str] = set()
            notes: list[str] = []
            for item in items:
                if not isinstance(item, dict) or not isinstance(item.get(field), str):
                    kept.append(item)
                    continue
                name = item[field]
                hide = False
                if screening.mode != "off":
                    broken = screen(item, limits)
                    if broken:
                        notes.append(f"{kind} {_shown(name)} {'+'.join(broken)}")
                        hide = screening.mode == "hide"
                if pinning != "off" and self.pins.verdict(endpoint, item) == "changed":
                    notes.append(f"{kind} {_shown(name)} changed since pinned")
                    hide = hide or pinning == "approve"
                (hidden if hide else shown).add(name)
                if not hide:
                    kept.append(item)
            self.hidden.update(endpoint, kind, hidden, shown)
            if notes:
                verb = "hid" if hidden else "flagged"
                _note(ctx, f"guardrails {verb}: {'; '.join(notes)}"[:1000])
            if len(kept) == len(items):
                return False
            result[key] = kept
            return True

        return rewrite


def _status_rewriter(rules: tuple[_Rule, ...], ctx: CallContext
                     ) -> Callable[[dict[str, Any]], bool]:
    """A task's state (tasks/get, tasks/cancel, an entry of tasks/list): its status message
    read by the rules that read its tool's results; one a rule denies is replaced by what a
    person reads of the refusal (the task's state still reaches the client)."""

    def rewrite(result: dict[str, Any]) -> bool:
        said = result.get("statusMessage")
        if not isinstance(said, str):
            return False
        changed = False
        for rule in rules:
            seen, found = rule.inspect({"statusMessage": said}, ctx, "result")
            if found is None:
                continue
            if rule.cfg.action == "deny":
                result["statusMessage"] = rule.blocked(found, "result")
                return True
            if rule.cfg.action == "redact":
                said, changed = seen["statusMessage"], True
        if changed:
            result["statusMessage"] = said
        return changed

    return rewrite


def _deny(result: dict[str, Any], method: str | None, rule: _Rule, found: str) -> None:
    """A tools/call's (or a task's tasks/result's) result becomes seed 001's tool error; a
    prompts/get's or resources/read's answer is seed 004's -32000 (raised: the relay answers
    it instead)."""
    message = rule.blocked(found, "result")
    reason = f"guardrail {rule.cfg.name}: {found} in result"
    if method not in ("tools/call", "tasks/result"):
        raise GuardrailResultBlocked(reason, message)
    # a 2026-07-28 result says what kind it is: the error replacing it is still a whole one
    kept = _RESULT_KIND if method == "tools/call" else (*_RESULT_KIND, "_meta")  # the task's
    kind = {k: result[k] for k in kept if k in result}
    result.clear()
    result.update(tool_error_result(ToolResultDenial(reason, message, BLOCKED)), **kind)


def _with_arguments(call: McpMessage, arguments: dict[str, Any]) -> McpMessage:
    """The call as it is forwarded: its arguments redacted, everything else as sent."""
    params = {**(call.params or {}), "arguments": arguments}
    obj = orjson.loads(call.body)
    obj["params"] = params
    return replace(call, params=params, body=orjson.dumps(obj))


def _note(ctx: CallContext, text: str) -> None:
    ctx.audit_note = text if not ctx.audit_note else f"{ctx.audit_note}; {text}"


def _shown(name: str) -> str:
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in name[:64])
