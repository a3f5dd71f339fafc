"""The one error a config check raises: start-up (or a reload) refused, on one line."""

from __future__ import annotations

import re


class ConfigError(Exception):
    """Start-up refused: the message is one line that names the offending key."""

    def __init__(self, message: str) -> None:
        # a key or a value from the file it echoes stays on the line, escaped
        super().__init__(_LINE_BREAKS.sub(_escape, message))


# what would end or break a line in a terminal or a log: C0 and C1 controls, DEL, LS, PS
_LINE_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")
