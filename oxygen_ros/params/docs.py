"""Generated sections of hand-written pages: the text between ``<!-- <marker> -->`` and ``<!-- /<marker> -->``
is written by a generator (a parameter table, say) and checked by test/test_docs.py."""

from __future__ import annotations

__all__ = ["replace_section"]


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
