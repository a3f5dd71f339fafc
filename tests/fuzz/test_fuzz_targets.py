"""The atheris fuzz targets (tests/fuzz/fuzz_*.py) as part of the suite.

Every input of the committed corpus replays without a failed property: an input that once
broke one is kept there, so this is its regression test. Then each target runs a short
coverage-guided campaign from that corpus under atheris (libFuzzer), a fixed number of inputs
from a fixed seed, and must find nothing. The campaign needs neither a database nor a store,
so it runs in one pass of `make test` only (sqlite, memory state); the replay runs in all.
`make fuzz` runs the targets for minutes each.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import db_backends, state_backends
from tests.fuzz.run import TARGETS

ROOT = Path(__file__).parents[2]
CORPUS = Path(__file__).parent / "corpus"
# inputs per target, a few seconds each on a busy machine (they differ ~30x in speed)
RUNS = {"jsonrpc": 20_000, "envelope": 20_000, "header": 50_000, "sse": 3_000, "relay": 5_000,
        "config": 600, "scan": 20_000}


@pytest.mark.parametrize("name", TARGETS)
def test_the_corpus_replays(name: str) -> None:
    target = importlib.import_module(f"tests.fuzz.fuzz_{name}")
    inputs = sorted((CORPUS / name).iterdir())
    assert inputs, f"no corpus for {name}"
    for path in inputs:
        try:
            target.check(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"corpus input {path.relative_to(ROOT)}") from exc


@pytest.mark.skipif(db_backends.backend() != "sqlite" or state_backends.backend() != "memory",
                    reason="independent of database and state: runs in the sqlite+memory pass")
@pytest.mark.parametrize("name", TARGETS)
def test_a_short_campaign_finds_nothing(name: str, tmp_path: Path) -> None:
    found = tmp_path / "new"
    found.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run", name, f"-runs={RUNS[name]}", "-seed=1",
         "-max_len=4096", f"-artifact_prefix={tmp_path}/", str(found), str(CORPUS / name)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    crashes = sorted(p.name for p in tmp_path.glob("crash-*"))
    assert proc.returncode == 0 and not crashes, (crashes, proc.stderr[-4000:])
    assert f"Done {RUNS[name]} runs" in proc.stderr
