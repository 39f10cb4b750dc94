"""The tenant-wide occurrence ledger: what the reconciler found in one hour of one shard, one
page per tenant (docs/data-model.md, *ledger*).

The scheduler's hot path writes nothing for it. The reconciler reads every occurrence of an
hour anyway (to find what is missing); once its check of the hour is complete it writes,
per tenant with fires in the shard, a page holding the counts by finding and, listed one by
one, the exceptions: every occurrence that did not succeed at its first attempt (DEAD,
MISSED, SKIPPED_OVERLAP, CANCELED, still in flight, retried), every one made after its time
(a repair, a misfire's catch-up, a backfill: ``late``) and every fire found missing. A
success at the first attempt, made in time, is counted, not listed.

What a tenant's worker can write into its own occurrence items does not widen a page: the
instant comes from the occurrence id (checked against the item's key), a target that is no
target name is left out, and a page lists at most LISTED_PER_PAGE entries.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_name
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.domain.schedule import TARGET_NAME_PATTERN

HOUR = 3600
_TARGET = re.compile(TARGET_NAME_PATTERN)
# Entries listed per page at most (about 130 bytes each: a page stays far below DynamoDB's
# 400 KB item limit, and a re-check rewrites it whole). What a page cannot list is counted
# in ``unlisted``: its occurrences are in the counts and read by schedule.
LISTED_PER_PAGE = 1000


class LedgerEntry(BaseModel):
    """One listed occurrence (or fire with no occurrence: MISSING, MISSED by a policy)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    occurrence_id: str
    schedule_id: str
    scheduled_for: int
    finding: Finding
    # The occurrence's state when the hour was checked (after the check's repair: a MISSING
    # fire the reconciler made is SCHEDULED, one it recorded as missed is MISSED); None for a
    # fire with no item (MISSED by the misfire policy's summary, or a repair that lost).
    state: OccurrenceState | None = None
    attempts: int = Field(default=0, ge=0)
    target: str | None = None
    late: bool = False  # made after its time (the catch-up lane): a repair, a catch-up, a backfill
    # An occurrence read live (an hour not checked yet), not from a page: what the console's
    # lag figures need. (A page does not keep them.)
    available_at: int | None = None
    enqueued_at: int | None = None
    claimed_at: int | None = None
    reason: str | None = None

    @classmethod
    def of(
        cls,
        occurrence: Occurrence,
        finding: Finding,
        *,
        claimed_at: int | None = None,
        detail: bool = False,
    ) -> LedgerEntry:
        """The entry of a stored occurrence; with ``detail``, its times and reason too."""
        times = (
            {
                "available_at": occurrence.available_at,
                "enqueued_at": occurrence.enqueued_at,
                "claimed_at": claimed_at,
                "reason": occurrence.reason,
            }
            if detail
            else {}
        )
        schedule_id, _, instant, _ = occurrence_name(occurrence.occurrence_id)
        return cls(
            occurrence_id=occurrence.occurrence_id,
            schedule_id=schedule_id,
            scheduled_for=instant,
            finding=finding,
            state=occurrence.state,
            attempts=occurrence.attempt_count,
            target=occurrence.target,
            late=occurrence.lane is Lane.CATCHUP,
            **times,
        )

    @field_validator("target", mode="before")
    @classmethod
    def _a_target_name(cls, value: object) -> object:
        """A target as the API names one, else none (what a tenant's worker wrote there)."""
        return value if isinstance(value, str) and _TARGET.match(value) else None

    @property
    def order(self) -> tuple[int, str]:
        """Where it sorts in the ledger: by instant, then id (a stable total order)."""
        return self.scheduled_for, self.occurrence_id


class LedgerPage(BaseModel):
    """One tenant's share of one reconciler check of one hour of one shard."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tenant_id: str
    hour: int  # the hour's first second (epoch seconds, a multiple of 3600)
    shard: int
    checked_at: int
    counts: dict[Finding, int]
    retried: int = 0  # occurrences with more than one attempt (listed, whatever their end)
    late: int = 0  # occurrences made after their time (listed, whatever their end)
    unreadable: int = 0  # items at the tenant's keys that are not Punctual's (not judged)
    unlisted: int = 0  # exceptions past LISTED_PER_PAGE: counted, not listed
    entries: list[LedgerEntry] = Field(default_factory=list)  # sorted by ``order``


def listed(finding: Finding, attempts: int, late: bool = False) -> bool:
    """An exception: anything but a success at the first attempt, made in time."""
    return finding is not Finding.SUCCEEDED or attempts > 1 or late


@dataclass
class _Share:
    counts: Counter[Finding] = field(default_factory=Counter)
    entries: list[LedgerEntry] = field(default_factory=list)
    unreadable: int = 0


class LedgerBook:
    """Collects one check's findings of one hour and shard, per tenant, into pages."""

    def __init__(self, hour: int, shard: int) -> None:
        if hour % HOUR:
            raise ValueError(f"a ledger page covers an aligned hour, not one from {hour}")
        self.hour = hour
        self.shard = shard
        self._shares: defaultdict[str, _Share] = defaultdict(_Share)

    def covers(self, instant: int) -> bool:
        return self.hour <= instant < self.hour + HOUR

    def add(self, tenant_id: str, entry: LedgerEntry) -> None:
        """Count a finding of the tenant's (one outside the hour is not this page's)."""
        if not self.covers(entry.scheduled_for):
            return
        share = self._shares[tenant_id]
        share.counts[entry.finding] += 1
        if listed(entry.finding, entry.attempts, entry.late):
            share.entries.append(entry)

    def unreadable(self, tenant_id: str, count: int) -> None:
        if count:
            self._shares[tenant_id].unreadable += count

    def pages(self, checked_at: int) -> list[LedgerPage]:
        pages = []
        for tenant_id, share in sorted(self._shares.items()):
            entries = sorted(share.entries, key=lambda e: e.order)
            pages.append(
                LedgerPage(
                    tenant_id=tenant_id,
                    hour=self.hour,
                    shard=self.shard,
                    checked_at=checked_at,
                    counts=dict(share.counts),
                    retried=sum(1 for e in entries if e.attempts > 1),
                    late=sum(1 for e in entries if e.late),
                    unreadable=share.unreadable,
                    unlisted=max(0, len(entries) - LISTED_PER_PAGE),
                    entries=entries[:LISTED_PER_PAGE],
                )
            )
        return pages
