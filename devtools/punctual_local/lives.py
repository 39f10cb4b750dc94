"""An occurrence's life as the console's pages read it (its instants parsed once: the last
hour's pages ask them of 10,000 occurrences several times), and the small text helpers
the pages and the charts share."""

from __future__ import annotations

import html
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def epoch(text: str | None) -> int | None:
    return None if text is None else int(datetime.fromisoformat(text).timestamp())


def utc_offset(local: str) -> str:
    """The UTC offset an ISO local time carries (``+05:30``)."""
    return datetime.fromisoformat(local).strftime("%z")


@dataclass
class Life:
    """One occurrence as the timeline and the lag figures see it (its instants parsed once:
    the last hour's pages ask them of 10,000 occurrences several times)."""

    occurrence: dict[str, Any]
    schedule_name: str
    claimed_at: int | None = None
    flexible: bool = False  # its schedule has a flexible window (> 0 s)

    @cached_property
    def scheduled(self) -> int:
        return epoch(self.occurrence["scheduled_for"]) or 0

    @cached_property
    def due(self) -> int:
        return epoch(self.occurrence["available_at"]) or 0

    @cached_property
    def receivable(self) -> int | None:
        """When its message could first be received: sent ahead with a delay, at its due
        time; sent late, when sent (SQS's SentTimestamp, recorded by the worker's claim)."""
        sent = epoch(self.occurrence.get("enqueued_at"))
        return None if sent is None else max(sent, self.due)

    @cached_property
    def lag(self) -> int | None:
        """How late its message became receivable (the relay's lateness)."""
        return None if self.receivable is None else self.receivable - self.due

    @cached_property
    def waited(self) -> int | None:
        """How long it waited for a worker once due (claimed - due: schedule-to-start)."""
        return None if self.claimed_at is None else max(0, self.claimed_at - self.due)

    @property
    def kind(self) -> str:
        """Which of the lag page's groups it is in (see KINDS)."""
        if self.occurrence.get("manual"):
            return "manual"
        return "flexible" if self.flexible else "strict"


# The lag page's groups: (kind, how it is labelled).
KINDS = (
    ("strict", "strict (flexible window 0 s)"),
    ("flexible", "flexible (a window > 0 s)"),
    ("manual", "manual (run now, backfill)"),
)


# A wait for a worker past this stands out in a table (a backlog, or workers too few).
LATE_SECONDS = 60


def waited_too_long(life: Life, now: float) -> bool:
    """Waited for a worker longer than LATE_SECONDS, or due that long ago and not taken."""
    if life.waited is not None:
        return life.waited > LATE_SECONDS
    open_ = life.occurrence["state"] in ("SCHEDULED", "RETRY_WAIT")
    return open_ and now - life.due > LATE_SECONDS
