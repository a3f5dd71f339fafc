"""The shape the code keeps (issue 47): no import cycle among the project's modules, no
function over 60 lines in proxy/mcp/ nor over 80 anywhere in proxy/ and policies/, no class
over 350 lines, gateway.py within 350 lines, httpx kept inside proxy/upstream/, a docstring on
every module, and no module reaching into another's private names. Read from the source with
`ast`, so a change that breaks one of them fails here with the place named."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "policies")


@cache
def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@cache
def tree(name: str) -> ast.Module:
    return ast.parse(modules()[name].read_text(), filename=str(modules()[name]))


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import in `node` at any depth (a function's too), but those under
    `if TYPE_CHECKING:`, which never run."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child):
            for other in child.orelse:
                yield from _imports_in(other)
            continue
        yield from _imports_in(child)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from _imports(node)


def _owner(dotted: str) -> str | None:
    """The project module `dotted` names, or the one it lies in (a name in a module)."""
    while dotted and dotted not in modules():
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imported(name: str) -> set[str]:
    """The project modules `name` imports."""
    package = name if modules()[name].name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(tree(name)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        out.update(owner for target in targets
                   if target.split(".")[0] in PACKAGES and (owner := _owner(target)))
    out.discard(name)
    return out


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = {name: imported(name) for name in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def _defs(name: str) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    for node in ast.walk(tree(name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node


def _length(node: ast.stmt) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_import_cycle() -> None:
    assert cycles() == []


def test_no_function_over_its_limit() -> None:
    long = [f"{name}.{node.name}: {_length(node)} lines"
            for name in modules() for node in _defs(name)
            if not isinstance(node, ast.ClassDef)
            and _length(node) > (60 if name.startswith("proxy.mcp") else 80)]
    assert long == []


def test_no_class_over_350_lines() -> None:
    long = [f"{name}.{node.name}: {_length(node)} lines"
            for name in modules() for node in _defs(name)
            if isinstance(node, ast.ClassDef) and _length(node) > 350]
    assert long == []


def test_the_spine_stays_small() -> None:
    lines = len((ROOT / "proxy/mcp/gateway.py").read_text().splitlines())
    assert lines <= 350


def test_httpx_stays_inside_the_upstream_package() -> None:
    leaks = [name for name in modules()
             if name.startswith(("proxy.mcp", "proxy.virtual"))
             and any((isinstance(node, ast.Import)
                      and any(a.name.split(".")[0] == "httpx" for a in node.names))
                     or (isinstance(node, ast.ImportFrom)
                         and (node.module or "").split(".")[0] == "httpx")
                     for node in ast.walk(tree(name)))]
    assert leaks == []


def test_every_module_says_what_it_holds() -> None:
    assert [name for name in modules() if not ast.get_docstring(tree(name))] == []


def test_no_module_imports_another_modules_private_names() -> None:
    reaching = [f"{name}: from {node.module} import {alias.name}"
                for name in modules() for node in _imports(tree(name))
                if isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] in PACKAGES
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert reaching == []


def test_the_checks_see_a_cycle_and_a_long_function() -> None:
    """The checks above can fail: the cycle finder and the length measure on known input."""
    graph_before = modules().copy()
    assert "proxy.storage.db" in graph_before  # the walk found the project
    node = ast.parse("def f():\n" + "    x = 1\n" * 70).body[0]
    assert isinstance(node, ast.FunctionDef) and _length(node) == 71
    assert "proxy.storage.migrations" in imported("proxy.storage.db")
