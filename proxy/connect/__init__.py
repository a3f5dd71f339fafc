"""Per-user upstream connections: each person connects their own account at an upstream once;
Tollhouse keeps their tokens sealed in the vault, refreshes them, and uses them on that
person's calls (never the client's own token, never one shared account)."""
