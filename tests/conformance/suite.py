"""The official MCP conformance suite (`@modelcontextprotocol/conformance`, from the npm
registry): installed into a project-local cache, run against a URL, its results read per check.

Two pinned releases, one per protocol era: 0.1.16 runs the 2025-11-25 server scenarios and
0.2.0-alpha.12 (the 0.2 line exists only as prereleases) the 2026-07-28 ones. Both need Node 22
or newer (they import `fs.globSync`); when the machine's `node` is older, the Node 22 binary
that the npm registry ships as the package `node-linux-<arch>` is installed beside them.

Everything lands in `.conformance/` at the repository root (gitignored); a second run finds it
there and installs nothing. `python -m tests.conformance.suite` installs without running.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TOLLHOUSE_CONFORMANCE_CACHE", ROOT / ".conformance"))
PACKAGE = "@modelcontextprotocol/conformance"
# era -> the suite release that runs its server scenarios (pinned exactly)
RELEASES = {"2025-11-25": "0.1.16", "2026-07-28": "0.2.0-alpha.12"}
NODE_MAJOR = 22
NODE_RELEASE = "22.23.3"  # the node-linux-<arch> package, when the machine's node is older
INSTALL_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 240.0


class SuiteUnavailable(Exception):
    """npm is missing or the registry cannot be reached: nothing to run the suite with."""


@dataclass(frozen=True)
class Check:
    scenario: str
    id: str
    status: str  # SUCCESS, FAILURE, WARNING, INFO, SKIPPED
    error: str
    details: object

    @property
    def passed(self) -> bool:
        return self.status == "SUCCESS"


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise SuiteUnavailable("npm is not installed (.ci/run installs nodejs and npm with "
                               "apt-get; elsewhere install them)")
    return npm


def _node_major(node: str) -> int:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    match = re.match(r"v(\d+)\.", out.strip())
    return int(match.group(1)) if match else 0


def _npm_install(prefix: Path, spec: str) -> None:
    prefix.mkdir(parents=True, exist_ok=True)
    cmd = [_npm(), "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
           "--save-exact", "--loglevel=error", spec]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                              cwd=prefix, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SuiteUnavailable(f"`npm install {spec}` took over {INSTALL_TIMEOUT_S:.0f}s "
                               "(is the npm registry reachable?)") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SuiteUnavailable(f"`npm install {spec}` failed (exit {done.returncode}):\n{tail}")


def _installed_version(prefix: Path, name: str) -> str | None:
    manifest = prefix / "node_modules" / name / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


@contextmanager
def _locked() -> Iterator[None]:
    """One installer at a time (a make target and a test run may race)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _node_package() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower())
    if arch is None or not sys.platform.startswith("linux"):
        raise SuiteUnavailable(f"no Node {NODE_MAJOR} package for {sys.platform} "
                               f"{platform.machine()}: install Node {NODE_MAJOR}+ as `node`")
    return f"node-linux-{arch}"


def node() -> str:
    """A Node of at least NODE_MAJOR: the machine's, or the one installed into the cache."""
    system = shutil.which("node")
    if system and _node_major(system) >= NODE_MAJOR:
        return system
    name = _node_package()
    prefix = CACHE / "node"
    binary = prefix / "node_modules" / name / "bin" / "node"
    with _locked():
        if _installed_version(prefix, name) != NODE_RELEASE or not binary.exists():
            _npm_install(prefix, f"{name}@{NODE_RELEASE}")
    return str(binary)


def cli(era: str) -> Path:
    """The entry point of the suite release for `era`, installed if it is not yet."""
    release = RELEASES[era]
    prefix = CACHE / release
    entry = prefix / "node_modules" / PACKAGE / "dist" / "index.js"
    with _locked():
        if _installed_version(prefix, PACKAGE) != release or not entry.exists():
            _npm_install(prefix, f"{PACKAGE}@{release}")
    return entry


def install() -> tuple[str, dict[str, Path]]:
    return node(), {era: cli(era) for era in RELEASES}


_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$")


def read_results(directory: Path) -> dict[tuple[str, str], Check]:
    """Every check of a results directory (`server-<scenario>-<timestamp>/checks.json`), by
    (scenario, check id); a check id that occurs again in one scenario gets `#2`, `#3`..."""
    checks: dict[tuple[str, str], Check] = {}
    for sub in sorted(directory.iterdir()):
        match = _RESULT_DIR.match(sub.name)
        if not match or not (sub / "checks.json").exists():
            continue
        scenario = match.group("scenario")
        for raw in json.loads((sub / "checks.json").read_text()):
            key, n = (scenario, raw["id"]), 1
            while key in checks:
                n += 1
                key = (scenario, f"{raw['id']}#{n}")
            checks[key] = Check(scenario, key[1], raw.get("status", ""),
                                raw.get("errorMessage") or "", raw.get("details"))
    return checks


async def run(node_binary: str, entry: Path, era: str, url: str,
              out: Path) -> tuple[dict[tuple[str, str], Check], str]:
    """Every server scenario of `era` against `url`; the checks and the suite's own output.
    The suite exits 1 when any check fails: that is read from the checks, not the exit code."""
    out.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        node_binary, str(entry), "server", "--url", url, "--suite", "all",
        "--spec-version", era, "--output-dir", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=out)
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"the conformance suite ({era}) against {url} ran past "
                             f"{RUN_TIMEOUT_S:.0f}s") from None
    text = output.decode("utf-8", "replace")
    checks = read_results(out)
    if not checks:
        raise AssertionError(f"the conformance suite ({era}) against {url} wrote no results "
                             f"(exit {proc.returncode}):\n{text[-3000:]}")
    return checks, text


if __name__ == "__main__":
    try:
        binary, entries = install()
    except SuiteUnavailable as exc:
        sys.exit(f"conformance suite: {exc}")
    print(f"conformance suite: node {binary}; " + ", ".join(
        f"{era}: {RELEASES[era]}" for era in entries))
