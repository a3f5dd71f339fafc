"""deploy/Dockerfile, read (CI has no Docker engine to build it): a builder stage makes the
wheel and installs it with the constraints; the final image has no build tools, runs as a
non-root user and checks /healthz with the image's own Python."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from tests.deploy.files import DEPLOY, ROOT

BUILD_TOOLS = ("gcc", "g++", "cc", "make", "build-essential", "python3-dev", "libpq-dev",
               "git", "curl", "wget")


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(the ARGs before the first FROM, the stages), each instruction with its continuation
    lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in logical:
        keyword, _, args = instruction.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            stages.append(Stage(words[0], name))
        elif not stages:
            if keyword == "ARG":
                key, _, value = args.partition("=")
                global_args[key] = value
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


def problems(text: str) -> list[str]:
    """What is wrong with a Dockerfile by the rules of issue 15 (empty: nothing)."""
    found: list[str] = []
    _global_args, stages = parse(text)
    if len(stages) < 2:
        return ["a single stage: the wheel must be built in a builder stage"]
    final = stages[-1]
    builders = stages[:-1]
    if not any("pip wheel" in run for stage in builders for run in stage.args("RUN")):
        found.append("no builder stage builds a wheel (pip wheel)")
    for stage in stages:
        for run in stage.args("RUN"):
            for command in re.split(r"&&|;|\|\|", run):
                if "pip" in command and " install" in command \
                        and "-c constraints.txt" not in command:
                    found.append(f"a pip install without -c constraints.txt: {command.strip()}")
    for run in final.args("RUN"):
        words = set(re.findall(r"[\w+.-]+", run))
        if re.search(r"\b(apt-get|apt|apk|dnf|yum)\b.*\binstall\b", run):
            found.append(f"the final stage installs system packages: {run}")
        if re.search(r"\bpip\b", run):
            found.append(f"the final stage runs pip (a cache, a compiler's work): {run}")
        for tool in BUILD_TOOLS:
            if tool in words:
                found.append(f"the final stage mentions the build tool {tool}")
    copies = final.args("COPY")
    if not any(c.startswith("--from=") for c in copies):
        found.append("the final stage copies nothing from a builder stage")
    for c in copies:
        if not c.startswith("--from="):
            found.append(f"the final stage copies from the build context, not a builder: {c}")
    users = final.args("USER")
    if not users:
        found.append("the final stage runs as root (no USER)")
    else:
        user = users[-1].split(":")[0]
        if user in ("root", "0"):
            found.append("the final stage's USER is root")
        elif not user.isdigit():
            found.append("USER is a name: runAsNonRoot needs a numeric uid to verify")
        elif not any(f"--uid {user}" in run for run in final.args("RUN")):
            found.append(f"USER {user} is not the uid the final stage creates")
    checks = final.args("HEALTHCHECK")
    if not checks:
        found.append("no HEALTHCHECK")
    else:
        check = checks[-1]
        env = " ".join(final.args("ENV"))
        if "urllib" not in check:
            found.append("the HEALTHCHECK does not use Python's urllib (slim has no curl)")
        if "/healthz" not in check + env:
            found.append("the HEALTHCHECK does not ask /healthz")
    if final.base != builders[0].base:
        found.append("the final stage's base differs from the builder's: the venv's python "
                     "link would not resolve")
    return found


def _dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text(encoding="utf-8")


def test_the_image_follows_the_rules() -> None:
    assert problems(_dockerfile()) == []


def test_the_rules_catch_the_image_this_one_replaced() -> None:
    # the single-stage image of before item 8: built in place, pip in the final image
    old = """FROM python:3.11-slim
WORKDIR /app
COPY proxy ./proxy
RUN pip install --no-cache-dir . && useradd --system tollhouse
USER tollhouse
CMD ["tollhouse", "serve"]
"""
    assert problems(old) == ["a single stage: the wheel must be built in a builder stage"]
    two_stages = """FROM python:3.11-slim AS builder
RUN pip wheel -w /w . && pip install /w/*.whl
FROM python:3.11-slim
RUN apt-get update && apt-get install -y gcc && pip install /w/x.whl
COPY proxy /app
USER 0
HEALTHCHECK CMD curl -f http://127.0.0.1:8080/
"""
    assert problems(two_stages) == [
        "a pip install without -c constraints.txt: pip install /w/*.whl",
        "a pip install without -c constraints.txt: pip install /w/x.whl",
        ("the final stage installs system packages: apt-get update && apt-get install -y gcc "
        "&& pip install /w/x.whl"),
        ("the final stage runs pip (a cache, a compiler's work): apt-get update && apt-get "
        "install -y gcc && pip install /w/x.whl"),
        "the final stage mentions the build tool gcc",
        "the final stage copies nothing from a builder stage",
        "the final stage copies from the build context, not a builder: proxy /app",
        "the final stage's USER is root",
        "the HEALTHCHECK does not use Python's urllib (slim has no curl)",
        "the HEALTHCHECK does not ask /healthz",
    ]


def test_the_builder_copies_only_what_exists_and_the_dockerignore_sends() -> None:
    _, stages = parse(_dockerfile())
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    sent = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore  # everything else (.venv, a local config, a database) stays out
    sources = [shlex.split(c)[:-1] for s in stages[:-1] for c in s.args("COPY")]
    for source in (path for group in sources for path in group):
        assert (ROOT / source).exists(), source
        assert source in sent, f"{source} is copied but the dockerignore does not send it"
    # the build needs exactly what the wheel is made of (pyproject's packages and readme)
    assert {"pyproject.toml", "README.md", "proxy", "policies", "constraints.txt"} <= sent


def test_the_image_python_is_the_one_the_constraints_were_resolved_on() -> None:
    global_args, stages = parse(_dockerfile())
    image = global_args["PYTHON_IMAGE"]
    constraints = (ROOT / "constraints.txt").read_text(encoding="utf-8")
    version = re.search(r"\(Python (3\.\d+)\)", constraints)
    assert version is not None
    assert image.startswith(f"python:{version.group(1)}-slim"), image
    assert all(stage.base == "${PYTHON_IMAGE}" for stage in stages)


def test_the_drain_is_not_cut_short_by_the_entrypoint() -> None:
    _, stages = parse(_dockerfile())
    final = stages[-1]
    # exec form: tollhouse is PID 1 and receives SIGTERM itself (a shell would swallow it)
    entrypoint = final.args("ENTRYPOINT")[-1]
    assert entrypoint.startswith("["), entrypoint
    assert final.args("STOPSIGNAL") == ["SIGTERM"]
