"""Auth-failure lockouts where a credential is presented: one helper for the MCP edge, the
management API, the sign-in form and the OAuth client authentication alike. Each keys on the
caller's address (through trusted proxies); sign-in also on the user name and the token
endpoint on the client id, whose secrets can be guessed. The state is a `LockoutStore` of
`proxy.state` (re-exported here). A locked-out caller gets `proxy.errors.LockedOut`: 429 with
Retry-After and one text, in the OAuth shape on every surface (seed 004)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from proxy.errors import LockedOut
from proxy.state.lockouts import LockoutStore

REASON = "auth: locked out after repeated failures"


class Attempt:
    """One credential check under the lockout:

        async with Attempt(store, keys) as attempt:
            ...check the credential; for a bad one set `attempt.failed = True`...

    Entering raises `LockedOut` when a key is locked already, before anything is checked.
    Leaving settles the attempt in one store operation, counting the failure, and raises
    `LockedOut` in place of whatever the block returned or raised when a key was locked, by this
    caller's parallel attempts too: so N guesses sent at once get at most `max_failures`
    answers that tell anything. With no keys (no address known) nothing is asked. `reason` is
    what the audit log records for a locked-out caller."""

    __slots__ = ("_keys", "_reason", "_store", "failed")

    def __init__(self, store: LockoutStore, keys: Sequence[str], reason: str = REASON) -> None:
        self._store = store
        self._keys = keys
        self._reason = reason
        self.failed = False

    async def __aenter__(self) -> Attempt:
        if self._keys:
            retry = await self._store.locked(self._keys)
            if retry is not None:
                raise LockedOut(self._reason, retry)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if not self._keys or (exc_type is not None and not issubclass(exc_type, Exception)):
            return  # cancelled: there is no answer to hold back
        retry = await self._store.attempt(self._keys, failed=self.failed)
        if retry is not None:
            raise LockedOut(self._reason, retry) from None
