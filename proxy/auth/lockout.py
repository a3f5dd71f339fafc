"""Auth-failure lockouts where a credential is presented: one helper for the MCP edge, the
management API, the sign-in form and the OAuth client authentication alike. Each keys on the
caller's address (through trusted proxies); sign-in also on the user name and the token
endpoint on the client id, whose secrets can be guessed. The state is a `LockoutStore` of
`proxy.state` (re-exported here). A locked-out caller gets `proxy.errors.LockedOut`: 429 with
Retry-After and one text, in the OAuth shape on every surface (seed 004)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Self

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
    what the audit log records for a locked-out caller.

    `unguessable` is for credentials nobody can guess (a JWT's signature, an API key's 256-bit
    secret; not a password or a client secret): holding back a correct one found in a burst of
    wrong ones protects nothing there, so a success is not settled at all and answers from the
    look on entry (the locks this process knows: with Redis, a lock set by another replica is
    known here from this process's next settled failure of that key). Failures are settled as
    ever, so they stay exactly counted across replicas, and a bearer call costs no lockout
    command on Redis."""

    __slots__ = ("_keys", "_reason", "_store", "_unguessable", "failed")

    def __init__(self, store: LockoutStore, keys: Sequence[str], reason: str = REASON, *,
                 unguessable: bool = False) -> None:
        self._store = store
        self._keys = keys
        self._reason = reason
        self._unguessable = unguessable
        self.failed = False

    async def __aenter__(self) -> Self:
        if self._keys:
            retry = await self._store.locked(self._keys)
            if retry is not None:
                raise LockedOut(self._reason, retry)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if not self._keys or (exc_type is not None and not issubclass(exc_type, Exception)):
            return  # cancelled: there is no answer to hold back
        if self._unguessable and not self.failed:
            return  # a success that no guess could have found: nothing to settle
        retry = await self._store.attempt(self._keys, failed=self.failed)
        if retry is not None:
            raise LockedOut(self._reason, retry) from None
