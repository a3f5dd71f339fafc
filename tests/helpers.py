"""Helpers every test package shares: a settable fake clock, a hand-driven clock for call
deadlines, a token maker for the test issuer, and a waiter that polls a condition with a
deadline instead of sleeping a fixed time; a loopback port for a child process to bind."""

from __future__ import annotations

import asyncio
import inspect
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import jwt

DEADLINE_S = 10.0  # how long a test waits for something that should happen at once

ISSUER = "https://idp.test/"
SECRET = "a-test-hs256-secret-of-at-least-32-bytes"


_PICK = random.SystemRandom()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (what it hands to a bind to port 0 and
    to every outgoing connection); 32768 where it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port nobody listens on now, for a child process that binds it itself, by
    number. Taken below the kernel's ephemeral range: a port the kernel handed out for a bind
    to 0 and that was let go is one it may hand to any outgoing connection a moment later, and
    with two test passes side by side one did take a replica's port between its pick and the
    replica's bind ("Address already in use"). Outside that range only another explicit bind
    can take it."""
    low = _ephemeral_low()
    for _ in range(200):
        # (the system's randomness: a test that seeds the random module cannot make two
        # passes pick the same ports)
        port = _PICK.randrange(10000, low) if low > 11000 else 0
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise AssertionError("no free loopback port found")


def audience(endpoint: str = "e") -> str:
    """The audience the gateway expects at `endpoint`: its default public URL's."""
    return f"http://127.0.0.1:8080/mcp/{endpoint}"


def jwt_auth(**auth: object) -> dict[str, object]:
    """An `[auth]` table that trusts the test issuer (HS256 with `SECRET`)."""
    return {"mode": "jwt", "issuers": [{"issuer": ISSUER, "hs256_secret": SECRET,
                                        "algorithms": ["HS256"]}], **auth}


def token(key: object = SECRET, alg: str = "HS256", *, endpoint: str = "e",
          headers: dict[str, str] | None = None, **claims: object) -> str:
    """A JWT from the test issuer for `endpoint`, valid for five minutes; `claims` override."""
    now = int(time.time())
    body = {"iss": ISSUER, "aud": audience(endpoint), "sub": "alice", "iat": now,
            "exp": now + 300, **claims}
    return jwt.encode(body, key, algorithm=alg, headers=headers)  # type: ignore[arg-type]


class Clock:
    """A fake monotonic clock: calling it reads `now`, which a test sets or moves with
    `advance`; with `step`, every reading moves it on by that much."""

    def __init__(self, now: float = 1000.0, step: float = 0.0) -> None:
        self.now, self.step = now, step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Timer:
    seconds: float
    fire: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Deadlines:
    """A call-deadline clock (`create_app(later=...)`) that fires only when a test says so:
    a total-timeout test needs no short real timeout and no race with the machine's load."""

    def __init__(self) -> None:
        self.timers: list[Timer] = []
        self.armed = asyncio.Event()

    def __call__(self, seconds: float, fire: Callable[[], object]) -> Timer:
        timer = Timer(seconds, fire)
        self.timers.append(timer)
        self.armed.set()
        return timer

    def expire(self) -> int:
        """Fire every deadline still armed; how many fired."""
        live = [t for t in self.timers if not t.cancelled]
        for timer in live:
            timer.cancelled = True
            timer.fire()
        return len(live)

    @property
    def live(self) -> int:
        return sum(not t.cancelled for t in self.timers)


SERVING = re.compile(r"Running on http://127\.0\.0\.1:(\d+)")  # `tollhouse serve`'s line


async def serving_port(proc: asyncio.subprocess.Process, seen: list[str]) -> str:
    """The port a `tollhouse serve` child (its stderr a pipe) says it listens on, each line
    read meanwhile appended to `seen`; fails the test if it exits first or takes too long."""
    assert proc.stderr is not None
    async with asyncio.timeout(DEADLINE_S * 3):
        while True:
            line = (await proc.stderr.readline()).decode()
            assert line, "tollhouse serve exited: " + "".join(seen)
            seen.append(line)
            if match := SERVING.search(line):
                return match.group(1)


async def until(check: Callable[[], object | Awaitable[object]], deadline_s: float = DEADLINE_S,
                what: str = "the condition") -> None:
    """Return once `check()` holds, polling; fail the test past the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        assert time.monotonic() < end, f"{what} did not hold within {deadline_s} s"
        await asyncio.sleep(0.01)  # the poll interval: a check that holds returns at once

