"""Per-user upstream connections: each person connects their own account at an upstream once;
Tollhouse keeps their tokens sealed in the vault, refreshes them, and uses them on that
person's calls (never the client's own token, never one shared account)."""

from __future__ import annotations


class ConnectFailed(Exception):
    """The connect flow failed; the message is for the person's page (no tokens in it)."""
