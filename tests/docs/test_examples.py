"""Every example in the docs runs (issue 46 item 5): each code block of docs/ marked as an
example is executed here, by its language, so the docs cannot drift from the product.

The marker is a line `<!-- example -->` directly above the block's opening fence (no blank
line between them). It is an HTML comment: MkDocs passes it through to the page's source and
the browser shows nothing, so a marked block renders exactly like any other. A marker that is
not directly above a fence, or above a block of a language this module does not run, fails
`test_every_marker_is_on_a_block_this_module_runs`.

What each language's example must do:

- `toml`: a config file (a whole one, or the tables it is about: the loader fills the rest with
  their defaults). It is parsed and loaded with `proxy.config.from_dict`, which validates it
  with an empty directory as the config's directory, and must load without error. A `${VAR}`
  in it reads a placeholder value (any name is set). A file the example names (an issuer's PEM
  key) is not there: inline it, or leave the block unmarked.
- `sh` / `bash`: commands against a demo gateway (`tollhouse demo --port 0`, one for the
  module, on its own database). They run with `bash -e -o pipefail` (the first command that
  fails fails the example) within `TIMEOUT_S`, and must exit 0.
  A `curl` in one says `-f` (`curl -fsS`): without it an HTTP error still exits 0.
- `python`: a script against the same demo gateway (the SDK walk-through), run with this
  interpreter within `TIMEOUT_S`; it must exit 0.

Shell and Python examples run in one scratch directory that holds `config.toml`, the demo's own
config (its address, its database, its `demo` endpoint), and `.venv`, this interpreter's
environment; the PATH starts with that environment's bin, so `tollhouse` and
`.venv/bin/tollhouse` both run this checkout. Before an example runs, the placeholders the
docs use are replaced (`substitute`):

- `http://127.0.0.1:8080` and `http://localhost:8080` (the gateway's default address) become
  the demo's address;
- `/tmp/tollhouse-demo-…/tollhouse.db` (the database the demo prints, any text for its
  temporary directory's suffix) becomes the demo's database.

Mark only what can run here: no `make demo` or `tollhouse serve` (they run until stopped), no
Docker, kubectl or production host, no call to the management API with an admin key (the demo
runs `auth.mode = "none"`, where API keys are not accepted). Cedar blocks are checked by
tests/policies/cedar/test_docs_policies.py, not here. `AT_LEAST` is how many marked blocks
of each kind the pages hold today: an example that loses its marker (or a finder that stops
finding them) fails `test_the_pages_hold_their_examples`.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from proxy.config import from_dict
from tests.helpers import DEADLINE_S

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKER = "<!-- example -->"
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
KINDS = {"toml": "toml", "sh": "shell", "bash": "shell", "python": "python"}
AT_LEAST = {"toml": 6, "shell": 6, "python": 1}
TIMEOUT_S = 60.0  # one example's commands, end to end
DEMO_MCP_URL = re.compile(r"MCP URL +(http://127\.0\.0\.1:\d+)/mcp/demo")


@dataclass(frozen=True)
class Example:
    page: str  # relative to docs/
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def kind(self) -> str | None:
        return KINDS.get(self.lang)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}:{self.lang}"


def _closing(lines: list[str], opening: int, fence: str) -> int | None:
    """The line that closes the block opened at `opening` with `fence`, if any."""
    return next((j for j in range(opening + 1, len(lines))
                 if lines[j].strip().startswith(fence)
                 and lines[j].strip().strip(fence[0]) == ""), None)


def find(docs: Path = DOCS) -> tuple[list[Example], list[str]]:
    """The marked blocks of every page under `docs`, and each misplaced marker (page:line).
    A marker inside a code block (a page showing the marker itself) is text, not a marker."""
    found: list[Example] = []
    faults: list[str] = []
    for page in sorted(docs.rglob("*.md")):
        name = page.relative_to(docs).as_posix()
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            marked = lines[i].strip() == MARKER
            fenced = i + marked < len(lines) and FENCE.match(lines[i + marked].lstrip())
            if marked and not fenced:
                faults.append(f"docs/{name}:{i + 1}: {MARKER} is not directly above a fence")
            if not fenced:
                i += 1
                continue
            start = i + marked
            fence, lang = fenced.groups()
            end = _closing(lines, start, fence)
            if end is None:
                faults.append(f"docs/{name}:{start + 1}: a code block is never closed")
                break
            if marked:
                found.append(Example(name, start + 1, lang,
                                     "\n".join(lines[start + 1:end]) + "\n"))
            i = end + 1
    return found, faults


EXAMPLES, FAULTS = find()


class _AnyEnv(Mapping[str, str]):
    """An environment in which every variable is set, to a placeholder long enough for any
    check of a secret's length."""

    def __getitem__(self, name: str) -> str:
        return f"example-value-of-{name}-0123456789abcdef"

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclass(frozen=True)
class Demo:
    url: str  # the gateway's address, http://127.0.0.1:<port>
    db: Path
    workdir: Path  # config.toml and .venv, where the shell and Python examples run


def substitute(text: str, demo: Demo) -> str:
    """The example with the docs' placeholders replaced by the demo's (the module's docstring
    has the rule)."""
    text = re.sub(r"http://(?:127\.0\.0\.1|localhost):8080", demo.url, text)
    return re.sub(r"/tmp/tollhouse-demo-[^/\s]*/tollhouse\.db", str(demo.db), text)


def _mcp_url(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The demo's address from its first line on stdout; fails past the deadline or if it
    exits first, showing what it logged."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        said = sel.select(DEADLINE_S * 3)
    line = proc.stdout.readline().decode() if said else ""
    match = DEMO_MCP_URL.search(line)
    assert match, (f"tollhouse demo's first line: {line!r} (exit {proc.poll()}); it logged:\n"
                   + log.read_text(errors="replace")[-3000:])
    return match.group(1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One `tollhouse demo` for the module, on a database of its own, ready to answer."""
    tmp = tmp_path_factory.mktemp("demo")
    db = tmp / "tollhouse.db"
    with (tmp / "demo.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "demo", "--port", "0", "--db", str(db)],
            stdout=subprocess.PIPE, stderr=log, cwd=tmp)
        try:
            url = _mcp_url(proc, tmp / "demo.log")
            # its socket listens before the banner: this waits in the backlog until it serves
            assert httpx.get(f"{url}/readyz", timeout=DEADLINE_S * 3,
                             trust_env=False).status_code == 200
            work = tmp / "work"
            work.mkdir()
            (work / ".venv").symlink_to(sys.prefix, target_is_directory=True)
            (work / "config.toml").write_text(
                f'[server]\nlisten = "{url.removeprefix("http://")}"\npublic_url = "{url}"\n'
                f'[auth]\nmode = "none"\n[database]\nurl = "sqlite:///{db}"\n'
                f'[[upstreams]]\nname = "demo"\nurl = "{url}/mcp/demo"\n')
            yield Demo(url, db, work)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(DEADLINE_S * 3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()


def _run(argv: list[str], demo: Demo, example: Example) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    done = subprocess.run(argv, cwd=demo.workdir, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, (
        f"docs/{example} failed (exit {done.returncode}):\n{argv[-1]}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")


def test_every_marker_is_on_a_block_this_module_runs() -> None:
    unknown = [f"docs/{e}: no runner for {e.lang!r} (runs: {', '.join(KINDS)})"
               for e in EXAMPLES if e.kind is None]
    assert FAULTS + unknown == []


def test_the_pages_hold_their_examples() -> None:
    counts = Counter(e.kind for e in EXAMPLES)
    short = {kind: f"{counts[kind]} < {least}" for kind, least in AT_LEAST.items()
             if counts[kind] < least}
    assert short == {}, f"fewer marked examples than the pages hold: {short}"


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.kind == "toml"], ids=str)
def test_a_config_example_loads(example: Example, tmp_path: Path) -> None:
    from_dict(tomllib.loads(example.text), env=_AnyEnv(), base_dir=tmp_path)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.kind == "shell"], ids=str)
def test_a_shell_example_runs_against_the_demo(example: Example, demo: Demo) -> None:
    _run(["bash", "-e", "-o", "pipefail", "-c", substitute(example.text, demo)], demo, example)


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.kind == "python"], ids=str)
def test_a_python_example_runs_against_the_demo(example: Example, demo: Demo) -> None:
    _run([sys.executable, "-c", substitute(example.text, demo)], demo, example)
