"""Run one fuzz target under atheris (libFuzzer): `python -m tests.fuzz.run NAME [FLAGS] [DIRS]`.

NAME is a module tests/fuzz/fuzz_NAME.py with `check(data: bytes)`; the gateway's modules it
imports are instrumented for coverage. FLAGS and DIRS are libFuzzer's: the first corpus
directory is where new inputs are written, the others are read. An input that makes `check`
raise is a crash: libFuzzer writes it to the artifact prefix and exits non-zero.
"""

from __future__ import annotations

import importlib
import sys

TARGETS = ("jsonrpc", "envelope", "header", "sse", "config")


def main() -> None:
    import atheris  # type: ignore[import-untyped]

    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.run {{{','.join(TARGETS)}}} [libFuzzer flags]")
    with atheris.instrument_imports(include=["proxy"]):
        target = importlib.import_module(f"tests.fuzz.fuzz_{sys.argv[1]}")
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target.check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
