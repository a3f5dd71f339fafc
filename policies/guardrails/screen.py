"""Screening a tool's, prompt's or resource's definition before a client (and its model) reads
it: what `screen` returns is the list of rules the definition breaks, empty when it is clean.

The rules (docs/guardrails.md):
- `invisible`: a character a person does not see but a model reads: the Unicode tags block
  (U+E0000-E007F), zero-width characters (U+200B-200D, U+2060-2064, U+FEFF, U+180E) and the
  bidirectional controls (U+200E-200F, U+202A-202E, U+2066-2069, U+061C);
- `instructions.*`: text aimed at the model rather than at a person choosing a tool, one rule
  each (`RULES` below): overriding earlier instructions, pseudo-system markup, keeping something
  from the user, reading local secrets, making the model call something else first, and
  smuggling data into an argument;
- `oversized`: a description over `max_description_chars`, or schemas over
  `max_schema_bytes` (serialized), where instructions hide from a reviewer.
Every string in the definition is read: its description, title and the descriptions, titles,
defaults and enum values nested in its schemas; the `instructions.*` rules read their folded
copy too (`fold.py`: look-alike letters and invisible characters do not break a phrase).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from policies.guardrails.fold import fold

INVISIBLE = re.compile("[\U000e0000-\U000e007f\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                       "\u2066-\u2069\ufeff\u180e\u061c]")

_I = re.IGNORECASE
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("instructions.override", re.compile(
        r"\b(?:ignore|disregard|forget|override)\b.{0,30}\b(?:previous|prior|above|earlier|"
        r"all|any|other|system)\b.{0,20}\b(?:instructions?|prompts?|rules|directions)", _I)),
    ("instructions.markup", re.compile(
        r"<\s*/?\s*(?:important|system|instructions?|secret|hidden|admin)\s*>|\[/?INST\]|"
        r"<\|im_start\|>|<\|system\|>|\bsystem prompt\b", _I)),
    ("instructions.conceal", re.compile(
        r"\b(?:do not|don't|never|without)\b.{0,20}\b(?:tell|telling|inform|informing|mention|"
        r"mentioning|notify|notifying|reveal|revealing|show|showing|alert|alerting)\b.{0,15}"
        r"\b(?:the )?user\b|\bthe user (?:must|should) not (?:know|see|notice)", _I)),
    ("instructions.local_secrets", re.compile(
        r"(?:~/|\$HOME/)[\w./-]+|\bid_(?:rsa|ed25519|ecdsa)\b|/\.ssh\b|\.aws/credentials|"
        r"\bmcp\.json\b|\bcursor/|\bclaude_desktop_config", _I)),
    ("instructions.chain", re.compile(
        r"\b(?:before|after|instead of)\b.{0,30}\b(?:using|calling|call|use|invoking|running)"
        r"\b.{0,20}\b(?:this|any|the|other)\b.{0,15}\b(?:tools?|functions?)\b.{0,40}"
        r"\b(?:must|should|always|first|call|read|send|invoke)\b|\byou (?:must|should|have to)"
        r" (?:always |first )?(?:call|invoke|use|run|read)\b", _I)),
    ("instructions.exfiltrate", re.compile(
        r"\b(?:pass|send|include|put|add|copy|append|forward|upload)\b.{0,40}\b(?:contents?|"
        r"conversation|password|credentials?|keys?|tokens?|secrets?|history)\b.{0,40}"
        r"\b(?:parameter|argument|field|sidenote|note|url|request)\b", _I)),
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_description_chars: int = 4096
    max_schema_bytes: int = 65536


def screen(item: dict[str, Any], limits: Limits) -> list[str]:
    """The rules `item` (one entry of a tools/prompts/resources list) breaks."""
    broken: list[str] = []
    texts = list(_strings(item))
    if any(INVISIBLE.search(t) for t in texts):
        broken.append("invisible")
    joined = "\n".join(texts)
    folded = fold(joined)  # "Ign\u043ere" (a Cyrillic o) read as "Ignore" too
    read = joined if folded is None else f"{joined}\n{folded.text}"
    broken.extend(rule for rule, pattern in RULES if pattern.search(read))
    description = item.get("description")
    if isinstance(description, str) and len(description) > limits.max_description_chars or sum(len(orjson.dumps(item.get(k))) for k in ("inputSchema", "outputSchema",
                                                       "arguments")) > limits.max_schema_bytes:
        broken.append("oversized")
    return broken


_READ = frozenset({"description", "title", "default", "enum", "examples", "const", "name"})


def _strings(node: Any, key: str = "description") -> Iterator[str]:
    """The strings of a definition a model reads: names, descriptions, titles and values."""
    if isinstance(node, str):
        if key in _READ:
            yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            if isinstance(k, str) and INVISIBLE.search(k):
                yield k
            yield from _strings(v, k if isinstance(v, (str, list)) else "description")
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
