"""The documentation's links resolve, and it speaks of the product.

Every relative link of README.md, CONTRIBUTING.md and the pages under docs/ names a file that
exists, and a link with an anchor names a heading of its target (GitHub's anchor rule). No page
speaks in the voice of the people writing it or points outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "bench" / "README.md", *(ROOT / "docs").rglob("*.md")]
)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
#: Phrases of internal voice: the issue tracker, the machine a session ran on, paths outside the repository.
INTERNAL = re.compile(
    r"[Tt]he issue('s| (asks|says|wants|measured))|\b[Ii]ssues? #?[0-9]+|this 2-core machine|this session|the session that|shared/papers|\.\./shared/"
)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (lower case, punctuation dropped, spaces to hyphens)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.*)", line):
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower().replace("`", "")).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_anchor_rule_matches_githubs():
    page = ROOT / "docs" / "results" / "deep-sea-treasure.md"
    assert {"fedprefs-hyper-parameters", "the-comparison-at-20-rounds", "every-method-at-20-rounds-6-seeds"} <= anchors(
        page
    )


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_voice(page: Path):
    lines = [f"{i}: {line}" for i, line in enumerate(page.read_text().splitlines(), 1) if INTERNAL.search(line)]
    assert lines == []
