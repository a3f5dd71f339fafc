"""The console script: start-up refusals are one clear line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import main


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[server]\nlisten = "127.0.0.1:8080"\nbogus = 1\n', "unknown key 'server.bogus'"),
        ('[[upstreams]]\nname = "a"\nurl = "localhost:3001"\n', "'upstreams[0].url'"),
        ('[server]\nmax_request_bytes = "4MB"\n', "'server.max_request_bytes' must be an integer"),
    ],
)
def test_serve_refuses_a_bad_config(tmp_path: Path, capsys, text: str, message: str) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    assert main(["serve", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_serve_without_a_config(monkeypatch, capsys) -> None:
    monkeypatch.delenv("TOLLHOUSE_CONFIG", raising=False)
    assert main(["serve"]) == 2
    assert "pass --config PATH or set TOLLHOUSE_CONFIG" in capsys.readouterr().err


def test_console_script_reads_tollhouse_config(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[auth]\nmode = "magic"\n')
    result = subprocess.run([sys.executable, "-m", "proxy", "serve"], capture_output=True,
                            text=True, env={"TOLLHOUSE_CONFIG": str(cfg), "PATH": ""},
                            timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "tollhouse: config: 'auth.mode' must be one of none, jwt")
