"""The docs site (docs/, mkdocs.yml; issue 46): it builds with `mkdocs build --strict` (a
broken link or anchor, or a page missing from the navigation, fails the build), the built pages
load nothing from another host (no CDN at view time), every heading of the README it replaced
has a home in some page, the management API's reference pages are what the code generates, and
the short README's links and configuration example hold."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from proxy.config import from_dict
from tests.docs import api_reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# the README's `## ` and `### ` headings at 0ef97ef plus the Policies section added after it,
# taken once when its content moved into docs/ (the README itself no longer has them)
OLD_HEADINGS = Path(__file__).with_name("readme_headings.txt")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])([^"')\s]+)""")


def build(config: Path, site: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # not -q: mkdocs counts a warning against --strict only when it is logged
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        check=False, cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_site_builds_strict(site: Path) -> None:
    assert (site / "index.html").is_file()
    for page in DOCS.rglob("*.md"):
        assert (site / page.relative_to(DOCS).with_suffix(".html")).is_file(), page


def test_a_broken_link_or_a_page_left_out_of_the_navigation_fails_the_build(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs)
    (docs / "orphan.md").write_text("# Orphan\n")
    with (docs / "audit.md").open("a") as page:
        page.write("\nSee [nowhere](no-such-page.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs",
                                                                f"docs_dir: {docs}"))
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "orphan.md" in done.stderr and "no-such-page.md" in done.stderr


# the (tag, attribute) pairs whose URL a browser loads as it shows the page
LOADS = frozenset({("script", "src"), ("link", "href"), ("img", "src"), ("img", "srcset"),
                   ("iframe", "src"), ("source", "src"), ("source", "srcset"),
                   ("video", "src"), ("video", "poster"), ("audio", "src"), ("embed", "src"),
                   ("object", "data"), ("input", "src"), ("image", "href")})


class _Assets(HTMLParser):
    """Every URL a page loads: scripts, stylesheets and icons, images, frames, media, and
    the url()s of its inline styles."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._style = tag == "style"
        for name, value in attrs:
            if value is None:
                continue
            if (tag, name) in LOADS:
                self.urls += [part.split()[0] for part in value.split(",") if part.strip()] \
                    if name == "srcset" else [value]
            if name == "style":
                self.urls += CSS_URL.findall(value)

    def handle_data(self, data: str) -> None:
        if self._style:
            self.urls += CSS_URL.findall(data)


def test_the_built_site_loads_nothing_from_another_host(site: Path) -> None:
    external: set[str] = set()
    for page in site.rglob("*.html"):
        parser = _Assets()
        parser.feed(page.read_text("utf-8"))
        external |= {f"{page.name}: {url}" for url in parser.urls if EXTERNAL.match(url)}
        text = page.read_text("utf-8")
        external |= {f"{page.name}: {host}" for host in
                     ("fonts.googleapis.com", "fonts.gstatic.com", "cdn.jsdelivr.net",
                      "unpkg.com", "cdnjs.cloudflare.com") if host in text}
    for sheet in site.rglob("*.css"):
        external |= {f"{sheet.name}: {url}" for url in CSS_URL.findall(sheet.read_text("utf-8"))
                     if EXTERNAL.match(url)}
    assert not external


def _headings(text: str) -> set[str]:
    found: set[str] = set()
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := re.match(r"#{1,6} (.+)", line)):
            found.add(match.group(1).strip())
    return found


def test_every_heading_of_the_old_readme_has_a_home_in_the_docs() -> None:
    old = [line.lstrip("#").strip() for line in OLD_HEADINGS.read_text().splitlines()
           if line.strip()]
    assert len(old) > 30
    pages = set().union(*(_headings(page.read_text("utf-8")) for page in DOCS.rglob("*.md")))
    assert [heading for heading in old if heading not in pages] == []


def test_the_api_reference_is_what_the_code_generates() -> None:
    """`make docs-api` writes them anew after a change to the API's routes or models."""
    assert api_reference.JSON.read_text("utf-8") == api_reference.openapi_json(), \
        "docs/api/openapi.json is stale: run `make docs-api`"
    assert api_reference.PAGE.read_text("utf-8") == api_reference.page(), \
        "docs/api-reference.md is stale: run `make docs-api`"


README = ROOT / "README.md"


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    assert [link for link in links
            if not EXTERNAL.match(link) and not (ROOT / link).exists()] == []
    assert "make demo" in text and "make test" in text


def test_the_readme_configuration_example_is_a_valid_config() -> None:
    block = re.search(r"```toml\n(.*?)```", README.read_text("utf-8"), re.DOTALL)
    assert block is not None
    config = from_dict(tomllib.loads(block.group(1)), env={"GITHUB_TOKEN": "t"})
    assert [upstream.name for upstream in config.upstreams] == ["github"]
