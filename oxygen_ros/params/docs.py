"""Generated sections of hand-written pages: the text between ``<!-- <marker> -->`` and ``<!-- /<marker> -->``
is written by a generator (a parameter table, say) and checked by test/test_docs.py."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["emit_page", "replace_section"]


def replace_section(page: str, marker: str, body: str) -> str:
    """``page`` with the section ``marker`` replaced by ``body``.

    Raises:
        ValueError: the page lacks the section's start or end comment.
    """
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    i, j = page.find(start), page.find(end)
    if i < 0 or j < i:
        raise ValueError(f"the page has no section {start} ... {end}")
    return page[:i + len(start)] + "\n" + body.rstrip("\n") + "\n" + page[j:]


def emit_page(path: Path, text: str, write: bool, check: bool, regenerate: str) -> int:
    """A generator's ending: write ``text`` to ``path`` (``write``), compare it with the committed page (``check``:
    1 and a message naming ``regenerate`` when stale), or print it. Returns the exit status."""
    if write:
        path.write_text(text)
        print(f"wrote {path}")
    elif check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is stale: regenerate it with `{regenerate}`", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
