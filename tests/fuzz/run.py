"""Run one fuzz target under atheris (libFuzzer): `python -m tests.fuzz.run NAME [FLAGS] [DIRS]`.

NAME is a module tests/fuzz/fuzz_NAME.py with `check(data: bytes)`; the gateway's modules it
imports are instrumented for coverage, and tests/fuzz/NAME.dict, when there is one, is its
dictionary. FLAGS and DIRS are libFuzzer's: the first corpus
directory is where new inputs are written, the others are read. An input that makes `check`
raise is a crash: libFuzzer writes it to the artifact prefix and exits non-zero.
"""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path

TARGETS = ("jsonrpc", "envelope", "header", "sse", "relay", "config", "scan")


def main() -> None:
    import atheris  # type: ignore[import-untyped]

    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.run {{{','.join(TARGETS)}}} [libFuzzer flags]")
    name, flags = sys.argv[1], sys.argv[2:]
    words = Path(__file__).with_name(f"{name}.dict")
    if words.exists() and not any(flag.startswith("-dict=") for flag in flags):
        flags.insert(0, f"-dict={words}")
    with atheris.instrument_imports(include=["proxy"]):
        target = importlib.import_module(f"tests.fuzz.fuzz_{name}")
    # libFuzzer runs a child (to merge, or with -jobs) as a shell command line made of argv:
    # the first word has to start this same target again
    again = " ".join(shlex.quote(word) for word in (sys.executable, "-m", "tests.fuzz.run", name))
    atheris.Setup([again, *flags], target.check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
