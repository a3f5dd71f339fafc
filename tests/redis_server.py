"""A private `redis-server` for the outage tests: started on a free loopback port, and stopped,
paused or started again on that same port while a gateway uses it (the machine's Redis at 6379
is never touched)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from tests.helpers import DEADLINE_S, free_port


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.mkdtemp(prefix="tollhouse-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (Debian's redis-server package)"
        self._process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self._dir, "--logfile", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()

    def wait_ready(self) -> None:
        client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
        end = time.monotonic() + DEADLINE_S
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    pass
                assert self._process is not None and self._process.poll() is None, \
                    "redis-server exited at start"
                assert time.monotonic() < end, "redis-server did not answer in time"
                time.sleep(0.01)  # the poll interval of a wait with a deadline
        finally:
            client.close()

    def kill(self) -> None:
        """Gone at once, as a crashed or restarted Redis is (it keeps nothing on disk)."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(DEADLINE_S)
        self._process = None

    def pause(self) -> None:
        """Still listening but answering nothing: a hung or partitioned Redis."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGCONT)

    def command(self, *args: object) -> object:
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGCONT)  # a paused one dies as well
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()
