"""The tenant-wide ledger's write units (issue 49: at most 0.5 more per occurrence).

The scheduler's hot path writes nothing for it. Each reconciler check of an hour of a shard
writes one page per tenant with fires there (``punctual.domain.ledger``) and one mark. A
page is the DAL's own item (``page_to_item``), sized by DynamoDB's rules: a write unit per
KB, rounded up per item. So the units per occurrence are (pages x their units + marks) /
occurrences of the hour, and they depend on how many (tenant, shard) pairs have fires in an
hour and on the share of occurrences listed (every one that did not succeed at its first
attempt)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from punctual.dal.common import to_dynamo
from punctual.dal.ledger import page_to_item
from punctual.domain.findings import Finding
from punctual.domain.ids import occurrence_id
from punctual.domain.ledger import LISTED_PER_PAGE, LedgerBook, LedgerEntry
from punctual.domain.occurrence import OccurrenceState
from scripts.capacity.model import Design, Workload, units
from scripts.capacity.payloads import item_bytes

HOUR = 3600
BUDGET = 0.5  # the bound: write units an occurrence may add
SHARES = (0.0, 0.01, 0.1, 1.0)  # exceptions among a page's occurrences, shown
_AT = 1_796_000_400  # an aligned hour


@dataclass(frozen=True)
class LedgerCost:
    exceptions: float  # the share of occurrences listed
    per_page: int  # occurrences a page counts
    page_units: int
    per_occurrence: float


def page_units(occurrences: int, exceptions: float) -> int:
    """Write units of one tenant's page of ``occurrences`` in an hour of a shard, a share
    ``exceptions`` of them listed (DEAD, three attempts: the longest row)."""
    book = LedgerBook(_AT, shard=127)
    dead = round(occurrences * exceptions)
    for n in range(occurrences):
        sid = f"sch_acme-platform.k3xq7fz2m9a4tw8bn6c5p{n:05d}"
        failed = n < dead
        book.add(
            "acme-platform",
            LedgerEntry(
                occurrence_id=occurrence_id(sid, 12, _AT + n % HOUR),
                schedule_id=sid,
                scheduled_for=_AT + n % HOUR,
                finding=Finding.DEAD if failed else Finding.SUCCEEDED,
                state=OccurrenceState.DEAD if failed else OccurrenceState.SUCCEEDED,
                attempts=3 if failed else 1,
                target="billing-exports",
            ),
        )
    [page] = book.pages(checked_at=_AT + 2 * HOUR + 300)
    return units(item_bytes(to_dynamo(page_to_item(page, purge_at=_AT + 30 * 86400))))


def costs(workload: Workload, design: Design) -> list[LedgerCost]:
    """With every tenant's fires spread over every shard (the model's assumption): a page
    per (tenant, shard) each hour, plus a mark per shard."""
    per_hour = workload.per_day / 24
    pages = workload.tenants * design.shards
    per_page = max(1, round(per_hour / pages))
    found = []
    for share in SHARES:
        each = page_units(min(per_page, LISTED_PER_PAGE * 4), share)
        found.append(LedgerCost(share, per_page, each, (pages * each + design.shards) / per_hour))
    return found


def print_ledger(workload: Workload, design: Design, found: Sequence[LedgerCost] = ()) -> None:
    found = found or costs(workload, design)
    per_hour = workload.per_day / 24
    print(
        f"== Ledger (GET /v1/occurrences): written by the reconciler, none on the hot path; "
        f"{workload.tenants:,} tenants x {design.shards} shards = "
        f"{workload.tenants * design.shards:,} pages an hour of {per_hour:,.0f} occurrences "
        f"(about {found[0].per_page:,} a page)"
    )
    for cost in found:
        print(
            f"  {cost.exceptions:6.0%} listed: {cost.page_units:3d} WCU a page, "
            f"+{cost.per_occurrence:.3f} WCU an occurrence (budget +{BUDGET})"
        )
    # The bound: a page per (tenant, shard) with fires in the hour, a unit at least each.
    tenants_at_budget = BUDGET * per_hour / design.shards
    print(
        f"  bound: pages <= (tenant, shard) pairs with fires in the hour; within the budget "
        f"while at most {tenants_at_budget:,.0f} tenants have fires on every shard each hour "
        "(a tenant with fewer schedules than shards writes a page per schedule firing, at most "
        "1 WCU per hourly fire)"
    )
