"""Secrets and personal data in text: one compiled scan, then a check per candidate.

A text is scanned once per pattern family, each a compiled expression that begins with a
literal or a small character class, so the engine searches for candidates rather than trying
every pattern at every position (one alternation of them all is several times slower in
Python's engine: it has no prefilter for alternations). The secret patterns follow the set
detect-secrets keeps (its plugins for AWS, private keys, GitHub, GitLab, Slack, Stripe,
Twilio, SendGrid, npm, Mailchimp, Square, Azure storage, OpenAI, Google, JWTs, credentials in
URLs, and keyword assignments such as `password = ...`); its entropy-only plugins are the
optional `entropy` kind, off unless asked for, because they flag UUIDs and hashes. A
candidate must start a token (no letter, digit or `_` just before it) and pass its kind's
check: a card number Luhn and an issuer prefix, an IBAN its mod-97 checksum, a phone number
`phonenumbers`' validation with strict grouping. A text with non-ASCII characters that hide a
finding (a zero-width space inside a key, a Cyrillic letter for a Latin one) is read twice: as
it is and as its folded copy (`fold.py`), each finding in the copy mapped back to the
characters of the original it was made of.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import phonenumbers

from policies.guardrails.fold import fold, table

# detect = [...] names -> the kind a redaction and the audit record name
KINDS = {"secrets": "secret", "card_numbers": "card_number", "iban": "iban", "email": "email",
         "phone": "phone", "entropy": "entropy"}
DEFAULT_DETECT = ("secrets", "card_numbers", "iban", "email", "phone")

# Each secret pattern begins with a literal, so the regular-expression engine finds its
# candidates with a substring search rather than by trying every position; the keyword
# assignments (`password = ...`) run only on a text that holds one of the keywords.
_SECRETS = (
    r"A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}",  # AWS access key id
    r"aws_?(?:secret_?access_?key|secret)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}",
    r"AWS_?(?:SECRET_?ACCESS_?KEY|SECRET)[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+=]{40}",
    (r"-----BEGIN[A-Z ]{0,30}PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]{0,8192}?"
     r"-----END[A-Z ]{0,30}PRIVATE KEY(?: BLOCK)?-----)?"),
    r"gh[pousr]_[A-Za-z0-9]{36}",  # GitHub
    r"github_pat_[A-Za-z0-9_]{22,255}",
    r"glpat-[A-Za-z0-9_-]{20}",  # GitLab
    r"xox[abposr]-[A-Za-z0-9-]{10,}",  # Slack tokens
    r"hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+",
    r"sk_live_[A-Za-z0-9]{24,}", r"rk_live_[A-Za-z0-9]{24,}",  # Stripe
    r"AC[a-f0-9]{32}", r"SK[a-f0-9]{32}",  # Twilio
    r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",  # SendGrid
    r"npm_[A-Za-z0-9]{36}",
    r"-us[0-9]{1,2}(?![\w])",  # Mailchimp (its 32 hex digits: `_widen`)
    r"sq0(?:csp|atp)-[A-Za-z0-9_-]{22,43}",  # Square
    r"AccountKey=[A-Za-z0-9+/=]{88}",  # Azure storage
    r"sk-(?:proj-)?[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}",  # OpenAI
    r"AIza[A-Za-z0-9_-]{35}",  # Google API key
    r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # JWT
    r"://[^\s:/?#@\"']{1,64}:[^\s:/?#@\"']{1,128}@",  # credentials in a URL
)
_HEX32 = re.compile(r"[0-9a-f]{32}")
# `password = ...`, `"api_key": "..."`: run on the lower-cased text, each only where its
# keyword occurs (a keyword is a literal prefix; one pattern with IGNORECASE is many times slower)
_KEYWORDS = tuple((k, re.compile(k + r"[\"']?\s*[:=]\s*[\"']?(?!\[redacted)[^\s\"',;]{8,}"))
                  for k in ("password", "passwd", "pwd", "secret", "api_key", "apikey",
                            "access_token", "auth_token", "token"))
_SCANS = tuple(re.compile(p) for p in _SECRETS)
_EMAIL = re.compile(r"@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}(?![\w-])")
_LOCAL = re.compile(r"[A-Za-z0-9._%+-]{1,64}$")
# the check digits, just after a two-letter country code (the lookbehind is cheap: it fails at
# once where the digit does not follow two capitals)
_IBAN = re.compile(r"[0-9](?<=[A-Z]{2}[0-9])[0-9](?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?"
                   r"(?!\w)")
# digits with spaces, dashes, dots or brackets among them: a card or a phone (`_digits`)
_DIGITS = re.compile(r"[0-9+(][0-9 ().-]{6,30}(?<=[0-9])(?!\w)")
_DATE = re.compile(r"[0-9]{4}[-./][0-9]{1,2}[-./][0-9]{1,2}|[0-9]{1,2}[-./][0-9]{1,2}[-./]"
                   r"[0-9]{2,4}|[0-9]{4}-[0-9]{4}")
_LOOSE = re.compile(r"[ .-]{2}|[()][ .-]?[()]|\($|\)\(")
_ENTROPY = re.compile(r"(?<![\w+/=-])(?:[A-Za-z0-9+/]{20,}={0,2}|[A-Za-z0-9_-]{20,})(?![\w+/=-])")
_NOT_BEFORE_DIGITS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               "0123456789_.+-")
_NOT_DIGIT = re.compile(r"[^0-9]")
_CARD_PREFIX = re.compile(r"4|5[1-5]|2[2-7]|3[47]|3[0689]|6(?:011|5|4[4-9]|2)")


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    start: int
    end: int


class Detector:
    """The kinds one guardrail looks for, compiled once (at start-up, per rule)."""

    def __init__(self, detect: Iterable[str] = DEFAULT_DETECT, *, phone_region: str = "US"
                 ) -> None:
        self.kinds = frozenset(KINDS[d] for d in detect)
        self._region = phone_region
        self._card = "card_number" in self.kinds
        self._phone_on = "phone" in self.kinds
        table()  # built once, here at start-up, rather than on the first non-ASCII text

    def find(self, text: str) -> list[Finding]:
        found = self._find(text)
        folded = fold(text)  # None at once for an ASCII text
        if folded is not None:
            found.extend(Finding(f.kind, *folded.span(f.start, f.end))
                         for f in self._find(folded.text))
        return found

    def _find(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        kinds = self.kinds
        if "secret" in kinds:
            for scan in _SCANS:
                found.extend(Finding("secret", *span) for m in scan.finditer(text)
                             if (span := _widen(text, m)) is not None)
            lower = text.lower()
            if len(lower) == len(text):  # (some non-ASCII letters lower-case to two)
                for keyword, scan in _KEYWORDS:
                    if keyword in lower:
                        found.extend(Finding("secret", m.start(), m.end())
                                     for m in scan.finditer(lower) if _bounded(text, m.start()))
        if "email" in kinds and "@" in text:
            for m in _EMAIL.finditer(text):
                local = _LOCAL.search(text, max(0, m.start() - 64), m.start())
                if local is not None and _bounded(text, local.start()) and \
                        text[local.start() - 1:local.start()] not in (":", "/"):
                    found.append(Finding("email", local.start(), m.end()))
        if "iban" in kinds:
            for m in _IBAN.finditer(text):
                at = m.start() - 2
                if _bounded(text, at) and _iban_ok(text[at:m.end()]):
                    found.append(Finding("iban", at, m.end()))
        if self._card or self._phone_on:
            for m in _DIGITS.finditer(text):
                at = m.start()
                if at and text[at - 1] in _NOT_BEFORE_DIGITS:
                    continue
                kind = None if _LOOSE.search(m.group()) else self._digits(m.group())
                if kind is not None:
                    found.append(Finding(kind, at, m.end()))
        if "entropy" in kinds:
            found.extend(self._high_entropy(text))
        return found

    def redact(self, text: str) -> tuple[str, set[str]]:
        """`text` with each finding replaced by `[REDACTED:<kind>]`, and the kinds found."""
        return apply(text, self.find(text))

    def _digits(self, text: str) -> str | None:
        digits = _NOT_DIGIT.sub("", text)
        if "card_number" in self.kinds and 13 <= len(digits) <= 19 and not text.startswith(
                ("+", "(")) and _CARD_PREFIX.match(digits) and _luhn(digits) and \
                _card_groups(text):
            return "card_number"
        if "phone" in self.kinds and 7 <= len(digits) <= 15 and (
                text.startswith("+") or digits != text):
            return "phone" if self._phone(text) else None
        return None

    def _phone(self, text: str) -> bool:
        """A real number for the region (or international, with +), grouped as such numbers
        are written; a bare run of digits with no separator is an id, not a phone number
        (`_digits`), and a date is a date."""
        return _DATE.fullmatch(text) is None and _phone(text, self._region)

    @staticmethod
    def _high_entropy(text: str) -> list[Finding]:
        out = []
        for m in _ENTROPY.finditer(text):
            s = m.group()
            limit = 3.0 if all(c in "0123456789abcdefABCDEF" for c in s) else 4.2
            if _shannon(s) > limit:
                out.append(Finding("entropy", m.start(), m.end()))
        return out


def apply(text: str, found: list[Finding]) -> tuple[str, set[str]]:
    """`text` with the spans of `found` replaced by `[REDACTED:<kind>]`; the kinds replaced."""
    if not found:
        return text, set()
    found.sort(key=lambda f: f.start)
    parts: list[str] = []
    kinds: set[str] = set()
    at = 0
    for f in found:
        if f.start < at:  # overlapping (an entropy run inside a secret, or the same finding
            at = max(at, f.end)  # in a text and its folded copy): one redaction covers both
            continue
        kinds.add(f.kind)
        parts.append(text[at:f.start])
        parts.append(f"[REDACTED:{f.kind}]")
        at = f.end
    parts.append(text[at:])
    return "".join(parts), kinds


def _bounded(text: str, at: int) -> bool:
    """Nothing of a word just before `at`: a pattern starts a token, not the middle of one."""
    return at == 0 or not (text[at - 1].isalnum() or text[at - 1] == "_")


def _widen(text: str, m: re.Match[str]) -> tuple[int, int] | None:
    """The span to redact (a Mailchimp key's 32 hex digits before its `-us`, a URL's
    credentials without its `://`), or None for a match inside a longer token."""
    start = m.start()
    if text.startswith("://", start):
        return start + 3, m.end() - 1
    if text.startswith("-us", start):
        start -= 32
        if start < 0 or _HEX32.fullmatch(text, start, start + 32) is None:
            return None
    return (start, m.end()) if _bounded(text, start) else None


@functools.lru_cache(maxsize=4096)  # phonenumbers is pure Python: a number is read once
def _phone(text: str, region: str) -> bool:
    try:
        number = phonenumbers.parse(text, None if text.startswith("+") else region)
    except phonenumbers.NumberParseException:
        return False
    if not phonenumbers.is_possible_number(number):
        return False
    matcher = phonenumbers.PhoneNumberMatcher(text, region,
                                              leniency=phonenumbers.Leniency.STRICT_GROUPING)
    return any(m.start == 0 and m.end == len(text) for m in matcher)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_groups(text: str) -> bool:
    """Unseparated, or groups of 4 (4-6-5 for 15-digit cards) split by one kind of separator."""
    seps = {c for c in text if not c.isdigit()}
    if not seps:
        return True
    if len(seps) > 1 or seps - {" ", "-"}:
        return False
    groups = [len(g) for g in text.split(seps.pop())]
    return groups[:-1] == [4] * (len(groups) - 1) and 1 <= groups[-1] <= 4 or groups == [4, 6, 5]


def _iban_ok(text: str) -> bool:
    s = text.replace(" ", "")
    if not 15 <= len(s) <= 34:
        return False
    moved = s[4:] + s[:4]
    number = "".join(str(int(c, 36)) for c in moved)
    return int(number) % 97 == 1


def _shannon(s: str) -> float:
    counts: dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    n = len(s)
    return -sum(k / n * math.log2(k / n) for k in counts.values())
