"""The materializer's leases, fencing and crash points, on moto with the injected clock. Each
due fire is made once and the cursor moves, a second holder cannot claim a live lease, and a
stale holder is fenced after a takeover whatever its clock says. Conflicted transactions are
retried, and a rerun after a crash at any point yields every occurrence once. A walk cut
short by an error, a kill or the end of the Lambda's time leaves its shard for the next tick,
and short, renewed leases keep a killed holder from blocking its shard for more than seconds."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from punctual.dal.common import from_dynamo, to_dynamo
from punctual.dal.leases import LeaseStore
from punctual.dal.tables import occurrence_key
from punctual.domain.ids import occurrence_id
from punctual.domain.occurrence import OccurrenceState
from punctual.pipeline.materializer import COMMIT_ATTEMPTS, LEASE_SECONDS, RETRY, Materializer
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.integration.conftest import Api, Clock
from tests.integration.helpers import cron_spec, make
from tests.integration.materializer.helpers import (
    Crash,
    crash_at,
    current,
    instants,
    occurrences,
    shard,
    tick,
)


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
