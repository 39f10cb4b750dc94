"""docs/decisions.md opens with an index of its entries, kept current."""

from __future__ import annotations

from collections import Counter

from scripts.decisions_index import DECISIONS, anchor, index, with_index


def test_decisions_index_committed_lists_every_entry():
    # GIVEN the decisions as committed; WHEN the index is made anew
    text = DECISIONS.read_text(encoding="utf-8")
    # THEN the committed file is unchanged (run `python -m scripts.decisions_index` after
    # adding an entry)
    assert with_index(text) == text


def test_decisions_index_links_each_heading_and_marks_a_superseded_one():
    # GIVEN two entries with the same title, the second partly superseded
    text = (
        "# Decisions\n\n## 2026-01-01: a, b\n\nfirst\n\n## 2026-01-01: a, b\n\n"
        "- old (Superseded 2026-02-01, *c*: replaced)\n"
    )
    # WHEN its index is made
    made = with_index(text)
    # THEN it comes before the first entry, links each by GitHub's anchor (a repeat gets
    # -1) and marks the superseded one
    assert made.index("2 entries") < made.index("## 2026-01-01")
    assert "- [2026-01-01: a, b](#2026-01-01-a-b)\n" in made
    superseded = "(superseded in part by 2026-02-01, *c*)"
    assert f"- [2026-01-01: a, b](#2026-01-01-a-b-1) {superseded}" in made
    # AND making it again changes nothing
    assert with_index(made) == made
    assert index(made) in made


def test_decisions_index_anchor_drops_punctuation_as_github_does():
    assert anchor("2026-12-07: a rename cancels nothing (issue 46, item 6)", Counter()) == (
        "2026-12-07-a-rename-cancels-nothing-issue-46-item-6"
    )
