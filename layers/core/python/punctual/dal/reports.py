"""The reconciler's reports: one item per (window, shard) in the leases table, kept for the
occurrence retention (TTL ``purge_at``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from punctual.dal.common import ConditionFailed, Item, batch_get, dynamo, to_dynamo, values
from punctual.domain.findings import ReconcileReport

REPORT_PREFIX = "RECONCILE#"


def report_key(window_start: int, window_end: int, shard: int) -> str:
    """'RECONCILE#20261118T100000Z/20261118T110000Z#0003'."""
    window = "/".join(
        datetime.fromtimestamp(i, UTC).strftime("%Y%m%dT%H%M%SZ")
        for i in (window_start, window_end)
    )
    return f"{REPORT_PREFIX}{window}#{shard:04d}"


def report_to_item(report: ReconcileReport, purge_at: int) -> Item:
    return {
        "pk": report_key(report.window_start, report.window_end, report.shard),
        **report.model_dump(mode="json"),
        "purge_at": purge_at,
    }


class ReportStore:
    def __init__(self, client: Any, table: str) -> None:
        self._client = dynamo(client)
        self.table = table

    def put(self, report: ReconcileReport, *, purge_at: int) -> bool:
        """False when a newer run of the same shard and window is already stored."""
        try:
            self._client.put_item(
                TableName=self.table,
                Item=to_dynamo(report_to_item(report, purge_at)),
                # Race: a slow or retried run of the same shard and window finishing after
                # a newer one must not replace the newer findings.
                ConditionExpression="attribute_not_exists(pk) OR run_at <= :run_at",
                ExpressionAttributeValues=values(run_at=report.run_at),
            )
        except ConditionFailed:
            return False
        return True

    def settled_windows(
        self, shard: int, windows: Sequence[tuple[int, int]]
    ) -> set[tuple[int, int]]:
        """Which of the shard's ``windows`` have a settled report."""
        found = self.in_windows(shard, windows)
        return {window for window, report in found.items() if report.settled}

    def in_windows(
        self, shard: int, windows: Sequence[tuple[int, int]]
    ) -> dict[tuple[int, int], ReconcileReport]:
        """The shard's reports of those ``windows`` that have one."""
        found = self._get([report_key(start, end, shard) for start, end in windows])
        return {(r.window_start, r.window_end): r for r in found}

    def get_many(
        self, window_start: int, window_end: int, shards: Iterable[int]
    ) -> list[ReconcileReport]:
        found = self._get([report_key(window_start, window_end, s) for s in shards])
        return sorted(found, key=lambda r: r.shard)

    def _get(self, keys: list[str]) -> list[ReconcileReport]:
        # Consistent: a run that just finished must not be repeated, and an operator reading
        # the reports after a run must see it.
        items = batch_get(self._client, self.table, [{"pk": key} for key in keys])
        return [ReconcileReport.model_validate(item) for item in items]
