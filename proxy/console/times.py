"""Times as people read them: a page's period is a relative range (the last 15 minutes, hour,
today, yesterday, the last 7 days) or two date-times in a time zone (the browser's: the page's
script puts its IANA name in the form's `tz`; without the script, UTC), never Unix seconds.
The period is read from the page's URL (`range`, or `from`/`to` and `tz`), so a view can be
shared, and turned into the API's Unix `since`/`until` here."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from werkzeug.datastructures import MultiDict

RANGES = {"15m": "last 15 minutes", "1h": "last hour", "24h": "last 24 hours",
          "today": "today", "yesterday": "yesterday", "7d": "last 7 days"}
SPANS = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400}
INPUT = "%Y-%m-%dT%H:%M"  # what <input type=datetime-local> sends and shows


@dataclass(frozen=True)
class Period:
    """A period as the page shows it and the API reads it."""

    since: float | None
    until: float | None
    range: str  # one of RANGES, or "" for two date-times (or none)
    zone: str  # the IANA name the date-times are in
    start: str  # the `from` input's value (in `zone`), or ""
    end: str  # the `to` input's value, or ""
    problems: tuple[str, ...] = ()

    @property
    def args(self) -> dict[str, str]:
        """What the page's URL holds of it (for links that keep it)."""
        if self.range:
            return {"range": self.range, "tz": self.zone}
        out = {"from": self.start, "to": self.end, "tz": self.zone}
        return {k: v for k, v in out.items() if v and (k != "tz" or self.start or self.end)}

    @property
    def api(self) -> dict[str, str]:
        """The API's Unix parameters."""
        return {k: f"{v:.3f}" for k, v in (("since", self.since), ("until", self.until))
                if v is not None}

    def utc(self, at: float | None) -> str:
        return "" if at is None else stamp(at, "UTC")

    @property
    def words(self) -> str:
        """The period in words, its bounds in UTC."""
        if self.since is None and self.until is None:
            return "all time"
        name = RANGES.get(self.range, "")
        bounds = f"{self.utc(self.since) or 'the first record'} to " \
                 f"{self.utc(self.until) or 'now'} UTC"
        return f"{name} ({bounds})" if name else bounds


def zone_of(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC") if name and len(name) < 64 else ZoneInfo("UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def stamp(at: float, zone: str = "UTC", seconds: bool = False) -> str:
    """`at` as a date and time in `zone` (no zone name)."""
    shown = datetime.fromtimestamp(float(at), tz=zone_of(zone))
    return shown.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def iso(at: float) -> str:
    """`at` in ISO 8601 UTC, for a <time datetime> the page's script shows in local time."""
    return datetime.fromtimestamp(float(at), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(value: str, zone: ZoneInfo) -> float | None:
    try:
        return datetime.strptime(value[:16], INPUT).replace(tzinfo=zone).timestamp()
    except ValueError:
        return None


def period(args: MultiDict[str, str], default: str = "", now: float | None = None) -> Period:
    """The period of a page's query string; `default` a range for a page that shows one
    when none is asked for."""
    zone = zone_of(args.get("tz"))
    zone_name = str(zone.key)
    at = time.time() if now is None else now
    start, end = args.get("from", "").strip(), args.get("to", "").strip()
    # dates typed win over a range (the form shows a range's dates empty, so dates sent are
    # ones the person just set; the page's script empties them when a range is chosen)
    chosen = "" if start or end else args.get("range", "")
    if chosen not in RANGES:
        chosen = "" if start or end else default
    if chosen:
        start_at, end_at = _relative(chosen, zone, at)
        return Period(start_at, end_at, chosen, zone_name, "", "")
    problems = []
    since = _parse(start, zone) if start else None
    until = _parse(end, zone) if end else None
    for label, value, parsed in (("From", start, since), ("To", end, until)):
        if value and parsed is None:
            problems.append(f"{label}: not a date and time")
    return Period(since, until, "", zone_name, start if since else "",
                  end if until else "", tuple(problems))


def _relative(chosen: str, zone: ZoneInfo, now: float) -> tuple[float, float | None]:
    if chosen in SPANS:
        return now - SPANS[chosen], None
    midnight = datetime.fromtimestamp(now, tz=zone).replace(hour=0, minute=0, second=0,
                                                            microsecond=0)
    if chosen == "today":
        return midnight.timestamp(), None
    before = (midnight - timedelta(days=1)).replace(tzinfo=zone)  # (a day across a DST change)
    return before.timestamp(), midnight.timestamp()
