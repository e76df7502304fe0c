"""The documentation stays true: the parameter page is what its generator writes from the parameters' one
definition, every relative link in README.md and docs/*.md resolves (files, and #anchors to headings), and every
``runs/...`` path the docs mention exists (the committed benchmark and evaluation results they quote)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oxygen_ros.runtime.param_docs import DOC_PATH, REGENERATE, render

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# runs/ paths the docs name that are not committed, each with the reason: outputs a command writes when run.
NOT_COMMITTED = {
    "runs/eval": "the output folder of the example bag-evaluation command",
    "runs/gpu": "where scripts/gpu_bench.sh writes by default (a run's results are committed under their own name)",
    "runs/load_check": "the per-round pytest logs of tools/load_check.sh (its summary is in the docs)",
}
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_RUNS = re.compile(r"(?<![\w/.$-])runs/(?:[\w.*?/-]|<\w+>)*")  # <name>: a placeholder, globbed as *


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """Every heading anchor of ``page``, with GitHub's ``-1``, ``-2`` suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text()):
        if m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            slug = _slug(m.group(1))
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def _links(page: Path) -> list[str]:
    """The relative link targets of ``page`` (not http(s), mailto or absolute paths)."""
    text = "\n".join(_prose(page.read_text()))  # a link's text may wrap onto the next line
    text = re.sub(r"`[^`]*`", "``", text)  # code spans hold no links (``[x](y)`` there is text)
    return [t for t in _LINK.findall(text) if not re.match(r"^([a-z]+:|/)", t)]


def test_parameter_page_is_generated_from_the_parameters() -> None:
    committed = DOC_PATH.read_text() if DOC_PATH.exists() else ""
    assert committed == render(), (
        f"docs/parameters.md differs from what its generator writes from oxygen_ros/runtime/params.py and "
        f"oxygen_ros/policy/options.py; regenerate it with `{REGENERATE}` and commit the result")


def test_executor_parameter_table_is_generated_from_the_parameters() -> None:
    from oxygen_ros.executor import param_docs
    from oxygen_ros.executor.params import EXECUTOR_PARAMS

    committed = param_docs.DOC_PATH.read_text()
    assert committed == param_docs.render(committed), (
        f"docs/executor.md's parameter table differs from what its generator writes from "
        f"oxygen_ros/executor/params.py; regenerate it with `{param_docs.REGENERATE}` and commit the result")
    missing = [p.name for p in EXECUTOR_PARAMS if f"| `{p.name}` |" not in committed]
    assert not missing, f"executor parameters missing from docs/executor.md: {missing}"


def test_the_parameter_page_lists_every_parameter() -> None:
    from oxygen_ros.runtime.params import PARAMS, STREAM_PARAMS

    text = render()
    missing = [p.name for p in (*PARAMS, *STREAM_PARAMS) if f"| `{p.name}` |" not in text]
    assert not missing, f"parameters missing from the generated page: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runs_paths_exist(page: Path) -> None:
    missing = []
    for path in sorted(set(_RUNS.findall(page.read_text()))):
        path = re.sub(r"<\w+>", "*", path.rstrip(".,;:)").rstrip("/"))
        if path in NOT_COMMITTED or path == "runs":
            continue
        if not (list(ROOT.glob(path)) if any(c in path for c in "*?") else (ROOT / path).exists()):
            missing.append(path)
    assert not missing, (f"{page.relative_to(ROOT)} names runs/ paths that do not exist: {missing} (commit the "
                         "results, fix the path, or list a path a command only writes in NOT_COMMITTED)")


def test_the_checks_catch_what_they_should(tmp_path: Path) -> None:
    """The link and anchor checks fail on a broken link, and GitHub's slugs come out as GitHub writes them."""
    page = tmp_path / "a.md"
    page.write_text("# A `code` heading: with ~/ask and (parens)\n\n## Again\n## Again\n\n"
                    "[ok](#a-code-heading-with-ask-and-parens) [bad](missing.md) [x](#again-1) [a\n"
                    "wrapped link](#again)\n"
                    "```\n# not a heading\n[not](a-link.md)\n```\n")
    assert _anchors(page) == {"a-code-heading-with-ask-and-parens", "again", "again-1"}
    assert _links(page) == ["#a-code-heading-with-ask-and-parens", "missing.md", "#again-1", "#again"]
