"""One record on its way to a receiver (`Event`), what an export of each format sends for it
(`payload`), and the failure a sender raises when a receiver refuses a batch (`SendFailed`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.audit.exports import ocsf


@dataclass(frozen=True, slots=True)
class Event:
    """One record to send: its event id, its native form, and what is sent (`payload`)."""

    event_id: str
    record: dict[str, Any]
    payload: dict[str, Any]

    @property
    def ts(self) -> float:
        return float(self.record["ts"])


def payload(fmt: str, record: dict[str, Any]) -> dict[str, Any]:
    """What an export of format `fmt` sends for a record in its native form."""
    return ocsf.event(record) if fmt == "ocsf" else record


class SendFailed(Exception):
    """The receiver refused a batch (its answer, never its body's secrets)."""
