"""The Lambda handlers driven as their triggers call them, where the other tests drive the
logic below them: the call inventory and the alarms' metrics are taken from these runs
(tests/aws_calls.py), so each function's real entry point must run at least once."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from materializer import handler as materializer_handler
from relay import catchup as catchup_handler
from relay import handler as relay_handler

from infra import start_handler
from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import occurrence_to_item
from punctual.domain.ids import minute_of, new_schedule_id, occurrence_id
from punctual.domain.occurrence import Occurrence
from punctual.integrations.streams import wanted
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from tests.instants import iso
from tests.integration.conftest import OPERATOR, Api, Clock, LambdaContextStub
from tests.integration.helpers import (
    create,
    cron_spec,
    make,
    occurrence_items,
    rate,
    table_items,
    wire,
)
from tests.integration.test_relay import messages


def emitted(out: str) -> dict[str, float]:
    """Total of each EMF metric the handlers printed."""
    totals: dict[str, float] = {}
    for line in out.splitlines():
        if not line.startswith("{"):
            continue
        blob = json.loads(line)
        for directive in blob.get("_aws", {}).get("CloudWatchMetrics", []):
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                totals[metric["Name"]] = totals.get(metric["Name"], 0) + (
                    sum(value) if isinstance(value, list) else value
                )
    return totals


def test_api_handler_serves_the_reconcile_reports_to_operators_only(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the last closed hour reconciled on every shard but the last, and the hour
    # before on none
    start = int(clock.now) - int(clock.now) % 3600 - 3600
    shards = list(range(aws.settings.shard_count))
    Reconciler(aws).run(shards[:-1], start, start + 3600)
    operator = Api(OPERATOR)

    def asked(begin: int) -> dict[str, Any]:
        answer = operator.call(
            "GET", "/v1/admin/reconcile", query={"from": iso(begin), "to": iso(begin + 3600)}
        )
        assert answer.status == 200, answer.body
        return dict(answer.body)

    # WHEN the operator asks the API for the hour before: THEN it says that no shard was
    # reconciled, not "0 missing"
    before = asked(start - 3600)
    assert (before["reconciled"], before["unreported_shards"], before["reports"]) == (
        False,
        shards,
        [],
    )
    # AND for the last hour: the shards reported, the one not yet
    partly = asked(start)
    assert [r["shard"] for r in partly["reports"]] == shards[:-1]
    assert (partly["reconciled"], partly["unreported_shards"]) == (False, shards[-1:])
    # WHEN the last shard is reconciled too
    Reconciler(aws).run(shards[-1:], start, start + 3600)
    # THEN every shard's report comes back (read from the leases table), reconciled
    body = asked(start)
    assert [r["shard"] for r in body["reports"]] == shards
    assert (body["missing"], body["unexpected"]) == (0, 0)
    assert (body["reconciled"], body["unreported_shards"]) == (True, [])
    # AND a tenant may not read them
    denied = alice.call("GET", "/v1/admin/reconcile", query={"from": iso(start)})
    assert denied.status == 403


def test_materializer_and_relay_handlers_carry_a_flexible_schedule_to_its_queue(
    alice: Api,
    aws: Services,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    # GIVEN a flexible schedule of alice's, beyond what the API plans itself, and both
    # handlers wired to this test's tables and clock (Lambda builds them from the environment)
    schedule_id = create(alice, rate("rate(5 minutes)", flexible_window_seconds=120))["schedule"][
        "schedule_id"
    ]
    wire(materializer_handler, aws, monkeypatch)
    wire(relay_handler, aws, monkeypatch)
    shards = list(range(aws.settings.shard_count))
    planned_by_api = len(occurrence_items(aws, schedule_id))
    # (the API measured its clock against DynamoDB's answers, and published how far off it
    # is: this test's clock is far from the Dates moto sends)
    assert emitted(capsys.readouterr().out)["ClockSkew"] > 3600
    # WHEN the ticker invokes the materializer each minute for fifteen minutes. The API
    # planned the fires due within its horizon (300 s: the 180 s lookahead, a tick, the
    # index margin); a tick walks to the end of the minute holding tick + lookahead, and a
    # flexible fire is due up to 120 s after its instant (its jitter, from the random
    # schedule id). The last walk (to 1,080 s) so holds every fire of (300 s, 960 s]: two
    # at least, whatever the jitter (twelve ticks held one, 1 run in about 40)
    materialized = 0
    for _ in range(15):
        clock.advance(60)
        answer = materializer_handler.lambda_handler(
            {"tick": iso(clock.now), "shards": shards}, LambdaContextStub()
        )
        materialized += sum(report["occurrences"] for report in answer["shards"])
    # THEN it planned the schedule's fires and reported them as metrics
    metrics = emitted(capsys.readouterr().out)
    items = occurrence_items(aws, schedule_id)
    assert materialized >= 2
    assert materialized == len(items) - planned_by_api
    assert metrics["Occurrences"] == materialized
    assert "DueBacklog" in metrics
    assert metrics["ClockSkew"] > 3600
    # WHEN the stream delivers their inserts to the relay once they are due
    clock.now = max(int(item["available_at"]["N"]) for item in items)
    records: list[dict[str, Any]] = [
        {
            "eventID": str(n),
            "eventName": "INSERT",
            "eventSource": "aws:dynamodb",
            "dynamodb": {"NewImage": item, "SequenceNumber": str(n), "Keys": {}},
        }
        for n, item in enumerate(items, start=1)
    ]
    answer = relay_handler.lambda_handler({"Records": records}, LambdaContextStub())
    # THEN every one is sent, and the flexible lag is measured
    assert answer == {"batchItemFailures": []}
    metrics = emitted(capsys.readouterr().out)
    assert metrics["Relayed"] == len(items)
    assert "EnqueueLagFlexible" in metrics
    assert metrics["ClockSkew"] > 3600


class Dwindling(LambdaContextStub):
    """A Lambda context whose time runs out after ``calls`` looks at the clock."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def get_remaining_time_in_millis(self) -> int:  # type: ignore[override]
        self.calls -= 1
        return 60_000 if self.calls >= 0 else 1_000


def test_materializer_handler_reports_the_oldest_unplanned_bucket_and_its_drain_time(
    aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    # GIVEN one shard walked up to date, then a 30-minute outage
    wire(materializer_handler, aws, monkeypatch)
    materializer_handler.lambda_handler(
        {"tick": iso(clock.now), "shards": [0]}, LambdaContextStub()
    )
    clock.advance(30 * 60)
    capsys.readouterr()
    # WHEN the next tick runs out of time after a few buckets
    tick = int(clock.now)
    answer = materializer_handler.lambda_handler({"tick": iso(tick), "shards": [0]}, Dwindling(6))
    [shard] = answer["shards"]
    metrics = emitted(capsys.readouterr().out)
    # THEN the oldest bucket it did not walk is reported by age, and the drain time is what
    # is left at the pace of this tick (its buckets, less the one a minute adds)
    last = minute_of(tick + aws.settings.lookahead_seconds)
    left = (last - shard["watermark"]) // 60 + 1
    assert shard["buckets"] >= 2
    assert metrics["DueBacklog"] == left
    assert metrics["PlanningOldestAge"] == tick - shard["watermark"] > 0
    assert metrics["PlanningDrainSeconds"] == -(-left * 60 // (shard["buckets"] - 1))
    # AND a tick with time enough catches up: nothing left, nothing old
    answer = materializer_handler.lambda_handler(
        {"tick": iso(tick), "shards": [0]}, LambdaContextStub()
    )
    metrics = emitted(capsys.readouterr().out)
    assert (metrics["DueBacklog"], metrics["PlanningOldestAge"]) == (0, 0)
    assert metrics["PlanningDrainSeconds"] == 0


def test_relay_lanes_send_a_catchup_apart_and_measure_it_behind_its_pace(
    alice: Api,
    aws: Services,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    # GIVEN a minutely CATCHUP schedule of alice's (3 fires at most) planned, then a
    # ten-minute outage after which the materializer catches up
    sid = make(
        aws,
        spec=cron_spec("* * * * *"),
        misfire={"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 3},
    )
    wire(materializer_handler, aws, monkeypatch)
    wire(relay_handler, aws, monkeypatch)
    before = {i["sk"]["S"] for i in table_items(aws, aws.settings.occurrences_table)}
    clock.advance(600)
    materializer_handler.lambda_handler(
        {"tick": iso(clock.now), "shards": list(range(aws.settings.shard_count))},
        LambdaContextStub(),
    )
    made = [
        item
        for item in table_items(aws, aws.settings.occurrences_table)
        if item["schedule_id"]["S"] == sid and item["sk"]["S"] not in before
        if item["sk"]["S"].startswith("OCC#") and item["state"]["S"] == "SCHEDULED"
    ]
    records = [
        {
            "eventID": str(n),
            "eventName": "INSERT",
            "eventSource": "aws:dynamodb",
            "dynamodb": {"NewImage": item, "SequenceNumber": str(n), "Keys": {}},
        }
        for n, item in enumerate(made, start=1)
    ]
    # WHEN each lane's function gets its lane's records, as its mapping's filter hands them
    lanes = {lane: [r for r in records if wanted(r, lane)] for lane in (None, "CATCHUP")}
    assert len(lanes["CATCHUP"]) == 3
    assert len(lanes[None]) == len(records) - 3 >= 1
    capsys.readouterr()
    clock.advance(2)  # the first catch-up was receivable 2 s ago
    answer = catchup_handler.lambda_handler({"Records": lanes["CATCHUP"]}, LambdaContextStub())
    # THEN the catch-up lane sends its three and measures them behind their paced time only
    # (they are minutes past their fires by design), not as strict or flexible lag
    assert answer == {"batchItemFailures": []}
    metrics = emitted(capsys.readouterr().out)
    assert metrics["Relayed"] == 3
    # paced 1 s apart from the catch-up's start: 2 s, 1 s and 0 s behind their times
    assert metrics["EnqueueLagCatchup"] == 2 + 1 + 0
    assert "EnqueueLagStrict" not in metrics
    assert "EnqueueLagFlexible" not in metrics
    # AND the on-time lane's function sends the fires due now as strict
    answer = relay_handler.lambda_handler({"Records": lanes[None]}, LambdaContextStub())
    metrics = emitted(capsys.readouterr().out)
    assert answer == {"batchItemFailures": []}
    assert metrics["Relayed"] == len(lanes[None])
    assert "EnqueueLagStrict" in metrics
    assert "EnqueueLagCatchup" not in metrics


def test_relay_handler_of_a_new_mapping_does_not_send_the_streams_past_again(
    alice: Api,
    aws: Services,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    # GIVEN relay mappings made anew at `start` (the stack re-created after a destroy, or a
    # mapping replaced): the new mapping reads the stream from its oldest record, a day back
    start = int(clock.now)
    settings = aws.settings.model_copy(update={"relay_started_at": start})
    wire(relay_handler, dataclasses.replace(aws, settings=settings), monkeypatch)

    def inserted(created: int | None, due: int) -> tuple[str, dict[str, Any]]:
        schedule_id = new_schedule_id("alice")
        occurrence = Occurrence(
            occurrence_id=occurrence_id(schedule_id, 1, due),
            tenant_id="alice",
            schedule_id=schedule_id,
            schedule_version=1,
            scheduled_for=due,
            available_at=due,
            target="default",
        )
        image = to_dynamo(occurrence_to_item(occurrence, {"n": due}))
        dynamodb: dict[str, Any] = {"NewImage": image, "Keys": {}}
        if created is not None:
            dynamodb["ApproximateCreationDateTime"] = created
        return occurrence.occurrence_id, {"eventName": "INSERT", "dynamodb": dynamodb}

    # ... whose records hold: fires inserted and due before the start (the mappings before
    # sent them, or the reconciler re-sends them), fires inserted before the start but due
    # at it or after it, a late fire inserted after the start for an instant before it (a
    # materializer catching up), and a record without its creation time
    replayed = [inserted(start - 86_000, start - 85_000), inserted(start - 200, start - 1)]
    sent = [
        inserted(start - 100, start + 300),
        inserted(start - 100, start),
        inserted(start, start - 3600),
        inserted(None, start - 60),
    ]
    records = [record for _, record in replayed + sent]
    for n, record in enumerate(records, start=1):
        record["dynamodb"] |= {"SequenceNumber": str(n)}
        record["eventID"] = str(n)
    # WHEN the new mapping hands them to the relay (by then the one due after the start is
    # due too, so that every message sent is receivable now)
    clock.now = start + 300
    capsys.readouterr()
    answer = relay_handler.lambda_handler({"Records": records}, LambdaContextStub())
    # THEN only those inserted and due before the start are not sent again, and counted
    assert answer == {"batchItemFailures": []}
    assert sorted(m["occurrence_id"] for m in messages(aws, "alice")) == sorted(o for o, _ in sent)
    metrics = emitted(capsys.readouterr().out)
    assert (metrics["RelayReplaySkipped"], metrics["Relayed"]) == (2, 4)


def test_relay_start_answers_a_new_instant_when_the_mappings_are_made(
    monkeypatch: pytest.MonkeyPatch,
):
    # GIVEN CloudFormation's events for the relay's start resource
    def event(kind: str) -> dict[str, Any]:
        return {
            "RequestType": kind,
            "StackId": "stack",
            "RequestId": "request",
            "LogicalResourceId": "RelayStart",
            "ResponseURL": "https://example.invalid/answer",
        }

    # THEN a Create or an Update (the mappings made anew) answers the instant as StartedAt
    for kind in ("Create", "Update"):
        body = start_handler.answer(event(kind), 1_790_000_000.7)
        assert body["Status"] == "SUCCESS"
        assert body["Data"] == {"StartedAt": "1790000000"}
        assert body["PhysicalResourceId"] == "punctual-relay-start"
    # ... and a Delete needs none
    assert "Data" not in start_handler.answer(event("Delete"), 1_790_000_000)
    # AND the answer is PUT to CloudFormation's URL
    put: list[Any] = []

    class Answered:
        def __enter__(self) -> None:
            return None

        def __exit__(self, *args: Any) -> None:
            return None

    def urlopen(request: Any, timeout: float) -> Answered:
        put.append(request)
        return Answered()

    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    start_handler.on_event(event("Create"), None)
    [request] = put
    assert (request.method, request.full_url) == ("PUT", "https://example.invalid/answer")
    assert json.loads(request.data)["Data"]["StartedAt"].isdigit()
