"""Instants as the tests write them: ISO text <-> epoch seconds (UTC)."""

from __future__ import annotations

from datetime import datetime

from punctual.timing import utc_text


def epoch(text: str) -> int:
    """'2026-11-18T11:10:00Z' (or with an offset) -> epoch seconds."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def iso(instant: float) -> str:
    """An epoch instant as the API writes it: '2026-11-18T11:10:00Z'."""
    return utc_text(int(instant))
