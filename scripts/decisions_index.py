"""The index at the top of docs/decisions.md: one line per entry (its date and title, a link
to it), marked where a later entry superseded part of it. Rewritten by
``python -m scripts.decisions_index``; tests/unit/test_decisions_index.py fails when it is
stale, as the OpenAPI document's test does."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

DECISIONS = Path(__file__).resolve().parent.parent / "docs" / "decisions.md"
START, END = "<!-- index: python -m scripts.decisions_index -->", "<!-- /index -->"
_HEADING = re.compile(r"^## (.+)$", re.M)
# How an entry marks what a later one replaced: "(Superseded 2026-12-06, *title*...".
# (Capitalized: SUPERSEDED is also one of the reconciler's findings.)
_SUPERSEDED = re.compile(r"\(Superseded[^)]*")


def anchor(title: str, seen: Counter[str]) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces
    as -, a -N suffix for the Nth repeat."""
    slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    seen[slug] += 1
    return slug if seen[slug] == 1 else f"{slug}-{seen[slug] - 1}"


def _superseded(part: str) -> str:
    """ " (superseded in part by DATE, *its title*)" for each mark in an entry's text."""
    marks = []
    for found in _SUPERSEDED.finditer(part):
        date = re.search(r"\d{4}-\d{2}-\d{2}", found.group())
        title = re.search(r"\*([^*]+)\*", found.group())
        by = ", ".join(" ".join(m.group().split()) for m in (date, title) if m)
        by = by or "a later entry"
        marks.append(f" (superseded in part by {by})")
    return "".join(marks)


def index(text: str) -> str:
    """The index block for the entries in ``text``."""
    body = text.split(END, 1)[-1]
    titles = _HEADING.findall(body)
    parts = _HEADING.split(body)[2::2]  # each entry's text, after its heading
    seen: Counter[str] = Counter()
    lines = [START, "", f"{len(titles)} entries, oldest first:", ""]
    for title, part in zip(titles, parts, strict=True):
        lines.append(f"- [{title}](#{anchor(title, seen)}){_superseded(part)}")
    return "\n".join([*lines, "", END])


def with_index(text: str) -> str:
    """``text`` with its index block made anew, placed before the first entry."""
    if START in text:
        before, rest = text.split(START, 1)
        after = rest.split(END, 1)[1]
        return before + index(text) + after
    first = _HEADING.search(text)
    cut = first.start() if first else len(text)
    return text[:cut] + index(text) + "\n\n" + text[cut:]


if __name__ == "__main__":
    DECISIONS.write_text(with_index(DECISIONS.read_text(encoding="utf-8")), encoding="utf-8")
    sys.stdout.write(f"wrote the index of {DECISIONS}\n")
