"""The README and docs/ point at what exists: every relative link at a file and, after `#`, at one of its
headings (GitHub's anchors); every repository path they name in backticks at a file or folder; and
docs/development.md lists every make target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
TOP_FOLDERS = ("raygate", "webhook", "reconciler", "certs", "tests", "config", "charts", "image", "benchmarks", "docs")
REPO_PATH = re.compile(rf"`((?:{'|'.join(TOP_FOLDERS)})/[\w./-]*)`")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a bash block is not a heading)."""
    return "\n".join(part for i, part in enumerate(re.split(r"^```.*$", text, flags=re.M)) if i % 2 == 0)


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in out:
            n += 1
            candidate = f"{slug}-{n}"
        out.add(candidate)
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, fragment = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and fragment not in anchors(dest.read_text()):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_anchors_are_githubs() -> None:
    text = "# Configuration: ConfigMap `raygate-config`, key `config.yaml`\n## A\n## A\n```\n# not a heading\n```\n"
    assert anchors(text) == {"configuration-configmap-raygate-config-key-configyaml", "a", "a-1"}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n")
    page.write_text("# Top\n\n[ok](#top) [gone](missing.md) [no anchor](#bottom) [web](https://example.com/x)\n"
                    "[there](other.md#other) [not there](other.md#top)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page) == [
        "missing.md: no such file", "#bottom: no such heading", "other.md#top: no such heading",
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_repository_path_named_exists(page: Path) -> None:
    named = REPO_PATH.findall(page.read_text())
    missing = sorted({p for p in named if not (REPO / p).exists()})
    assert missing == [], f"{page.relative_to(REPO)} names paths that do not exist"


def test_the_development_page_lists_every_make_target() -> None:
    phony = re.search(r"^\.PHONY:(.*)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert phony is not None
    targets = phony.group(1).split()
    assert "test" in targets and "demo" in targets
    page = (REPO / "docs" / "development.md").read_text()
    assert [t for t in targets if f"`make {t}`" not in page] == []
