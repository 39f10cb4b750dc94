"""The reconciler's reports, its checks of a request and its Lambda handler, on moto with the
injected clock. It stores one report per shard and window, refuses a request naming each
field and reason, and accepts a closed window of at most a day over known shards. The handler
validates its event, emits its metrics and saves incomplete reports when it runs out of time.
The reconciler reads every missed episode of its hour, tells a policy's late fire from a
jittered one, catches up the hours an outage left unchecked, and reports an hour that leaves
its horizon still open."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from reconciler import handler

from punctual.dal.reports import ReportStore, report_key
from punctual.domain.errors import InvalidInput
from punctual.domain.findings import Finding, ReconcileReport
from punctual.domain.ids import available_at, occurrence_id, shard_of
from punctual.domain.occurrence import Occurrence, OccurrenceState
from punctual.pipeline.ownership import fired_late
from punctual.pipeline.reconciler import (
    CATCHUP_WINDOWS,
    Reconciler,
    metric_values,
    read_reports,
)
from punctual.services import Services
from tests.integration.conftest import Api, Clock, LambdaContextStub
from tests.integration.helpers import cron_spec, current_item, make
from tests.integration.reconciler.helpers import (
    DAY,
    _emitted_metrics,
    at,
    ids,
    materialize_until,
    reconcile,
    shards_of,
    total,
)

# --- reports, checks and the Lambda ------------------------------------------------------


HOUR = 3600


def test_reconciler_stores_one_report_per_shard_and_window(alice: Api, aws: Services, clock: Clock):
    # GIVEN a */5 schedule with two instants of [10:00, 11:00) lost
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    lost = {at("10:05"), at("10:35")}
    materialize_until(aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t in lost)
    # WHEN the reconciler runs for every shard, with repair off
    clock.now = at("12:05")
    reconcile(aws, at("10:00"), at("11:00"), repair=False)
    # THEN every shard has one report for the window; the schedule's shard names the gaps
    reports = read_reports(aws, at("10:00"))
    assert [r.shard for r in reports] == list(range(aws.settings.shard_count))
    mine = reports[shard_of(sid, aws.settings.shard_count)]
    assert mine.counts[Finding.MISSING] == 2
    assert set(mine.examples[Finding.MISSING]) == {occurrence_id(sid, 1, t) for t in lost}
    assert mine.counts[Finding.IN_FLIGHT] == 10
    assert not mine.repair
    assert mine.repaired_fired == 0
    assert sum(r.schedules for r in reports) == 1
    # AND each is purged (the table's TTL) once the occurrences it speaks of are: the
    # retention after the window's end
    item = aws.dynamodb.get_item(
        TableName=aws.settings.leases_table,
        Key={"pk": {"S": report_key(at("10:00"), at("11:00"), mine.shard)}},
        ConsistentRead=True,
    )["Item"]
    assert int(item["purge_at"]["N"]) == at("11:00") + aws.settings.retention_days * 86400
    # AND a later run of the same window replaces it; another window has no report
    clock.advance(60)
    reconcile(aws, at("10:00"), at("11:00"))
    newer = read_reports(aws, at("10:00"), shards=[mine.shard])[0]
    assert newer.repaired_fired == 2
    assert read_reports(aws, at("11:00")) == []
    # AND a slower run that started before it cannot overwrite it when it finishes
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)
    assert not store.put(mine.model_copy(update={"run_at": newer.run_at - 1}), purge_at=0)
    assert read_reports(aws, at("10:00"), shards=[mine.shard]) == [newer]


LATER = {"field": "window_end", "reason": "must be later than window_start"}
CLOSED = {"field": "window_end", "reason": "only a closed, past window is reconciled"}
SPAN = {"field": "window_end", "reason": f"a window spans at most {24 * HOUR} s"}
SHARDS = {"field": "shards", "reason": "shards are 0..1"}  # (2 shards here)


@pytest.mark.parametrize(
    ("start", "end", "shards", "problems"),
    [
        (at("11:00"), at("10:00"), [0], [LATER]),
        (at("11:00"), at("11:00"), [0], [LATER]),  # an empty window
        (at("11:00"), at("13:00"), [0], [CLOSED]),  # not over at 12:05
        (at("11:00") - 24 * HOUR - 1, at("11:00"), [0], [SPAN]),
        (at("10:00"), at("11:00"), [2], [SHARDS]),
        (at("10:00"), at("11:00"), [-1], [SHARDS]),
        (at("11:00"), at("13:00"), [0, 2], [CLOSED, SHARDS]),
    ],
)
def test_reconciler_refuses_a_request_naming_each_field_and_reason(
    alice: Api,
    aws: Services,
    clock: Clock,
    start: int,
    end: int,
    shards: list[int],
    problems: list[dict[str, str]],
):
    # GIVEN 2 shards and the clock at 12:05
    clock.now = at("12:05")
    # WHEN a window that is inverted or empty, not over yet or over a day long, or a shard
    # that does not exist, is asked for
    with pytest.raises(InvalidInput) as refused:
        reconcile(aws, start, end, shards=shards)
    # THEN it is refused, each problem with its field and reason, all of them in one message
    assert refused.value.details["fields"] == problems
    assert refused.value.message == "the reconcile request is not valid: " + "; ".join(
        f"{p['field']}: {p['reason']}" for p in problems
    )


@pytest.mark.parametrize(
    ("start", "end", "shards"),
    [
        (at("00:00"), at("10:00"), [0, 1]),  # ten closed hours, every shard
        (at("12:05") - 24 * HOUR, at("12:05"), [1]),  # a whole day, ending now; the last shard
    ],
)
def test_reconciler_accepts_a_closed_window_of_at_most_a_day_over_known_shards(
    alice: Api, aws: Services, clock: Clock, start: int, end: int, shards: list[int]
):
    # GIVEN the clock at 12:05; WHEN closed windows up to a day long (the longest ending this
    # very second) are reconciled over known shards THEN each shard asked for reports
    clock.now = at("12:05")
    results = reconcile(aws, start, end, shards=shards)
    assert [r.report.shard for r in results] == shards


class FifteenMinutes(LambdaContextStub):
    function_name = "reconciler"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 900_000


# A refused event ends the invocation before any metric: Powertools warns about that.
@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_reconciler_handler_validates_the_event_and_emits_metrics(
    alice: Api, aws: Services, clock: Clock, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a */5 schedule with one instant of [10:00, 11:00) dropped by the materializer
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    materialize_until(
        aws, clock, at("11:10"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:25")
    )
    clock.now = at("12:05")
    handler.configure(aws)
    try:
        # WHEN the hourly run invokes the handler with the EventBridge time (12:03)
        answer = handler.lambda_handler(
            {"time": f"{DAY}T12:03:00Z", "shards": list(range(aws.settings.shard_count))},
            FifteenMinutes(),
        )
        # THEN it reconciled the hour that ended an hour ago, and the 48 before it (none had a
        # report yet), and emitted the counts: 09:40-09:55 and 10:00-10:55 in flight but the
        # one dropped, found missing and repaired
        windows = [(s["window_start"], s["window_end"]) for s in answer["shards"]]
        assert windows[-1] == (at("10:00"), at("11:00"))
        assert len(windows) == (CATCHUP_WINDOWS + 1) * aws.settings.shard_count
        emitted = _emitted_metrics(capsys.readouterr().out)
        assert emitted["ReconcileMissing"] == 1
        assert emitted["ReconcileRepaired"] == 1
        assert emitted["ReconcileRepairFired"] == 1
        assert emitted["ReconcileUnexpected"] == 0
        assert emitted["ReconcileInFlight"] == 11 + 4
        assert emitted["ReconcileIncomplete"] == 0
        assert emitted["ClockSkew"] > 3600  # (this test's clock is weeks from DynamoDB's)
        # WHEN the next hourly run comes: its own hour is new, and the two hours whose
        # occurrences were still in flight (no worker here) are not settled: checked again
        clock.now = at("13:05")
        answer = handler.lambda_handler(
            {"time": f"{DAY}T13:03:00Z", "shards": list(range(aws.settings.shard_count))},
            FifteenMinutes(),
        )
        assert {(s["window_start"], s["window_end"]) for s in answer["shards"]} == {
            (at("09:00"), at("10:00")),
            (at("10:00"), at("11:00")),
            (at("11:00"), at("12:00")),
        }
        capsys.readouterr()
        # WHEN an operator re-runs that window explicitly
        handler.lambda_handler(
            {
                "time": f"{DAY}T12:06:00Z",
                "shards": [shard_of(sid, aws.settings.shard_count)],
                "window_start": f"{DAY}T10:00:00Z",
                "window_end": f"{DAY}T11:00:00Z",
            },
            FifteenMinutes(),
        )
        # THEN the repaired occurrence is in flight and nothing is missing any more
        emitted = _emitted_metrics(capsys.readouterr().out)
        assert emitted["ReconcileMissing"] == 0
        assert emitted["ReconcileInFlight"] == 12
        # WHEN events are malformed THEN each is refused with the field and the reason
        for bad, field in [
            ({"shards": [0]}, "time"),
            ({"time": "yesterday", "shards": [0]}, "time"),
            ({"time": f"{DAY}T12:03:00Z", "shards": []}, "shards"),
            (
                {"time": f"{DAY}T12:03:00Z", "shards": [0], "window_start": f"{DAY}T10:00:00Z"},
                "both",
            ),
            ({"time": f"{DAY}T12:03:00Z", "shards": [0], "dry": True}, "dry"),
        ]:
            with pytest.raises(InvalidInput, match="the reconciler event is not valid") as refused:
                handler.lambda_handler(bad, FifteenMinutes())
            assert field in str(refused.value)
    finally:
        handler.configure(None)


def test_fired_late_tells_a_policy_fire_from_a_jittered_one(alice: Api, aws: Services):
    # GIVEN a flexible occurrence at its deterministic instant, and the same one fired late
    oid = occurrence_id("sch_x", 1, 1000)
    due = available_at(oid, 1000, 600)
    normal = Occurrence(
        occurrence_id=oid,
        tenant_id="alice",
        schedule_id="sch_x",
        schedule_version=1,
        scheduled_for=1000,
        available_at=due,
        target="default",
        state=OccurrenceState.SCHEDULED,
    )
    late = normal.model_copy(update={"available_at": 5000})
    # THEN only the late one carries the trace of a misfire policy
    assert not fired_late(normal, 600)
    assert fired_late(late, 600)


def test_reconciler_handler_out_of_time_saves_incomplete_reports(
    alice: Api, aws: Services, clock: Clock, capsys: pytest.CaptureFixture[str]
):
    # GIVEN a Lambda with less time left than the handler's safety margin
    clock.now = at("12:05")
    handler.configure(aws)
    try:
        # WHEN the hourly run starts
        answer = handler.lambda_handler(
            {"time": f"{DAY}T12:03:00Z", "shards": [0, 1]}, LambdaContextStub()
        )
    finally:
        handler.configure(None)
    # THEN it stops before examining anything, saves each shard's report as incomplete and
    # counts the incomplete shards, rather than being killed by the timeout
    assert [s["complete"] for s in answer["shards"]] == [False, False]
    assert [r.complete for r in read_reports(aws, at("10:00"), shards=[0, 1])] == [False, False]
    assert _emitted_metrics(capsys.readouterr().out)["ReconcileIncomplete"] == 2


def test_reconciler_reads_every_missed_episode_of_the_hour(alice: Api, aws: Services, clock: Clock):
    # GIVEN a */5 SKIP schedule with two outages in one hour: 10:05-10:30 and 10:40-10:55
    clock.now = at("09:40")
    sid = make(
        aws, spec=cron_spec("*/5 * * * *"), misfire={"action": "SKIP", "max_lateness_seconds": 60}
    )
    shards = shards_of(aws, [sid])
    materialize_until(aws, clock, at("10:05"), shards)
    clock.now = at("10:30")
    materialize_until(aws, clock, at("10:40"), shards)
    clock.now = at("10:55")
    materialize_until(aws, clock, at("11:31"), shards)
    # WHEN the reconciler checks [10:00, 11:00)
    results = reconcile(aws, at("10:00"), at("11:00"))
    # THEN both episodes are MISSED by policy (two ranges on the schedule), none MISSING
    assert [r["count"] for r in current_item(aws, sid)["missed_ranges"]] == [4, 2]
    assert total(results, Finding.MISSED) == 6
    assert total(results, Finding.MISSING) == 0


def test_reconciler_catches_up_the_hours_an_outage_left_unchecked(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule whose occurrence at 10:25 was dropped, and a reconciler that was
    # down for the runs of 11:05 and 12:05 (the [09:00, 10:00) and [10:00, 11:00) hours)
    clock.now = at("09:40")
    sid = make(aws, spec=cron_spec("*/5 * * * *"), misfire={"max_lateness_seconds": 7 * 86400})
    materialize_until(
        aws, clock, at("12:00"), shards_of(aws, [sid]), skip=lambda s, t: t == at("10:25")
    )
    number = shard_of(sid, aws.settings.shard_count)
    reconciler = Reconciler(aws, workers=2)
    clock.now = at("10:05")
    reconciler.catch_up([number], int(clock.now))  # the last run before the outage
    # WHEN it is back for the 13:05 run
    clock.now = at("13:05")
    results = reconciler.catch_up([number], int(clock.now))
    # THEN it checks the three hours since its last complete run, and repairs the gap
    assert [(r.report.window_start, r.report.window_end) for r in results] == [
        (at("09:00"), at("10:00")),
        (at("10:00"), at("11:00")),
        (at("11:00"), at("12:00")),
    ]
    assert ids(results, "missing") == {occurrence_id(sid, 1, at("10:25"))}
    assert ids(results, "fired") == {occurrence_id(sid, 1, at("10:25"))}


def test_reconciler_catch_up_checks_every_other_window_when_one_fails(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a scheduled run at 12:05 with no report yet, whose check of [09:00, 10:00)
    # keeps failing (throttling that outlasted the client's retries), and of [08:00, 09:00)
    # fails once
    from botocore.exceptions import ClientError

    clock.now = at("12:05")
    reconciler = Reconciler(aws)
    check = reconciler.run_shard
    failing, once = (at("09:00"), at("10:00")), (at("08:00"), at("09:00"))
    tries: Counter[tuple[int, int]] = Counter()

    def flaky(shard: int, start: int, end: int) -> Any:
        tries[start, end] += 1
        if (start, end) == failing or ((start, end) == once and tries[once] == 1):
            raise ClientError({"Error": {"Code": "ThrottlingException"}}, "Query")
        return check(shard, start, end)

    monkeypatch.setattr(reconciler, "run_shard", flaky)
    # WHEN it runs; THEN it fails (so the caller retries) ...
    with pytest.raises(ClientError):
        reconciler.catch_up([0], at("12:05"))
    # ... having tried the failing window three times, the other one again, and checked
    # every other window, the older ones and its own hour included
    assert (tries[failing], tries[once]) == (3, 2)
    windows = [(at("10:00") - k * 3600, at("11:00") - k * 3600) for k in range(CATCHUP_WINDOWS + 1)]
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)
    assert store.settled_windows(0, windows) == set(windows) - {failing}
    # AND the next run checks the failed window and its own hour only
    clock.now = at("13:05")
    again = Reconciler(aws).catch_up([0], at("13:05"))
    assert [(r.report.window_start, r.report.window_end) for r in again] == [
        failing,
        (at("11:00"), at("12:00")),
    ]


def test_reconciler_reports_an_hour_that_leaves_its_horizon_still_open(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two shards' reports of the hour that drops out of the 12:05 run's horizon
    # (CATCHUP_WINDOWS hours before [09:00, 10:00)): shard 0's last check left it open
    # (it ran out of time), shard 1's settled it; and shard 0's next hour is open too
    clock.now = at("12:05")
    leaving = (at("10:00") - (CATCHUP_WINDOWS + 1) * HOUR, at("10:00") - CATCHUP_WINDOWS * HOUR)
    store = ReportStore(aws.dynamodb, aws.settings.leases_table)

    def stored(shard: int, window: tuple[int, int], complete: bool) -> ReconcileReport:
        report = ReconcileReport.model_validate(
            {
                **dict(zip(("window_start", "window_end"), window, strict=True)),
                "shard": shard,
                "run_at": window[1] + HOUR,
                "complete": complete,
                "repair": True,
                "schedules": 0,
                "counts": {},
                "examples": {},
                "repaired_fired": 0,
                "repaired_missed": 0,
                "deferred": 0,
                "repair_conflicts": 0,
            }
        )
        assert store.put(report, purge_at=0)
        return report

    given_up = stored(0, leaving, complete=False)
    stored(1, leaving, complete=True)
    stored(0, (leaving[1], leaving[1] + HOUR), complete=False)
    # WHEN the scheduled run catches up
    reconciler = Reconciler(aws)
    results = reconciler.catch_up([0, 1], at("12:05"))
    # THEN it names shard 0's open hour as given up (the metric counts it), checks no
    # hour that old, and still checks the open hour inside its horizon
    assert reconciler.given_up == [given_up]
    assert metric_values(results, len(reconciler.given_up))["ReconcileGaveUp"] == 1
    checked = {(r.report.shard, r.report.window_start) for r in results}
    assert min(start for _, start in checked) == leaving[1]
    assert (0, leaving[1]) in checked
