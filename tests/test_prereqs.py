"""tests/prereqs.sh, which `make test` and .ci/run call first: it passes when every system program
the suite needs is there, and otherwise (no apt-get to install them with) names the Debian
packages and fails before any test runs.

Each case runs the script with a PATH of one temporary directory holding only the programs the
case gives it (empty scripts), so what the machine itself has installed does not matter."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "prereqs.sh"
BASH = shutil.which("bash") or "/bin/bash"
EVERY = ("node", "npm", "haproxy", "chromium", "chromedriver")


def run(tmp_path: Path, programs: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (*programs, "id"):  # id: the script asks whether it runs as root
        target = bin_dir / name
        if name == "id":
            target.symlink_to(shutil.which("id") or "/usr/bin/id")
        else:
            target.write_text("#!/bin/sh\n")
            target.chmod(0o755)
    # no apt-get on this PATH: the script cannot install, so it must name what is missing
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/")}
    return subprocess.run([BASH, str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=30, check=False)


def test_everything_there_passes_quietly(tmp_path: Path) -> None:
    done = run(tmp_path, EVERY)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_what_is_missing_is_named_by_its_package_and_stops_the_run(tmp_path: Path) -> None:
    done = run(tmp_path, ("node", "npm", "chromium"))
    assert done.returncode == 1
    assert "haproxy chromium-driver" in done.stderr
    assert "sudo apt-get install -y haproxy chromium-driver" in done.stderr
    assert "nodejs" not in done.stderr and " chromium " not in done.stderr


def test_on_a_bare_machine_every_package_is_named(tmp_path: Path) -> None:
    done = run(tmp_path, ())
    assert done.returncode == 1
    assert "apt-get install -y nodejs npm haproxy chromium chromium-driver\n" in done.stderr
