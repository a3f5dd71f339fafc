"""The copy of a text the detectors also read, with what hides a secret from them undone.

A secret with a zero-width space in it, or with a Cyrillic `а` or a script `ɡ` for a Latin
letter, reads the same to a person (and a model) but matches no pattern. The copy has each
non-ASCII character replaced by what it stands for: format characters (Unicode category Cf:
zero-width spaces and joiners, bidirectional controls, the tags block, the soft hyphen) and the
other default-ignorable code points (variation selectors, the combining grapheme joiner, Hangul
fillers) removed, each other character in its NFKC form (fullwidth and mathematical letters,
ligatures, no-break spaces), and a look-alike of an ASCII character folded to it with Unicode's
confusables data (UTS #39, as `confusable_homoglyphs` ships it: NFKC leaves U+0261 `ɡ` and
Cyrillic letters alone). ASCII is never changed, so an ASCII text needs no copy at all.

The table is built once, by the first `Detector` (start-up); `fold` finds the characters that
may change with one regular expression (at C speed), replaces them, and, only when the copy
holds a finding, walks over them to map its span back to the original, so a redaction
replaces the characters the finding was made of.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import unicodedata
from dataclasses import dataclass

# default-ignorable code points that are not format characters (DerivedCoreProperties.txt)
_IGNORABLE = frozenset((0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F,
                        0x3164, 0xFFA0, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)))
_UNREAD = frozenset(("Cn", "Co", "Cs"))  # unassigned, private use, surrogates: left as they are
# every plane with characters assigned: the BMP, 1-3, and 14 (tags, variation selectors)
_PLANES = ((0x80, 0x40000), (0xE0000, 0xF0000))
_LRM = "\u200e"  # the data wraps right-to-left characters in it


@dataclass(frozen=True, slots=True)
class Table:
    replace: dict[int, str]  # a changed character's code point -> what it becomes
    changed: re.Pattern[str]  # maybe one of those characters (an astral one: any)


@functools.cache
def table() -> Table:
    look_alikes = _look_alikes()
    category, normalize = unicodedata.category, unicodedata.normalize
    replace: dict[int, str] = {}
    for i in itertools.chain.from_iterable(range(*plane) for plane in _PLANES):
        c = chr(i)
        kind = category(c)
        if kind == "Cf" or i in _IGNORABLE:
            replace[i] = ""
        elif kind not in _UNREAD:
            n = normalize("NFKC", c)
            if n != c:
                replace[i] = "".join(look_alikes.get(x, x) for x in n)
            elif c in look_alikes:
                replace[i] = look_alikes[c]
    # every astral character is a candidate: a character class holds the BMP in one bitmap,
    # but tries each range beyond it in turn, for every character it reads
    bmp = sorted(i for i in replace if i <= 0xFFFF)
    return Table(replace, re.compile(_char_class(bmp)[:-1] + "\U00010000-\U0010ffff]"))


class Folded:
    """A text's folded copy, and where each of its characters came from."""

    __slots__ = ("_ends", "_origins", "_starts", "original", "text")

    def __init__(self, original: str, text: str) -> None:
        self.original = original
        self.text = text
        self._starts: list[int] | None = None
        self._ends: list[int] = []
        self._origins: list[int] = []

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original's span holding the copy's `start:end` (end > start)."""
        return self._origin(start), self._origin(end - 1) + 1

    def _origin(self, at: int) -> int:
        """The original index of the copy's character `at`."""
        if self._starts is None:
            self._map()
        starts, ends, origins = self._starts, self._ends, self._origins
        assert starts is not None
        before = bisect.bisect_right(ends, at) - 1  # the last change wholly before `at`
        inside = before + 1
        if inside < len(starts) and starts[inside] <= at:
            return origins[inside]
        return at if before < 0 else at - ends[before] + origins[before] + 1

    def _map(self) -> None:
        """Each changed character: where its replacement starts and ends in the copy, and
        where it is in the original (once, and only when there is a finding to map)."""
        tab = table()
        starts: list[int] = []
        shift = 0
        for m in tab.changed.finditer(self.original):
            by = tab.replace.get(ord(m.group()))
            if by is None:
                continue
            at = m.start()
            width = len(by)
            starts.append(at + shift)
            self._ends.append(at + shift + width)
            self._origins.append(at)
            shift += width - 1
        self._starts = starts


def fold(text: str) -> Folded | None:
    """The folded copy of `text`, or None when folding changes nothing (an ASCII text: at
    once)."""
    if text.isascii():
        return None
    tab = table()
    candidates = len(tab.changed.findall(text))  # at C speed
    if not candidates:
        return None
    replace = tab.replace
    if candidates * 10 < len(text):  # a few: each replaced on its own
        folded = tab.changed.sub(lambda m: replace.get(ord(m[0]), m[0]), text)
    else:  # many (Cyrillic or Greek prose): a lookup per character is cheaper than a call
        folded = text.translate(replace)
    return None if folded == text else Folded(text, folded)


def _look_alikes() -> dict[str, str]:
    """A non-ASCII character -> the ASCII it looks like. The data names one prototype per
    look-alike (`l` for `І`, `|`, `1` and `I` alike); of the ASCII characters that share that
    prototype, the one of the look-alike's own kind is taken (a capital for a capital, a digit
    for a digit), so Cyrillic `І` folds to `I`."""
    # imported here: it reads its data files on import, which a gateway without guardrails skips
    from confusable_homoglyphs.confusables import confusables_data  # type: ignore[import-untyped]

    data = {k.strip(_LRM): [h["c"].strip(_LRM) for h in v] for k, v in confusables_data.items()}
    out: dict[str, str] = {}
    for c, glyphs in data.items():
        if len(c) != 1 or c.isascii():
            continue
        target = next((g for g in glyphs if g and g.isascii()), None)
        if target is None:
            continue
        if len(target) == 1:
            same = [target, *(g for g in data.get(target, ()) if len(g) == 1 and g.isascii())]
            target = next((g for g in same if _kind(g) == _kind(c)), target)
        out[c] = target
    return out


def _kind(c: str) -> str:
    if c.isupper():
        return "upper"
    if c.islower():
        return "lower"
    return "digit" if c.isdigit() else "other"


def _char_class(points: list[int]) -> str:
    """A character class of `points` (sorted), as ranges."""
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(points), lambda p: p[1] - p[0]):
        group = [p for _, p in run]
        first, last = re.escape(chr(group[0])), re.escape(chr(group[-1]))
        parts.append(first if group[0] == group[-1] else f"{first}-{last}")
    return "[" + "".join(parts) + "]"
