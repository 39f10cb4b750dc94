"""The materializer on moto: exactly once per (schedule, version, instant), crash points,
racing holders, misfire policies, DST days, flexible windows, completion."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import Label, Transactions, from_dynamo, to_dynamo
from punctual.dal.leases import LeaseStore, shard_key
from punctual.dal.schedules import due_bucket, schedule_from_item
from punctual.dal.tables import DUE_INDEX, current_key, occurrence_key
from punctual.domain.ids import available_at, occurrence_id, shard_of
from punctual.domain.models import Finding, OccurrenceState, ScheduleDefinition, ScheduleState
from punctual.domain.planning import CATCHUP_AFTER
from punctual.pipeline.materializer import (
    COMMIT_ATTEMPTS,
    LEASE_SECONDS,
    RENEW_AFTER,
    RETRY,
    STEP_LIMIT,
    Materializer,
)
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from punctual.timing import utc_text
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.instants import epoch
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import CountedWrites, cron_spec, current_item, make


class Crash(BaseException):
    """A crash point: the process dies there. Not an Exception, as a kill is not one: the
    materializer's error path (which releases its lease) must not run."""


def current(aws: Services, schedule_id: str) -> dict[str, Any]:
    return current_item(aws, schedule_id)


def occurrences(aws: Services, schedule_id: str) -> list[dict[str, Any]]:
    found, _ = aws.occurrences.list_for_schedule(
        schedule_id, since=0, until=2**40, limit=1000, token=None
    )
    return [o.model_dump() for o in found]


def instants(aws: Services, schedule_id: str) -> list[int]:
    return sorted(o["scheduled_for"] for o in occurrences(aws, schedule_id))


def shard(aws: Services, schedule_id: str) -> int:
    return shard_of(schedule_id, aws.settings.shard_count)


def tick(aws: Services, clock: Clock, schedule_id: str, holder: str = "m1", **kw: Any) -> Any:
    return Materializer(aws, holder, **kw).run_shard(int(clock.now), shard(aws, schedule_id))


def crash_at(point: str, times: int = 1) -> Callable[[str], None]:
    left = [times]

    def hook(where: str) -> None:
        if where == point and left[0] > 0:
            left[0] -= 1
            raise Crash(point)

    return hook


def test_materializer_creates_each_due_fire_once_and_moves_the_cursor(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an hourly schedule whose next fire is beyond what the API materializes itself
    sid = make(aws, spec=cron_spec("0 * * * *"), payload={"report": "daily"})
    first = current(aws, sid)["next_run_at"]
    assert instants(aws, sid) == []
    # WHEN the tick comes within the lookahead, twice (an idempotent re-run)
    clock.now = first - 120
    tick(aws, clock, sid)
    tick(aws, clock, sid)
    # THEN exactly one occurrence exists, SCHEDULED, and the cursor moved to the next hour
    found = occurrences(aws, sid)
    assert [o["scheduled_for"] for o in found] == [first]
    assert found[0]["state"] == OccurrenceState.SCHEDULED
    assert found[0]["occurrence_id"] == occurrence_id(sid, 1, first)
    assert found[0]["expires_at"] == first + aws.settings.retention_days * 86400
    assert current(aws, sid)["next_run_at"] == first + 3600
    # AND it carries the schedule's payload (the relay sends it without reading the schedule)
    item = aws.dynamodb.get_item(
        TableName=aws.settings.occurrences_table,
        Key=to_dynamo(occurrence_key(found[0]["occurrence_id"])),
    )["Item"]
    assert from_dynamo(item)["payload"] == {"report": "daily"}


def test_materializer_second_holder_cannot_claim_a_live_lease(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN one materializer holding a shard's lease
    sid = make(aws, spec=cron_spec("0 * * * *"))
    leases = LeaseStore(aws.dynamodb, aws.settings.leases_table)
    held = leases.claim(shard(aws, sid), "m1", now=int(clock.now), ttl=60, start_at=0)
    assert held is not None
    # WHEN another one ticks the same shard
    report = tick(aws, clock, sid, holder="m2")
    # THEN it does nothing; once the lease expires it takes over with a larger fence
    assert not report.claimed
    taken = leases.claim(shard(aws, sid), "m2", now=int(clock.now) + 61, ttl=60, start_at=0)
    assert taken is not None
    assert taken.fence > held.fence


def test_materializer_stale_holder_is_fenced_after_takeover(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two materializers racing on one shard: m1 stalls just before committing,
    # its lease expires, and m2 takes the shard over and does the work
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 120

    def stall_then_lose(point: str) -> None:
        if point == "before_commit" and not stall_then_lose.done:  # type: ignore[attr-defined]
            stall_then_lose.done = True  # type: ignore[attr-defined]
            clock.advance(LEASE_SECONDS + 1)
            tick(aws, clock, sid, holder="m2")

    stall_then_lose.done = False  # type: ignore[attr-defined]
    # WHEN the stale m1 resumes and tries to commit
    report = tick(aws, clock, sid, holder="m1", crash=stall_then_lose)
    # THEN it is fenced (commits nothing) and each instant has exactly one occurrence
    assert report.lease_lost
    found = instants(aws, sid)
    assert found
    assert len(found) == len(set(found))
    assert all(b - a == 300 for a, b in itertools.pairwise(found))


def test_materializer_fence_blocks_a_commit_after_takeover_even_with_cursor_unchanged(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN m1 about to commit, when m2 takes the expired lease over but writes nothing:
    # the schedule's cursor is unchanged, so only the fence can stop m1
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    due = current(aws, sid)["next_run_at"]
    clock.now = due - 120
    leases = LeaseStore(aws.dynamodb, aws.settings.leases_table)

    def taken_over(point: str) -> None:
        if point == "before_commit":
            clock.advance(LEASE_SECONDS + 1)
            assert leases.claim(shard(aws, sid), "m2", now=int(clock.now), ttl=60, start_at=0)

    # WHEN the stale m1 commits
    report = tick(aws, clock, sid, holder="m1", crash=taken_over)
    # THEN nothing of it is written: no occurrence, the cursor where it was
    assert report.lease_lost
    assert report.occurrences == 0
    assert due not in instants(aws, sid)
    assert current(aws, sid)["next_run_at"] == due


def test_materializer_fenced_by_a_holder_whose_clock_runs_ahead_stops_at_its_first_refusal(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN m1 about to commit, its lease renewed a moment ago by its own clock, when m2,
    # whose clock runs more than a lease ahead (Lambdas' clocks differ), takes the shard over:
    # by m1's clock its lease is fresh, so only the fence's refusal tells it
    sid, due, number = _due_in_two_minutes(aws, clock)
    since: list[str] = []  # the crash points m1 passes from the takeover on

    def taken_over(point: str) -> None:
        if since or point == "before_commit":
            since.append(point)
        if since == ["before_commit"]:
            ahead = int(clock.now) + LEASE_SECONDS + 1
            assert aws.leases.claim(number, "m2", now=ahead, ttl=LEASE_SECONDS, start_at=0)

    # WHEN m1 commits
    report = tick(aws, clock, sid, holder="m1", crash=taken_over)
    # THEN the refusal is the lost lease, at once: no retry of the same steps, no hand-over,
    # no conflict counted, and the walk says it stands where the shard's watermark is
    assert report.lease_lost
    assert since == ["before_commit"]
    assert report.conflicts == 0
    assert report.watermark == aws.leases.watermark(number)
    assert due not in instants(aws, sid)


def test_materializer_that_loses_its_lease_between_two_transactions_writes_nothing_more(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a bucket of three schedules, one transaction each, and a holder that stalls past
    # its lease right after its first commit, while m2 takes the shard over
    same, due = _one_bucket(aws, clock)
    number = shard(aws, same[0])
    after_loss: list[str] = []

    def stall_after_first_commit(point: str) -> None:
        if after_loss:
            after_loss.append(point)
        elif point == "after_commit":
            after_loss.append("lost")
            clock.advance(LEASE_SECONDS + 1)
            taken = aws.leases.claim(
                number, "m2", now=int(clock.now), ttl=LEASE_SECONDS, start_at=0
            )
            assert taken is not None

    # WHEN m1 goes on
    report = tick(aws, clock, same[0], holder="m1", max_actions=3, crash=stall_after_first_commit)
    # THEN its renewal finds the lease lost: it says so and stops, with no further commit,
    # watermark move or hand-over, and the walk says it stands where the watermark is
    assert report.lease_lost
    assert after_loss == ["lost"]
    assert report.occurrences == 1
    assert report.watermark == aws.leases.watermark(number)
    assert sum(instants(aws, sid).count(due) for sid in same) == 1
    # AND the new holder finishes the bucket, every fire once
    assert tick(aws, clock, same[0], holder="m2", max_actions=3).claimed
    assert _fired_once_each(aws, same, due)


def test_materializer_retries_a_transaction_cancelled_by_a_conflict(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a bucket of three schedules, one transaction each, whose first commit is
    # cancelled by a conflicting transaction (TransactionConflict: nothing written)
    same, due = _one_bucket(aws, clock)
    faults = Faults(FaultPlan(conflict=1.0), clock)
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    attempts: list[str] = []

    def only_the_first_conflicts(point: str) -> None:
        if point == "before_commit":
            attempts.append(point)
            faults.plan.conflict = 1.0 if len(attempts) == 1 else 0.0

    # WHEN the materializer ticks
    report = Materializer(racing, "m1", max_actions=3, crash=only_the_first_conflicts).run_shard(
        int(clock.now), shard(aws, same[0])
    )
    # THEN the refused step goes again in this tick and none is dropped:
    # four commits for three steps, every fire once
    assert faults.injected["transaction_conflict"] == 1
    assert len(attempts) == 4
    assert (report.occurrences, report.lease_lost) == (3, False)
    assert _fired_once_each(aws, same, due)


def test_materializer_gives_a_bucket_up_after_its_retries_and_the_next_tick_does_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule due in two minutes and every commit cancelled by a conflict
    sid, due, number = _due_in_two_minutes(aws, clock)
    faults = Faults(FaultPlan(conflict=1.0), clock)
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    before = aws.leases.watermark(number)
    assert before is not None
    paused: list[float] = []
    racing = dataclasses.replace(racing, sleep=paused.append)
    # WHEN the materializer ticks
    report = Materializer(racing, "m1").run_shard(int(clock.now), number)
    # THEN it tries COMMIT_ATTEMPTS - 1 times after the first attempt, each after a jittered pause
    # (not at once: the same hot partition or rival again), then leaves the bucket: nothing
    # written, the watermark still on the bucket (each bucket before it counted once), the
    # lease released (not lost)
    assert faults.injected["transaction_conflict"] == COMMIT_ATTEMPTS
    assert len(paused) == COMMIT_ATTEMPTS - 1
    assert all(0 <= p <= RETRY.ceiling(n) for n, p in enumerate(paused))
    assert (report.shard, report.occurrences, report.lease_lost) == (number, 0, False)
    assert report.watermark == aws.leases.watermark(number)
    assert report.watermark is not None
    assert report.buckets == (report.watermark - before) // 60 > 0
    assert report.watermark <= due // 60 * 60
    # AND the next tick (another holder, the conflicts over) fires it
    assert tick(aws, clock, sid, holder="m2").claimed
    assert instants(aws, sid).count(due) == 1


@pytest.mark.parametrize("point", ["before_commit", "after_commit", "before_watermark"])
def test_materializer_crash_point_rerun_yields_every_occurrence_once(
    alice: Api, aws: Services, clock: Clock, point: str
):
    # GIVEN three schedules in different shards' buckets, due in the same minute
    ids = [make(aws, spec=cron_spec("*/10 * * * *"), name=f"s{i}") for i in range(3)]
    due = current(aws, ids[0])["next_run_at"]
    direct = {sid: instants(aws, sid) for sid in ids}  # what the API materialized itself
    clock.now = due - 120
    for number in sorted({shard(aws, sid) for sid in ids}):
        # WHEN the first attempt crashes at the named point and a fresh process re-runs
        with pytest.raises(Crash):
            Materializer(aws, "m1", crash=crash_at(point)).run_shard(int(clock.now), number)
        clock.advance(LEASE_SECONDS + 1)  # the crashed holder's lease expires
        Materializer(aws, "m2").run_shard(int(clock.now), number)
        clock.advance(-(LEASE_SECONDS + 1))
    # THEN every schedule has its occurrence exactly once, and nothing was skipped
    for sid in ids:
        assert instants(aws, sid) == [*direct[sid], due]


def _due_in_two_minutes(aws: Services, clock: Clock) -> tuple[str, int, int]:
    """A */5 schedule, the clock two minutes before its next fire; its id, that fire, and
    its shard."""
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    due = current(aws, sid)["next_run_at"]
    clock.now = due - 120
    return sid, due, shard(aws, sid)


def _fired_once_each(aws: Services, ids: list[str], due: int) -> bool:
    """Each of the schedules has exactly one occurrence at ``due``."""
    return all(instants(aws, sid).count(due) == 1 for sid in ids)


def _one_bucket(aws: Services, clock: Clock, count: int = 3) -> tuple[list[str], int]:
    """``count`` schedules sharing one (minute, shard) bucket (ids are random: made until
    enough land in the first one's shard), the clock two minutes before it."""
    same = [make(aws, spec=cron_spec("*/10 * * * *"), name="s0")]
    while len(same) < count:
        sid = make(aws, spec=cron_spec("*/10 * * * *"), name=f"s{len(same)}")
        if shard(aws, sid) == shard(aws, same[0]):
            same.append(sid)
    due = current(aws, same[0])["next_run_at"]
    clock.now = due - 120
    return same, due


def test_materializer_error_mid_walk_releases_its_lease_for_the_retry(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a walk that fails with an error (say DynamoDB throttling) after one commit
    same, due = _one_bucket(aws, clock)

    def fail(point: str) -> None:
        if point == "after_commit":
            raise RuntimeError("throttled")

    with pytest.raises(RuntimeError):
        tick(aws, clock, same[0], holder="m1", max_actions=3, crash=fail)
    # WHEN Step Functions retries at once, on another environment (another holder)
    report = tick(aws, clock, same[0], holder="m2", max_actions=3)
    # THEN the lease was released on the error: the retry claims it without waiting for the
    # 120 s expiry, and finishes the bucket with every fire once
    assert report.claimed
    assert _fired_once_each(aws, same, due)


def test_materializer_killed_mid_walk_keeps_its_lease_until_it_expires(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a walk killed after one commit (a Lambda timeout: no code runs after it)
    same, due = _one_bucket(aws, clock)
    with pytest.raises(Crash):
        tick(aws, clock, same[0], holder="m1", max_actions=3, crash=crash_at("after_commit"))
    # WHEN another holder ticks at once; THEN the lease still blocks it ...
    assert not tick(aws, clock, same[0], holder="m2", max_actions=3).claimed
    # ... and once it expires, the bucket is finished with every fire once
    clock.advance(LEASE_SECONDS + 1)
    assert tick(aws, clock, same[0], holder="m2", max_actions=3).claimed
    assert _fired_once_each(aws, same, due)


def test_materializer_out_of_time_stops_between_transactions_and_the_next_tick_goes_on(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a bucket of several schedules, one transaction each, and a Lambda that runs out
    # of time right after the first commit
    same, due = _one_bucket(aws, clock)
    late = [False]

    def after_commit(point: str) -> None:
        late[0] = late[0] or point == "after_commit"

    # WHEN it walks the bucket
    first = Materializer(
        aws, "m1", max_actions=3, crash=after_commit, out_of_time=lambda: late[0]
    ).run(int(clock.now), [shard(aws, same[0])])
    # THEN it stopped cleanly inside the bucket: one schedule done, the watermark not moved
    # past the bucket, and the lease released (another holder claims it at once)
    [report] = first
    assert (report.out_of_time, report.occurrences) == (True, 1)
    assert report.watermark is not None
    assert report.watermark <= due // 60 * 60
    assert sum(instants(aws, sid).count(due) for sid in same) == 1
    # AND the next tick (another holder, same minute) does the rest, every fire once
    again = tick(aws, clock, same[0], holder="m2", max_actions=3)
    assert again.claimed
    assert _fired_once_each(aws, same, due)


def test_materializer_out_of_time_claims_no_further_shard(aws: Services, clock: Clock):
    # GIVEN a group of shards and a Lambda already out of time
    # WHEN it runs; THEN it claims none of them (their watermarks stay for the next tick),
    # and says so for each
    reports = Materializer(aws, "m1", out_of_time=lambda: True).run(int(clock.now), [0, 1, 2])
    assert [(r.shard, r.claimed, r.out_of_time) for r in reports] == [
        (0, False, True),
        (1, False, True),
        (2, False, True),
    ]


def test_materializer_crash_between_two_schedules_of_one_bucket(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN many schedules in one (minute, shard) bucket, one transaction each
    ids = [make(aws, spec=cron_spec("*/10 * * * *"), name=f"s{i}") for i in range(12)]
    target = shard(aws, ids[0])
    same = [sid for sid in ids if shard(aws, sid) == target]
    due = current(aws, same[0])["next_run_at"]
    direct = {sid: instants(aws, sid) for sid in same}
    clock.now = due - 120
    # WHEN the materializer crashes after committing the first schedule only
    with pytest.raises(Crash):
        tick(aws, clock, same[0], max_actions=3, crash=crash_at("after_commit"))
    done = [sid for sid in same if due in instants(aws, sid)]
    assert len(done) == 1
    tick(aws, clock, same[0], max_actions=3)
    # THEN the re-run finishes the others, and none is doubled
    for sid in same:
        assert instants(aws, sid) == [*direct[sid], due]


def _outage(aws: Services, clock: Clock, misfire: dict[str, Any]) -> tuple[str, int, Any]:
    sid = make(aws, spec=cron_spec("* * * * *"), misfire=misfire)
    cursor = current(aws, sid)["next_run_at"]
    before = len(instants(aws, sid))
    clock.now = cursor + 600  # ten minutes with no tick at all
    report = tick(aws, clock, sid)
    return sid, before, report


@pytest.mark.parametrize(
    ("misfire", "late_fired", "missed"),
    [
        ({"action": "SKIP", "max_lateness_seconds": 60}, 0, 9),
        ({"action": "FIRE_ONCE", "max_lateness_seconds": 60}, 1, 8),
        ({"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 3}, 3, 6),
    ],
)
def test_materializer_ten_minute_outage_applies_the_misfire_policy(
    alice: Api, aws: Services, clock: Clock, misfire: dict[str, Any], late_fired: int, missed: int
):
    # GIVEN a minutely schedule and ten minutes without any tick: its cursor is 600 s old,
    # so the 9 fires before now - max_lateness are misfires
    sid, before, report = _outage(aws, clock, misfire)
    now = int(clock.now)
    fired = instants(aws, sid)[before:]
    # THEN fires older than max_lateness (60 s) are handled by the policy: exactly
    # `late_fired` of the latest ones fire, the rest are counted MISSED on the schedule
    late = [f for f in fired if f < now - 60]
    assert len(late) == late_fired
    assert report.missed == missed
    assert current(aws, sid)["missed_total"] == missed
    # AND everything from now - max_lateness to the lookahead fires as usual, without a gap
    recent = [f for f in fired if f >= now - 60]
    assert recent == list(range(recent[0], recent[-1] + 1, 60))
    assert recent[0] == now - 60


def test_materializer_fires_long_due_within_max_lateness_go_by_the_catchup_lane(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule tolerating a day of lateness, and ten minutes with no tick
    sid, before, _ = _outage(aws, clock, {"action": "FIRE_ONCE", "max_lateness_seconds": 86400})
    now = int(clock.now)
    made = occurrences(aws, sid)[before:]
    # THEN every late fire fired (none is a misfire), at its own time; those due more than
    # CATCHUP_AFTER ago go by the catch-up lane, the last minutes' and the coming ones on time
    assert [o["scheduled_for"] for o in made] == sorted(o["scheduled_for"] for o in made)
    lanes = {o["scheduled_for"]: o.get("lane") for o in made}
    assert {lane for t, lane in lanes.items() if t < now - CATCHUP_AFTER} == {"CATCHUP"}
    assert {lane for t, lane in lanes.items() if t >= now - CATCHUP_AFTER} == {None}
    assert min(lanes) < now - CATCHUP_AFTER <= max(lanes)


def test_materializer_catchup_is_paced_by_the_tenant_rate(aws: Services, clock: Clock):
    # GIVEN a tenant allowed 2 catch-up fires a minute, and an outage
    from tests.integration.conftest import ALICE, bootstrap

    bootstrap("alice", ALICE, catchup_per_minute=2)
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 3}
    sid, before, _ = _outage(aws, clock, misfire)
    # THEN the three catch-up occurrences become receivable 30 s apart from now
    now = int(clock.now)
    made = occurrences(aws, sid)[before:]
    late = [o for o in made if o["scheduled_for"] < now - 60]
    assert sorted(o["available_at"] for o in late) == [now, now + 30, now + 60]
    # AND they go by the catch-up lane, apart from the fires due now, which go on time
    assert {o.get("lane") for o in late} == {"CATCHUP"}
    assert {o.get("lane") for o in made if o not in late} == {None}


def test_materializer_daily_0230_new_york_skips_spring_forward_day(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a daily 02:30 America/New_York schedule created at 01:50 EST on 2026-03-08
    # (its shard's walk starts an hour before: each minute walked is a moto update)
    clock.now = epoch("2026-03-08T06:50:00Z")
    sid = make(aws, spec=cron_spec("30 2 * * *", "America/New_York"))
    # WHEN the materializer ticks through the night of 2026-03-08 and the next morning
    for at in ("2026-03-08T06:58:00Z", "2026-03-08T07:28:00Z", "2026-03-09T06:28:00Z"):
        clock.now = epoch(at)
        tick(aws, clock, sid, holder=at)
    # THEN there is no occurrence on 2026-03-08 (02:30 does not exist that day)
    assert instants(aws, sid) == [epoch("2026-03-09T06:30:00Z")]


def test_materializer_every_15_minutes_fires_once_per_wall_time_across_fall_back(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */15 America/New_York schedule before the 2026-11-01 fall-back
    clock.now = epoch("2026-11-01T04:50:00Z")
    sid = make(aws, spec=cron_spec("*/15 * * * *", "America/New_York"))
    # WHEN the materializer ticks every minute until 02:20 EST
    while clock.now < epoch("2026-11-01T07:20:00Z"):
        tick(aws, clock, sid)
        clock.advance(60)
    # THEN 01:00-01:45 fire once (EDT) and the repeated hour adds nothing
    fired = [f for f in instants(aws, sid) if f <= epoch("2026-11-01T07:15:00Z")]
    expected = ["05:00", "05:15", "05:30", "05:45", "07:00", "07:15"]
    assert fired == [epoch(f"2026-11-01T{t}:00Z") for t in expected]


def test_materializer_cancel_racing_a_step_leaves_no_stale_scheduled_occurrence(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule about to be materialized
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 120

    def cancel_first(point: str) -> None:
        if point == "before_commit" and not cancel_first.done:  # type: ignore[attr-defined]
            cancel_first.done = True  # type: ignore[attr-defined]
            ControlPlane(aws).cancel("alice", sid)

    cancel_first.done = False  # type: ignore[attr-defined]
    # WHEN a cancel lands between the materializer's read and its commit
    report = tick(aws, clock, sid, crash=cancel_first)
    # THEN the stale step is refused, and no occurrence of the old version is SCHEDULED
    assert report.conflicts == 1
    assert all(o["state"] != OccurrenceState.SCHEDULED for o in occurrences(aws, sid))
    assert current(aws, sid)["state"] == ScheduleState.CANCELED


def crowded_bucket(
    aws: Services, spec: dict[str, Any] | Callable[[int], dict[str, Any]], count: int
) -> tuple[int, list[str]]:
    """``count`` schedules due in one bucket of one shard (made until one shard has that
    many; ``spec`` may be given the number made before, to spread them within the minute):
    the bucket's minute, and its schedules in the order the walk reads them."""
    by_shard: dict[int, list[str]] = {}
    while max((len(v) for v in by_shard.values()), default=0) < count:
        made = sum(map(len, by_shard.values()))
        sid = make(aws, spec=spec(made) if callable(spec) else spec)
        by_shard.setdefault(shard(aws, sid), []).append(sid)
    crowded = next(v for v in by_shard.values() if len(v) >= count)
    minute = current(aws, crowded[0])["next_available_at"] // 60 * 60
    return minute, [
        s.schedule.schedule_id for s in aws.schedules.due_in(minute, shard(aws, crowded[0]))
    ]


def test_materializer_a_batch_refused_by_some_schedules_goes_on_with_the_others(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN four schedules due in one bucket of one shard, stepped in one transaction
    minute, [a, b, c, d, *_] = crowded_bucket(aws, cron_spec("*/5 * * * *"), 4)
    fire = current(aws, a)["next_run_at"]
    clock.now = fire - 120
    plane = ControlPlane(aws)

    def cancel_two(point: str) -> None:
        if point == "before_commit" and not cancel_two.done:  # type: ignore[attr-defined]
            cancel_two.done = True  # type: ignore[attr-defined]
            plane.cancel("alice", b)
            plane.cancel("alice", d)

    cancel_two.done = False  # type: ignore[attr-defined]
    # WHEN the second and the fourth are canceled between the walk's read and its commit
    report = tick(aws, clock, a, crash=cancel_two)
    # THEN exactly those two are conflicts; the others (before, between and after them in
    # the transaction) got their occurrence in the same tick, and the bucket is done
    assert report.conflicts == 2
    for stepped in (a, c):
        assert [f for f in instants(aws, stepped) if f >= fire] == [fire]  # (the API: before)
    for canceled in (b, d):
        assert all(o["state"] != OccurrenceState.SCHEDULED for o in occurrences(aws, canceled))
    assert report.watermark is not None
    assert report.watermark > minute


def test_materializer_drops_the_step_of_a_schedule_deleted_between_read_and_commit(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three schedules due in one bucket of one shard, stepped in one transaction
    minute, [a, b, c, *_] = crowded_bucket(aws, cron_spec("*/5 * * * *"), 3)
    fire = current(aws, a)["next_run_at"]
    clock.now = fire - 120

    def delete_second(point: str) -> None:
        if point == "before_commit" and not delete_second.done:  # type: ignore[attr-defined]
            delete_second.done = True  # type: ignore[attr-defined]
            # (an operator's clean-up: the schedule's item is gone, not canceled)
            aws.dynamodb.delete_item(
                TableName=aws.settings.schedules_table, Key=to_dynamo(current_key(b))
            )

    delete_second.done = False  # type: ignore[attr-defined]
    # WHEN the second's item is deleted between the walk's read and its commit
    report = tick(aws, clock, a, crash=delete_second)
    # THEN its step is a conflict and is dropped (the re-read finds nothing to plan), without
    # failing the walk: the others got their occurrence and the bucket is done
    assert report.conflicts == 1
    for stepped in (a, c):
        assert [f for f in instants(aws, stepped) if f >= fire] == [fire]
    assert [f for f in instants(aws, b) if f >= fire] == []
    assert report.watermark is not None
    assert report.watermark > minute


def test_materializer_an_occurrence_already_made_is_left_and_the_step_goes_on(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three minutely schedules due in one bucket of one shard, the second of which
    # already has its second fire's occurrence (a repair made it, and it ran)
    minute, [a, b, c, *_] = crowded_bucket(aws, cron_spec("* * * * *"), 3)
    fire = current(aws, a)["next_run_at"]
    clock.now = fire - 120
    made = occurrence_id(b, 1, fire + 60)
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item={
            **to_dynamo(occurrence_key(made)),
            "occurrence_id": {"S": made},
            "state": {"S": "SUCCEEDED"},
        },
    )
    # WHEN the materializer steps the bucket (each step makes several fires)
    report = tick(aws, clock, a)
    # THEN the second's refused put is no conflict: its other fires are made, its cursor
    # moved on, the existing occurrence is untouched; the third's step was not dropped
    assert report.conflicts == 0
    steps = [f for f in instants(aws, a) if f >= fire]  # (the API made the ones before)
    assert steps[:2] == [fire, fire + 60]
    assert [f for f in instants(aws, c) if f >= fire] == steps
    assert current(aws, b)["next_run_at"] == current(aws, a)["next_run_at"] > fire
    states = {
        f: aws.dynamodb.get_item(
            TableName=aws.settings.occurrences_table,
            Key=to_dynamo(occurrence_key(occurrence_id(b, 1, f))),
        )["Item"]["state"]["S"]
        for f in steps
    }
    assert states == {f: "SUCCEEDED" if f == fire + 60 else "SCHEDULED" for f in steps}
    assert report.watermark is not None
    assert report.watermark > minute


def test_materializer_replans_a_refused_schedule_at_once_where_the_index_lags(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule the walk is about to step, on a due index that serves
    # every query 100 s behind (its creation is older: the walk sees it)
    sid = make(aws, spec=cron_spec("* * * * *"))
    fire = current(aws, sid)["next_run_at"]
    clock.now = fire - 120
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=100), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # (an API whose clock is 170 s behind the ticker's: its cursor lands inside this walk)
    behind = ControlPlane(dataclasses.replace(lagging, now=lambda: clock.now - 170))

    def update_first(point: str) -> None:
        if point == "before_commit" and not update_first.done:  # type: ignore[attr-defined]
            update_first.done = True  # type: ignore[attr-defined]
            behind.update("alice", sid, if_match=1, changes={"payload": {"v": 2}})

    update_first.done = False  # type: ignore[attr-defined]
    # WHEN the schedule is updated between the walk's read and its commit
    report = Materializer(lagging, "m1", crash=update_first).run_shard(
        int(clock.now), shard(aws, sid)
    )
    # THEN the refused step is re-read and version 2 is planned at once, through the end of
    # the walk: the bucket its cursor moved to is read later in this walk from the lagging
    # index, which does not show it there yet (and the next walk starts past it)
    assert report.conflicts == 1
    cursor = current(aws, sid)
    assert (cursor["version"], cursor["next_run_at"]) == (2, fire + 120)
    v2 = [o["scheduled_for"] for o in occurrences(aws, sid) if o["schedule_version"] == 2]
    assert fire + 60 in v2


def test_materializer_continues_a_full_step_up_to_the_walks_very_last_second(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely rate fired at second 59 of each minute, from an hour ahead, and a walk
    # whose window ends exactly on its 21st fire (the step limit is 20), over a due index
    # that serves every query 100 s behind (the schedule is older: the walk sees it)
    assert STEP_LIMIT == 20
    first = (int(clock.now) + 3600) // 60 * 60 + 59
    rate = {"kind": "rate", "expression": "rate(1 minute)", "start_at": utc_text(first)}
    sid = make(aws, spec=rate)
    clock.now = first - 59 - 60
    wide = aws.settings.model_copy(update={"lookahead_seconds": 21 * 60})
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=100), clock)
    lagging = dataclasses.replace(aws, settings=wide, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN one walk runs: the first step makes 20 fires and leaves its cursor on the 21st,
    # receivable at the walk's last second
    report = Materializer(lagging, "m1").run_shard(int(clock.now), shard(aws, sid))
    # THEN the step is continued in the same walk (the lagging index would not show the
    # schedule in the last bucket, and the next walk starts past it): all 21 are made and
    # the cursor is past the window
    assert report.watermark == first - 59 + 21 * 60
    assert instants(aws, sid) == [first + 60 * k for k in range(21)]
    assert current(aws, sid)["next_run_at"] == first + 21 * 60


def test_materializer_reports_every_completion_of_a_transaction(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN three one-shots at the same instant an hour ahead, in one bucket of one shard
    at = int(clock.now) + 3600
    spec = {"kind": "at", "at": utc_text(at)}
    _, ids = crowded_bucket(aws, spec, 3)
    # WHEN the materializer steps them (one transaction)
    clock.now = at - 60
    report = tick(aws, clock, ids[0])
    # THEN its report counts each completion and each occurrence
    assert (report.completed, report.occurrences) == (len(ids), len(ids))
    assert all(current(aws, sid)["state"] == ScheduleState.COMPLETED for sid in ids)


def test_materializer_update_after_step_cancels_the_old_versions_occurrence(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a materialized occurrence of version 1
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 120
    tick(aws, clock, sid)
    # WHEN the schedule is updated before it fires
    saved = ControlPlane(aws).update("alice", sid, if_match=1, changes={"payload": {"v": 2}})
    # THEN the version-1 occurrence is CANCELED and version 2 has its own occurrences
    old = [o for o in occurrences(aws, sid) if o["schedule_version"] == 1]
    assert old
    assert all(o["state"] == OccurrenceState.CANCELED for o in old)
    assert {a.occurrence.state for a in saved.affected} == {OccurrenceState.CANCELED}


def test_materializer_flexible_available_at_is_deterministic_within_window(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN flexible schedules with a 300 s window
    ids = [
        make(aws, spec=cron_spec("*/10 * * * *"), flexible_window_seconds=300, name=f"f{i}")
        for i in range(5)
    ]
    clock.now = min(current(aws, sid)["next_available_at"] for sid in ids) - 60
    # WHEN the materializer runs (after a crash, so the work is redone)
    for number in sorted({shard(aws, sid) for sid in ids}):
        with pytest.raises(Crash):
            Materializer(aws, "m1", crash=crash_at("before_watermark")).run_shard(
                int(clock.now), number
            )
        Materializer(aws, "m1").run_shard(int(clock.now), number)
    # THEN each available_at is scheduled_for + the id's jitter, inside the window
    for sid in ids:
        for o in occurrences(aws, sid):
            assert o["scheduled_for"] <= o["available_at"] < o["scheduled_for"] + 300
            assert o["available_at"] == available_at(o["occurrence_id"], o["scheduled_for"], 300)


def test_materializer_completes_a_one_shot_and_releases_its_quota(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead (beyond the API's horizon)
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()})
    assert alice.get("/v1/tenant").body["schedule_count"] == 1
    # WHEN it is materialized
    clock.now = at - 60
    tick(aws, clock, sid)
    # THEN it has its occurrence, is COMPLETED, left the due index and gave its slot back
    assert instants(aws, sid) == [at]
    item = current(aws, sid)
    assert item["state"] == ScheduleState.COMPLETED
    # (no cursor left: nothing for the walk, the API or the reconciler to read as a next fire)
    cursor = {"due_at", "due_bucket", "next_run_at", "next_available_at", "planned_until"}
    assert cursor & set(item) == set()
    due = aws.dynamodb.scan(TableName=aws.settings.schedules_table, IndexName=DUE_INDEX)
    assert due["Count"] == 0
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_materializer_completes_a_one_shot_the_api_made_itself_and_releases_its_quota(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot due in 30 s: the API makes its occurrence itself, and the schedule
    # waits in the due index with no next fire, for the materializer to complete it
    sid, at = _one_shot_in(aws, clock, 30)
    waiting = current(aws, sid)
    assert instants(aws, sid) == [at]
    assert waiting.get("next_run_at") is None
    assert waiting["state"] == ScheduleState.ACTIVE
    assert _usage(alice) == 1
    # WHEN the walk reaches the minute it waits in
    clock.now = waiting["next_available_at"]
    report = tick(aws, clock, sid)
    # THEN it is COMPLETED, its occurrence not made again, and its slot is given back
    assert (report.completed, report.occurrences, report.conflicts) == (1, 0, 0)
    assert instants(aws, sid) == [at]
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == 0


def test_materializer_reports_the_schedules_of_every_bucket_it_walked(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN one-shots in one shard due in two consecutive minutes an hour ahead (made
    # alternately in the two minutes until one shard has both)
    minute = int(clock.now) // 60 * 60 + 3600
    by_shard: dict[int, dict[int, list[str]]] = {}
    while not any(len(minutes) == 2 for minutes in by_shard.values()):
        at = minute + 60 * (sum(len(v) for m in by_shard.values() for v in m.values()) % 2)
        sid = make(aws, spec={"kind": "at", "at": utc_text(at)})
        by_shard.setdefault(shard(aws, sid), {}).setdefault(at, []).append(sid)
    both = next(minutes for minutes in by_shard.values() if len(minutes) == 2)
    ids = [sid for group in both.values() for sid in group]
    # WHEN one walk covers both minutes
    clock.now = minute - 60
    report = tick(aws, clock, ids[0])
    # THEN its report counts the schedules of both buckets, not only the last one's
    assert report.buckets >= 2
    assert report.schedules == report.completed == len(ids)


@pytest.mark.parametrize("limit", [5, 6, 7, 8])
def test_materializer_counts_the_fence_and_every_tenants_tally_within_the_action_limit(
    alice: Api, bob: Api, aws: Services, clock: Clock, limit: int
):
    # GIVEN one-shots of two tenants due in one minute of one shard an hour ahead (made for
    # each in turn until one shard has two of each): each completion gives its tenant's
    # quota back through a tally, one per tenant a transaction, besides the fence
    at = int(clock.now) // 60 * 60 + 3600
    by_shard: dict[int, dict[str, list[str]]] = {}
    while not any(min(len(v) for v in t.values()) >= 2 for t in by_shard.values() if len(t) == 2):
        tenant = ("alice", "bob")[sum(len(v) for t in by_shard.values() for v in t.values()) % 2]
        sid = make(aws, tenant, spec={"kind": "at", "at": utc_text(at)})
        by_shard.setdefault(shard(aws, sid), {}).setdefault(tenant, []).append(sid)
    number = next(n for n, t in by_shard.items() if len(t) == 2 and min(map(len, t.values())) >= 2)
    ids = [sid for group in by_shard[number].values() for sid in group]
    usage = ("schedule_count", "strict_fires_per_minute_peak")  # (all fire in one minute)
    before = {
        t: [api.get("/v1/tenant").body[u] for u in usage]
        for t, api in (("alice", alice), ("bob", bob))
    }
    # WHEN one walk completes them, DynamoDB's limit on a transaction's actions (100) here
    # ``limit``
    sizes = CountedWrites(aws.dynamodb)
    clock.now = at - 60
    report = Materializer(
        dataclasses.replace(aws, dynamodb=sizes), "m1", max_actions=limit
    ).run_shard(int(clock.now), number)
    # THEN no transaction holds more actions than the limit, and every one-shot fired once,
    # completed, and gave its tenant's slot and its minute's strict fire back
    assert sizes.sizes
    assert max(sizes.sizes) <= limit
    assert report.completed == len(ids)
    assert all(instants(aws, sid) == [at] for sid in ids)
    for tenant, api in (("alice", alice), ("bob", bob)):
        completed = len(by_shard[number][tenant])
        after = [api.get("/v1/tenant").body[u] for u in usage]
        assert after == [n - completed for n in before[tenant]]


def test_materializer_goes_on_from_a_cursor_written_before_planned_until_existed(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN an hourly schedule (misfires SKIPped) whose first fire was made, and whose
    # CURRENT item then lost planned_until, as one written before the attribute existed
    sid = make(aws, spec=cron_spec("0 * * * *"), misfire={"action": "SKIP"})
    first = current(aws, sid)["next_run_at"]
    clock.now = first - 120
    tick(aws, clock, sid)
    assert current(aws, sid)["next_run_at"] == first + 3600
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=to_dynamo(current_key(sid)),
        UpdateExpression="REMOVE planned_until",
    )
    # WHEN the next fire comes within the lookahead
    clock.now = first + 3600 - 120
    report = tick(aws, clock, sid)
    # THEN the legacy cursor means "every fire before next_run_at is handled": the next fire
    # is made, the first is neither made again nor judged missed, and the cursor moves on
    assert instants(aws, sid) == [first, first + 3600]
    assert (report.occurrences, report.missed, report.conflicts) == (1, 0, 0)
    after = current(aws, sid)
    assert after["next_run_at"] == first + 7200
    assert after["planned_until"] >= first + 3600


def test_materializer_catchup_larger_than_one_step_fires_all_kept_at_one_pace(
    alice: Api, aws: Services, clock: Clock, monkeypatch: pytest.MonkeyPatch
):
    # GIVEN a minutely CATCHUP schedule keeping 50 late fires, and an hour without ticks
    # (more kept fires than one transaction step holds)
    misfire = {"action": "CATCHUP", "max_lateness_seconds": 60, "catchup_limit": 50}
    sid = make(aws, spec=cron_spec("* * * * *"), misfire=misfire)
    cursor = current(aws, sid)["next_run_at"]
    before = len(instants(aws, sid))
    clock.now = cursor + 3600
    commit = Transactions.commit
    puts: list[int] = []

    def counting(self: Transactions, actions: list[tuple[Label, dict[str, Any]]]) -> None:
        puts.append(sum("Put" in action and label == Label.STEP for label, action in actions))
        commit(self, actions)

    monkeypatch.setattr(Transactions, "commit", counting)
    # WHEN one tick runs
    report = tick(aws, clock, sid)
    # THEN it terminates with the 50 latest late fires, paced evenly from now (the
    # compressed pace keeps the last within SQS's delay limit), the rest counted MISSED,
    # in steps of at most STEP_LIMIT occurrences
    assert max(puts) == STEP_LIMIT
    now = int(clock.now)
    late = sorted(
        (o for o in occurrences(aws, sid)[before:] if o["scheduled_for"] < now - 60),
        key=lambda o: o["scheduled_for"],
    )
    assert len(late) == 50
    assert report.missed == 60 - 1 - 50
    offsets = [o["available_at"] - now for o in late]
    assert offsets == sorted(offsets)
    assert len({b - a for a, b in itertools.pairwise(offsets)}) == 1
    assert offsets[-1] <= 900


def test_materializer_fault_hook_drops_exactly_the_chosen_instant_and_moves_on(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two minutely schedules, and the fault layer's hook set to drop one instant of
    # one of them (the silent loss the reconciler must find, in the simulations)
    a, b = (make(aws, spec=cron_spec("* * * * *")) for _ in range(2))
    first = current(aws, a)["next_run_at"]
    clock.now = first - 120
    lost = first + 60
    # WHEN each one's shard is walked with that hook
    for sid in (a, b):
        tick(aws, clock, sid, skip=lambda s, t: s == a and t == lost)
    # THEN only that instant of that schedule is missing, and both cursors moved past it
    made_a, made_b = instants(aws, a), instants(aws, b)
    assert lost not in made_a
    assert lost in made_b
    assert set(made_b) - set(made_a) == {lost}
    assert current(aws, a)["next_run_at"] == current(aws, b)["next_run_at"] > lost


def test_materializer_skips_an_occurrence_that_already_exists_instead_of_stalling(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule whose next fire was already written (e.g. by a repair)
    sid = make(aws, spec=cron_spec("* * * * *"))
    item = current(aws, sid)
    stored = aws.schedules.current(sid)
    assert stored is not None
    from punctual.domain.planning import new_occurrence

    ahead = new_occurrence(stored.schedule, item["next_run_at"], 86400)
    aws.dynamodb.put_item(**aws.occurrences.put_new_action(ahead, {})["Put"])
    # WHEN the materializer ticks once that fire is within its lookahead
    clock.now = item["next_run_at"] - 120
    report = tick(aws, clock, sid)
    # THEN the shard is not stalled: the cursor moved past it and no duplicate exists
    assert report.watermark is not None
    assert current(aws, sid)["next_run_at"] > item["next_run_at"]
    fires = instants(aws, sid)
    assert len(fires) == len(set(fires))
    assert item["next_run_at"] in fires


def test_materializer_missed_summary_survives_an_update(alice: Api, aws: Services, clock: Clock):
    # GIVEN an outage recorded as MISSED on the schedule
    sid, _, _ = _outage(aws, clock, {"action": "SKIP", "max_lateness_seconds": 60})
    assert current(aws, sid)["missed_total"] == 9
    # WHEN the schedule is paused (a new version)
    ControlPlane(aws).pause("alice", sid)
    # THEN the MISSED summary is still there
    assert current(aws, sid)["missed_total"] == 9


def test_api_shows_the_tenant_its_missed_fires_on_the_schedule_and_in_the_listing(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely SKIP schedule whose ten-minute outage recorded 9 fires MISSED
    sid, before, _ = _outage(aws, clock, {"action": "SKIP", "max_lateness_seconds": 60})
    made = set(instants(aws, sid))
    schedule = schedule_from_item(current(aws, sid))
    skipped = [
        f for f in schedule.rule().fires(schedule.fires_after, int(clock.now)) if f not in made
    ]
    assert len(skipped) == 9
    first, last = utc_text(skipped[0]), utc_text(skipped[-1])
    # WHEN the tenant reads the schedule
    body = alice.get(f"/v1/schedules/{sid}").body["schedule"]
    # THEN it sees every missed fire: the total and the episode from the first to the last
    assert body["missed_total"] == 9
    assert body["missed"] == [{"version": 1, "first": first, "last": last, "count": 9}]
    # AND the occurrence listing names the episode where the occurrences are missing,
    listing = alice.get(f"/v1/schedules/{sid}/occurrences", **{"from": last, "to": last})
    assert listing.body == {"occurrences": [], "missed": body["missed"], "next_token": None}
    # but not for a window it does not overlap (the fires made before the outage)
    early = alice.get(
        f"/v1/schedules/{sid}/occurrences", to=utc_text(skipped[0] - 1), limit=100
    ).body
    assert early["missed"] == []
    assert len(early["occurrences"]) == before
    # AND a later version still shows what happened to the earlier one
    alice.post(f"/v1/schedules/{sid}/pause")
    paused = alice.get(f"/v1/schedules/{sid}").body["schedule"]
    assert (paused["version"], paused["missed"]) == (2, body["missed"])


# --- flexible windows: lateness is judged by availability (issue 15, defect 1) ------------


@pytest.mark.parametrize("action", ["SKIP", "FIRE_ONCE", "CATCHUP"])
def test_materializer_healthy_ticks_never_judge_a_flexible_fire_late(
    alice: Api, aws: Services, clock: Clock, action: str
):
    # GIVEN a minutely flexible schedule whose window (900 s) is far wider than the
    # lookahead plus max_lateness (180 + 300 s): a later fire is often due before an
    # earlier one
    misfire: dict[str, Any] = {"action": action, "max_lateness_seconds": 300}
    sid = make(
        aws,
        spec={"kind": "rate", "expression": "rate(1 minute)"},
        flexible_window_seconds=900,
        misfire=misfire,
    )
    schedule = schedule_from_item(current(aws, sid))
    lookahead = aws.settings.lookahead_seconds
    # WHEN the materializer ticks every minute for an hour, as it does when healthy
    for _ in range(60):
        clock.advance(60)
        tick(aws, clock, sid, holder=f"m{clock.now}")
        # THEN after each tick every fire due (available) within the lookahead exists, so
        # none ever waits past its time
        due = [
            f
            for f in schedule.rule().fires(schedule.fires_after, int(clock.now) + lookahead)
            if available_at(occurrence_id(sid, 1, f), f, 900) <= clock.now + lookahead
        ]
        assert set(due) <= set(instants(aws, sid)), clock.now
    # AND nothing was judged a misfire: none MISSED, none released early at "now"
    assert "missed_total" not in current(aws, sid)
    for o in occurrences(aws, sid):
        assert o["available_at"] == available_at(o["occurrence_id"], o["scheduled_for"], 900)


def test_materializer_flexible_outage_releases_by_availability_and_keeps_the_rest(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely flexible FIRE_ONCE schedule (window 600 s) and a 30-minute outage
    misfire = {"action": "FIRE_ONCE", "max_lateness_seconds": 120}
    sid = make(
        aws,
        spec={"kind": "rate", "expression": "rate(1 minute)"},
        flexible_window_seconds=600,
        misfire=misfire,
    )
    made_before = set(instants(aws, sid))
    clock.advance(1800)
    now = int(clock.now)
    # WHEN one tick runs
    report = tick(aws, clock, sid)
    # THEN exactly one late fire (the latest to have become available before now - 120 s)
    # is released at now; the fires whose availability is within max_lateness keep their
    # own jittered time; every other unmade fire due before now - 120 s is MISSED
    schedule = schedule_from_item(current(aws, sid))
    made = {o["scheduled_for"]: o for o in occurrences(aws, sid)}
    late = [
        f
        for f in schedule.rule().fires(schedule.fires_after, now)
        if f not in made_before and available_at(occurrence_id(sid, 1, f), f, 600) < now - 120
    ]
    released = [f for f, o in made.items() if o["available_at"] == now and f in late]
    assert len(released) == 1
    # (fires due at the same second are ordered by scheduled time: the later one is kept)
    assert released[0] == max(
        late, key=lambda f: (available_at(occurrence_id(sid, 1, f), f, 600), f)
    )
    assert report.missed == len(late) - 1
    assert current(aws, sid)["missed_total"] == len(late) - 1
    for f, o in made.items():
        if f not in late:
            assert o["available_at"] == available_at(o["occurrence_id"], f, 600)


# --- short, renewed leases (issue 15, defect 7) --------------------------------------------


def test_materializer_killed_holder_blocks_its_shard_for_seconds_not_minutes(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a holder killed mid-walk (its lease is left to expire)
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 120
    with pytest.raises(Crash):
        tick(aws, clock, sid, holder="m1", crash=crash_at("before_commit"))
    # WHEN another holder tries 21 s later
    clock.advance(21)
    report = tick(aws, clock, sid, holder="m2")
    # THEN it takes the shard over and does the work
    assert LEASE_SECONDS <= 20
    assert report.claimed
    assert report.occurrences == 1


def test_materializer_renews_its_lease_during_a_long_walk(alice: Api, aws: Services, clock: Clock):
    # GIVEN a walk whose transactions take long (the clock moves 10 s per commit)
    same, _ = _one_bucket(aws, clock, count=3)
    leases = LeaseStore(aws.dynamodb, aws.settings.leases_table)
    rival: list[Any] = []

    def slow(point: str) -> None:
        if point == "before_commit":
            clock.advance(10)
            # AND a rival tries to take the shard over at every commit
            rival.append(
                leases.claim(shard(aws, same[0]), "m2", now=int(clock.now), ttl=20, start_at=0)
            )

    # WHEN the walk goes on for longer than one lease (one transaction per schedule)
    report = Materializer(aws, "m1", max_actions=3, crash=slow).run_shard(
        int(clock.now), shard(aws, same[0])
    )
    # THEN the holder kept renewing: the rival never got it, and every step committed
    assert len(rival) >= 3
    assert rival == [None] * len(rival)
    assert not report.lease_lost
    assert report.occurrences == 3


# --- a change overtaken by the walk (issue 15, defect 2) ------------------------------------


def test_api_change_whose_commit_lands_after_the_walk_still_fires(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a create whose commit is held up (throttle retries, a slow call): before it
    # lands, the materializer walks the schedule's shard past the bucket its cursor goes to
    faults = Faults(FaultPlan.none(), clock)
    slow = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    walked: list[int] = []

    def walk_first(_: str, request: dict[str, Any]) -> None:
        if walked:
            return
        put = next(a["Put"]["Item"] for a in request["TransactItems"] if "Put" in a)
        number = shard_of(put["schedule_id"]["S"], aws.settings.shard_count)
        walked.append(number)
        Materializer(aws, "m0").run_shard(int(clock.now) + 180, number)

    faults.before["transact_write_items"] = walk_first
    definition = ScheduleDefinition.model_validate(
        {"target": "default", "spec": cron_spec("* * * * *")}
    )
    sid = ControlPlane(slow).create("alice", definition).schedule.schedule_id
    assert walked
    start = int(clock.now)
    # WHEN the materializer ticks every minute after that
    for _ in range(10):
        clock.advance(60)
        tick(aws, clock, sid, holder=f"m{clock.now}")
    # THEN every minute fires, with no gap: the cursor was never left behind the walk
    fired = instants(aws, sid)
    assert fired[0] == start - start % 60 + 60
    assert fired == list(range(fired[0], fired[-1] + 60, 60))
    assert fired[-1] >= clock.now


def test_schedule_made_before_its_shard_was_ever_walked_fires_when_the_materializer_comes_up(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a schedule created in a shard no materializer has claimed yet (a new deployment
    # whose ticker is down), every 15 minutes, catching up what it misses
    sid = make(
        aws,
        spec=cron_spec("*/15 * * * *"),
        misfire={"action": "CATCHUP", "max_lateness_seconds": 86400, "catchup_limit": 100},
    )
    number = shard(aws, sid)
    first = current(aws, sid)["next_run_at"]
    bucket = int(current(aws, sid)["due_at"])
    # THEN the create gave the shard a watermark before the schedule's bucket
    opened = LeaseStore(aws.dynamodb, aws.settings.leases_table).watermark(number)
    assert opened is not None
    assert opened < bucket
    # WHEN the materializer first runs three hours later (past its one-hour bootstrap)
    clock.now = first + 3 * 3600
    Materializer(aws, "m1").run_shard(int(clock.now), number)
    # THEN it walks from that watermark and makes every fire, none lost with the schedule
    # stranded in a bucket behind its first walk
    fired = instants(aws, sid)
    assert fired[0] == first
    assert fired == list(range(first, fired[-1] + 1, 900))
    assert fired[-1] >= clock.now - 900


def test_a_late_opener_of_a_shard_leaves_its_walk_and_its_holder_as_they_stand(
    aws: Services, clock: Clock
):
    # GIVEN a shard opened by one create, claimed by m1 and walked ten minutes on
    now = int(clock.now)
    aws.leases.open(5, now=now)
    lease = aws.leases.claim(5, "m1", now=now, ttl=LEASE_SECONDS, start_at=0)
    assert lease is not None
    walked = lease.watermark + 600
    assert aws.leases.advance(lease, walked, expires_at=now + LEASE_SECONDS)
    # WHEN another create, which found the shard unopened a moment before, opens it now
    aws.leases.open(5, now=now + 1)
    # THEN the walk stands where m1 left it (not an hour back, re-walked), and m1 still
    # holds the lease under its fence: m2 cannot claim it, m1 walks on
    assert aws.leases.watermark(5) == walked
    assert aws.leases.claim(5, "m2", now=now + 1, ttl=LEASE_SECONDS, start_at=0) is None
    assert aws.leases.advance(lease, walked + 60, expires_at=now + LEASE_SECONDS)


def _walk_past_unseen(aws: Services, clock: Clock, ids: list[str], until: int) -> None:
    """The ids' shard walked up to ``until`` while their due-index entries were out of its
    sight (the index lagged past every margin), then put back: each cursor is left behind
    the walk, in a bucket no walk reads again."""

    def place(sid: str, bucket: str) -> None:
        aws.dynamodb.update_item(
            TableName=aws.settings.schedules_table,
            Key=to_dynamo(current_key(sid)),
            UpdateExpression="SET due_bucket = :b",
            ExpressionAttributeValues={":b": {"S": bucket}},
        )

    hidden = {sid: current(aws, sid)["due_bucket"] for sid in ids}
    for sid in ids:
        place(sid, "elsewhere")
    clock.now = until
    Materializer(aws, "m").run_shard(int(clock.now), shard(aws, ids[0]))
    for sid, bucket in hidden.items():
        place(sid, bucket)


@pytest.mark.parametrize("window", ["hour", "from mid-minute", "two hours"])
def test_reconciler_moves_a_cursor_left_behind_the_walk_and_it_fires(
    alice: Api, aws: Services, clock: Clock, window: str
):
    # GIVEN a one-shot whose due-index entry the walk passed without seeing it (the index
    # lagged past every margin): it would never be completed, and would hold its quota
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()})
    number = shard(aws, sid)
    stash = dict(current(aws, sid))
    _walk_past_unseen(aws, clock, [sid], until=at + 120)
    assert instants(aws, sid) == []
    assert alice.get("/v1/tenant").body["schedule_count"] == 1
    # WHEN the reconciler checks the hour that holds its fire; or an hour from the middle of
    # the fire's minute (the bucket holding the window's start is read too); or two hours
    # whose 61st minute is the fire's (every minute's bucket is read)
    clock.now = at - at % 3600 + 2 * 3600 + 60
    first, hours = {
        "hour": (at - at % 3600, 1),
        "from mid-minute": (at - at % 60 + 30, 1),
        "two hours": (at - at % 60 - 3600, 2),
    }[window]
    walked = aws.leases.watermark(number)
    assert walked is not None
    [result] = Reconciler(aws).run([number], first, first + hours * 3600)
    # THEN it reports the fire MISSING, moves the schedule two minutes ahead of the walk or
    # of now (the walk reads it at its next tick), and the next tick makes its occurrence
    # (late, under its FIRE_ONCE policy) and completes it
    assert result.moved == [sid]
    assert result.report.cursors_moved == 1
    ahead = max(walked, int(clock.now) // 60 * 60) + 120
    assert current(aws, sid)["due_bucket"] == due_bucket(ahead, number)
    tick(aws, clock, sid)
    assert instants(aws, sid) == [stash["next_run_at"]]
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    assert alice.get("/v1/tenant").body["schedule_count"] == 0


def test_a_check_only_reconcile_leaves_a_cursor_left_behind_the_walk_where_it_is(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot whose due-index entry the walk passed without seeing it
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": utc_text(at)})
    _walk_past_unseen(aws, clock, [sid], until=at + 120)
    stuck = current(aws, sid)["due_bucket"]
    # WHEN a check-only reconcile (repair off) checks the hour that holds its fire
    hour = at - at % 3600
    clock.now = hour + 2 * 3600 + 60
    [result] = Reconciler(aws, repair=False).run([shard(aws, sid)], hour, hour + 3600)
    # THEN it reports the fire MISSING and writes nothing: the cursor stays where it is
    assert result.report.counts[Finding.MISSING] == 1
    assert result.moved == []
    assert result.report.cursors_moved == 0
    assert current(aws, sid)["due_bucket"] == stuck


@pytest.mark.parametrize("first", ["moved since", "another region's", "refused"])
def test_reconciler_moving_cursors_left_behind_goes_on_past_one_it_must_leave(
    alice: Api, aws: Services, clock: Clock, first: str
):
    # GIVEN two one-shots of one shard due in one minute an hour ahead, a second apart (made
    # until one shard has two), both left behind the walk; the index lists first one that the
    # reconciler must not move: one whose time its tenant changed a moment ago, which an index
    # lagging a minute still lists in the old bucket; one homed in another region (taken
    # over); one its tenant pauses between the reconciler's read and its move
    at = int(clock.now) // 60 * 60 + 3600
    _, [left, stuck] = crowded_bucket(
        aws, lambda made: {"kind": "at", "at": utc_text(at + made)}, 2
    )
    assert current(aws, left)["next_run_at"] < current(aws, stuck)["next_run_at"]
    _walk_past_unseen(aws, clock, [left, stuck], until=at + 120)
    hour = at - at % 3600
    clock.now = hour + 2 * 3600 + 60
    faults = Faults(FaultPlan(index_lag=1.0, index_lag_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    if first == "moved since":
        later = {"spec": {"kind": "at", "at": utc_text(int(clock.now) + 3600)}}
        ControlPlane(lagging).update("alice", left, if_match=1, changes=later)
    elif first == "another region's":
        aws.dynamodb.update_item(
            TableName=aws.settings.schedules_table,
            Key=to_dynamo(current_key(left)),
            UpdateExpression="SET home_region = :west",
            ExpressionAttributeValues={":west": {"S": "us-west-2"}},
        )
    else:
        moving = to_dynamo(current_key(left))

        def pause_first(_: str, request: dict[str, Any]) -> None:
            updates = [a["Update"]["Key"] for a in request["TransactItems"] if "Update" in a]
            if moving in updates and current(aws, left)["state"] == ScheduleState.ACTIVE:
                ControlPlane(aws).pause("alice", left)

        faults.before["transact_write_items"] = pause_first
    number = shard(aws, left)
    walked = aws.leases.watermark(number)
    assert walked is not None
    ahead = due_bucket(max(walked, int(clock.now) // 60 * 60) + 120, number)
    # WHEN the reconciler checks the hour that holds their fires
    [result] = Reconciler(lagging).run([number], hour, hour + 3600)
    # THEN it leaves that one where it is and still moves the other ahead of the walk: one it
    # must leave is no reason to stop reading the bucket
    assert result.moved == [stuck]
    assert current(aws, stuck)["due_bucket"] == ahead
    assert current(aws, left).get("due_bucket") != ahead


def test_reconciler_right_after_a_catch_up_on_a_lagging_replica_still_moves_a_stranded_cursor(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot whose due-index entry a catch-up walk passed without seeing it, the
    # walk done half a minute before the reconciler runs, on a replica a minute behind
    replica = dataclasses.replace(
        aws,
        dynamodb=FaultyDynamoDB(
            aws.dynamodb, Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
        ),
    )
    at = int(clock.now) + 3600
    sid = make(aws, spec={"kind": "at", "at": datetime.fromtimestamp(at).astimezone().isoformat()})
    number = shard(aws, sid)
    Materializer(replica, "m").run_shard(int(clock.now), number)  # the walk behind its bucket
    hidden = current(aws, sid)["due_bucket"]
    key = to_dynamo({"schedule_id": sid, "sk": "CURRENT"})
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=key,
        UpdateExpression="SET due_bucket = :elsewhere",
        ExpressionAttributeValues={":elsewhere": {"S": "elsewhere"}},
    )
    reconcile_at = at - at % 3600 + 2 * 3600 + 60
    clock.now = reconcile_at - 30
    Materializer(replica, "m").run_shard(int(clock.now), number)  # catches up past it, unseen
    aws.dynamodb.update_item(
        TableName=aws.settings.schedules_table,
        Key=key,
        UpdateExpression="SET due_bucket = :b",
        ExpressionAttributeValues={":b": {"S": hidden}},
    )
    # WHEN the reconciler checks the hour that holds its fire, through that replica
    clock.now = reconcile_at
    window = (at - at % 3600, at - at % 3600 + 3600)
    [result] = Reconciler(replica).run([number], *window)
    # THEN it reads where the walk stands now (strongly consistent: the watermark of a
    # minute ago is behind the bucket, which it would not look in, and no later run looks
    # at this hour's buckets again) and moves the schedule ahead of the walk
    assert result.moved == [sid]


# --- quota given back exactly once (issue 15, defect 8) -------------------------------------


def _one_shot_in(aws: Services, clock: Clock, seconds: int) -> tuple[str, int]:
    at = int(clock.now) + seconds
    when = datetime.fromtimestamp(at).astimezone().isoformat()
    return make(aws, spec={"kind": "at", "at": when}), at


def _usage(alice: Api) -> int:
    count: int = alice.get("/v1/tenant").body["schedule_count"]
    return count


def test_update_racing_the_completion_keeps_the_quota_count_exact(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, and an update (moving it a day later) read while it
    # was ACTIVE: before the update commits, the materializer fires and completes it
    sid, at = _one_shot_in(aws, clock, 3600)
    clock.now = at - 60
    faults = Faults(FaultPlan.none(), clock)
    racing = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    completed: list[bool] = []

    def complete_first(_: str, request: dict[str, Any]) -> None:
        if not completed:
            completed.append(True)
            tick(aws, clock, sid)
            assert current(aws, sid)["state"] == ScheduleState.COMPLETED
            assert _usage(alice) == 0

    faults.before["transact_write_items"] = complete_first
    later = datetime.fromtimestamp(at + 86400).astimezone().isoformat()
    # WHEN the update lands
    saved = ControlPlane(racing).update(
        "alice", sid, if_match=1, changes={"spec": {"kind": "at", "at": later}}
    )
    # THEN it was decided again from the completed schedule: live again, counted again
    assert saved.schedule.state is ScheduleState.ACTIVE
    assert saved.schedule.version == 2
    assert _usage(alice) == 1


def test_materializer_crash_before_the_hand_over_gives_the_quota_back_exactly_once(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN two one-shots completed by a walk that is killed right after committing, before
    # it hands the released quota over to the tenant
    first, at = _one_shot_in(aws, clock, 3600)
    _one_shot_in(aws, clock, 3600)
    assert _usage(alice) == 2
    clock.now = at - 60
    shards = sorted({shard(aws, s) for s in _schedule_ids(aws)})
    for number in shards:
        with pytest.raises(Crash):
            Materializer(aws, "m1", crash=crash_at("before_hand_over")).run_shard(
                int(clock.now), number
            )
    assert current(aws, first)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == 2  # released, waiting on the shard
    # WHEN the next ticks run (after the lease expired), twice
    for _ in range(2):
        clock.advance(LEASE_SECONDS + 1)
        for number in shards:
            Materializer(aws, "m2").run_shard(int(clock.now), number)
    # THEN the tenant got both back, once
    assert _usage(alice) == 0


def test_materializer_hands_each_release_over_once_across_walks(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a cron schedule that stays, and two one-shots an hour apart in one shard
    make(aws, spec=cron_spec("0 0 1 1 *"))
    first, at = _one_shot_in(aws, clock, 3600)
    while True:
        second, later = _one_shot_in(aws, clock, 7200)
        if shard(aws, second) == shard(aws, first):
            break
    made = _usage(alice)
    # WHEN one walk completes the first and hands its release over, and a later walk
    # completes the second
    for instant in (at, later):
        clock.now = instant - 60
        tick(aws, clock, first, holder=f"m{instant}")
    # THEN the tenant got exactly those two back: the first walk emptied the shard's tally,
    # so the second did not hand the first's release over again
    assert current(aws, second)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == made - 2


def test_materializer_hands_a_release_over_whole_on_a_lagging_replica(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, and a materializer whose eventually consistent reads
    # are served a minute stale
    sid, at = _one_shot_in(aws, clock, 3600)
    made = _usage(alice)
    faults = Faults(FaultPlan(stale=1.0, stale_seconds=60), clock)
    lagging = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    # WHEN one walk completes it and hands the release over (its tally written a moment
    # before, in the walk's own transaction)
    clock.now = at - 60
    Materializer(lagging, "m1").run_shard(int(clock.now), shard(aws, sid))
    # THEN the tenant got its schedule back at once: the tally was read whole (a stale read
    # would hand nothing over and leave the release behind, the tenant no longer pending)
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    assert _usage(alice) == made - 1


def test_materializer_that_loses_its_lease_before_moving_the_watermark_stops_walking(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a walk over several buckets that stalls past its lease before moving the
    # watermark over its first one, while m2 takes the shard over
    sid = make(aws, spec=cron_spec("*/5 * * * *"))
    clock.now = current(aws, sid)["next_run_at"] - 300
    number = shard(aws, sid)

    def taken_over(point: str) -> None:
        if point == "before_watermark" and not taken_over.done:  # type: ignore[attr-defined]
            taken_over.done = True  # type: ignore[attr-defined]
            clock.advance(LEASE_SECONDS + 1)
            taken = aws.leases.claim(number, "m2", now=int(clock.now), ttl=60, start_at=0)
            assert taken is not None

    taken_over.done = False  # type: ignore[attr-defined]
    before = aws.leases.watermark(number)
    # WHEN the stalled walk goes on
    report = tick(aws, clock, sid, crash=taken_over)
    # THEN its watermark move is refused: it says it lost the lease and walks no further
    # bucket (m2's walk owns them), and the watermark is not its to move
    assert report.lease_lost
    assert report.buckets == 0
    assert aws.leases.watermark(number) == before


def test_materializer_that_loses_its_lease_before_the_hand_over_leaves_it_to_the_next(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot an hour ahead, and a walk that stalls after completing it, past its
    # lease, while another materializer takes the shard over
    sid, at = _one_shot_in(aws, clock, 3600)
    clock.now = at - 60

    def taken_over(point: str) -> None:
        if point == "before_hand_over":
            clock.advance(LEASE_SECONDS + 1)
            number = shard(aws, sid)
            taken = aws.leases.claim(
                number, "m2", now=int(clock.now), ttl=LEASE_SECONDS, start_at=0
            )
            assert taken is not None

    # WHEN the stalled walk goes on to hand the released quota over
    report = tick(aws, clock, sid, crash=taken_over)
    # THEN it is fenced off and says it lost the lease; the release waits on the shard, and
    # the next walk hands it over
    assert report.lease_lost
    assert _usage(alice) == 1
    clock.advance(LEASE_SECONDS + 1)
    assert tick(aws, clock, sid, holder="m3").claimed
    assert _usage(alice) == 0


@pytest.mark.parametrize("elapsed", [RENEW_AFTER - 1, RENEW_AFTER])
def test_materializer_renews_its_lease_during_a_long_bucket(
    alice: Api, aws: Services, clock: Clock, elapsed: int
):
    # GIVEN two schedules due in one bucket of one shard, stepped one transaction each
    _, [a, *_] = crowded_bucket(aws, cron_spec("*/5 * * * *"), 2)
    clock.now = current(aws, a)["next_run_at"] - 120
    number = shard(aws, a)
    expiries: list[tuple[int, int]] = []

    def slow(point: str) -> None:
        if point == "before_commit":
            found = aws.dynamodb.get_item(
                TableName=aws.settings.leases_table, Key=shard_key(number), ConsistentRead=True
            )["Item"]
            expiries.append((int(clock.now), int(found["expires_at"]["N"])))
            clock.advance(elapsed)

    # WHEN each of the walk's commits takes just under, or exactly, a third of the lease
    Materializer(aws, "m1", crash=slow, max_actions=3).run_shard(int(clock.now), number)
    # THEN the lease is renewed (to a whole lease from then) once a third of it has passed
    # since the last renewal, and not before (a write per commit would be wasted)
    assert len(expiries) >= 2
    (_, first), (now, second) = expiries[:2]
    assert second == (now + LEASE_SECONDS if elapsed >= RENEW_AFTER else first)


def _schedule_ids(aws: Services) -> list[str]:
    return [
        s.schedule_id
        for s in ControlPlane(aws).list_schedules("alice", state=None, limit=100, token=None)[0]
    ]


def test_materializer_a_step_refused_by_its_cursor_and_a_put_is_reread_at_once(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule about to be stepped (several fires a step), its second
    # fire's occurrence made already (a repair)
    sid = make(aws, spec=cron_spec("* * * * *"))
    fire = current(aws, sid)["next_run_at"]
    clock.now = fire - 120
    made = occurrence_id(sid, 1, fire + 60)
    aws.dynamodb.put_item(
        TableName=aws.settings.occurrences_table,
        Item=to_dynamo(
            occurrence_key(made)
            | {
                "occurrence_id": made,
                "tenant_id": "alice",
                "schedule_version": 1,
                "scheduled_for": fire + 60,
                "available_at": fire + 60,
                "target": "default",
                "state": "SUCCEEDED",
            }
        ),
    )
    counting = CountedWrites(aws.dynamodb)
    plane = ControlPlane(aws)

    def cancel_first(point: str) -> None:
        if point == "before_commit" and not cancel_first.done:  # type: ignore[attr-defined]
            cancel_first.done = True  # type: ignore[attr-defined]
            plane.cancel("alice", sid)

    cancel_first.done = False  # type: ignore[attr-defined]
    # WHEN it is canceled between the walk's read and its commit: the transaction is
    # refused by the step's cursor and by the existing occurrence's put
    report = Materializer(
        dataclasses.replace(aws, dynamodb=counting), "m1", crash=cancel_first
    ).run_shard(int(clock.now), shard(aws, sid))
    # THEN the step is re-read at once (a conflict), not tried again without the refused
    # put (which the cursor would refuse again): one transaction, nothing of it written
    assert report.conflicts == 1
    assert counting.transactions == 1
    assert all(o["state"] != OccurrenceState.SCHEDULED for o in occurrences(aws, sid))


def test_materializer_step_of_an_old_version_is_refused_when_neither_version_has_a_cursor(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a one-shot due in 30 s: the API made its occurrence, and it waits in the due
    # index with no next fire, its strict fire counted in its minute of the hour
    sid, at = _one_shot_in(aws, clock, 30)
    waiting = current(aws, sid)
    assert waiting.get("next_run_at") is None
    assert aws.tenants.get("alice").minute_load[at % 3600 // 60] == 1
    clock.now = waiting["next_available_at"]
    moved = int(clock.now) + 90  # six minutes after the first: another minute of the hour
    plane = ControlPlane(aws)
    updated: list[int] = []

    def update_first(point: str) -> None:
        if point == "before_commit" and not updated:
            later = {"kind": "at", "at": utc_text(moved)}
            saved = plane.update("alice", sid, if_match=1, changes={"spec": later})
            updated.append(saved.schedule.version)

    # WHEN the walk that read version 1 (to complete it) commits after an update moved the
    # one-shot to that minute: version 2 made by the API too, with no next fire either, so
    # the cursor condition (no next_run_at) holds for both
    report = tick(aws, clock, sid, crash=update_first)
    # THEN the version condition refuses the old step: version 2 is still ACTIVE, waiting
    # to be completed, and the usage moved with the update, to its new minute
    assert updated == [2]
    assert (report.conflicts, report.completed) == (1, 0)
    item = current(aws, sid)
    assert (item["version"], item["state"]) == (2, ScheduleState.ACTIVE)
    assert instants(aws, sid) == [at, moved]
    usage = aws.tenants.get("alice")
    assert usage.schedule_count == 1
    assert {m: n for m, n in enumerate(usage.minute_load) if n} == {moved % 3600 // 60: 1}
    # AND once the walk reaches version 2's minute it completes it, and every count of the
    # tenant's usage is back to zero (none left held, none below zero)
    clock.now = item["next_available_at"]
    assert tick(aws, clock, sid, holder="m2").completed == 1
    assert current(aws, sid)["state"] == ScheduleState.COMPLETED
    usage = aws.tenants.get("alice")
    assert usage.schedule_count == 0
    assert usage.minute_load == [0] * 60
