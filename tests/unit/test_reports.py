"""The reconciler's reports as stored (punctual.dal.reports): keys a later run finds them by,
and the TTL that purges them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from punctual.dal.common import from_dynamo
from punctual.dal.reports import ReportStore, report_key, report_to_item
from punctual.dal.tables import LEASES
from punctual.domain.findings import ReconcileReport
from tests.instants import epoch

WINDOW = (epoch("2026-11-18T10:00:00Z"), epoch("2026-11-18T11:00:00Z"))


@pytest.fixture
def new_york(host_zone: Callable[[str], None]) -> None:
    """The process in another local zone than UTC (a developer's machine)."""
    host_zone("America/New_York")


def report() -> ReconcileReport:
    return ReconcileReport(
        shard=3,
        window_start=WINDOW[0],
        window_end=WINDOW[1],
        run_at=WINDOW[1] + 1200,
        complete=True,
        repair=True,
        schedules=7,
        counts={},
        examples={},
        repaired_fired=0,
        repaired_missed=0,
        deferred=0,
        repair_conflicts=0,
    )


def test_a_reports_key_names_its_window_in_utc_whatever_the_local_zone(new_york: None) -> None:
    # Stored keys: a run reads the earlier runs' reports by them (a settled window is not
    # read again), so their text is fixed, in UTC on any host
    assert report_key(*WINDOW, 3) == "RECONCILE#20261118T100000Z/20261118T110000Z#0003"


class Recorded:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def put_item(self, **request: Any) -> dict[str, Any]:
        self.items.append(request["Item"])
        return {}


def test_a_report_is_stored_with_the_leases_tables_ttl_at_its_purge_instant() -> None:
    # GIVEN a report stored to be purged at an instant
    client = Recorded()
    assert ReportStore(client, "leases").put(report(), purge_at=WINDOW[1] + 86400) is True
    # THEN its item carries the TTL attribute the leases table purges by, at that instant,
    # under its key
    (item,) = [from_dynamo(i) for i in client.items]
    assert LEASES.ttl_attribute == "purge_at"
    assert item["purge_at"] == WINDOW[1] + 86400
    assert item["pk"] == report_key(*WINDOW, 3)
    assert item == report_to_item(report(), WINDOW[1] + 86400)
