"""Backfill (POST /v1/schedules/{id}/backfill, issue 22): an occurrence for every fire of the
current version in a range that has none, never a second one for an instant that ran or will
run, nothing for the fires the materializer has still to make, paced from now, bounded in
count; a dry run makes nothing; the reconciler finds neither a gap nor a stray afterwards."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.tables import occurrence_key
from punctual.domain.findings import Finding
from punctual.domain.ids import backfill_tag, occurrence_id, occurrence_name
from punctual.pipeline.reconciler import Reconciler
from punctual.services import Services
from tests.faults import FaultPlan, Faults, FaultyDynamoDB
from tests.instants import epoch
from tests.integration.conftest import ALICE, Api, Clock, bootstrap
from tests.integration.helpers import (
    assert_error,
    create,
    cron,
    make,
    occurrence_items,
    overtaken_at_commit,
    patch,
    set_occurrence_state,
)
from tests.integration.reconciler.helpers import materialize_until, shards_of
from tests.integration.test_reconciler_races import lagging
from tests.integration.test_redrive import _window_of
from tests.integration.test_relay import messages

DAY = "2026-11-19"


def at(hhmm: str) -> int:
    return epoch(f"{DAY}T{hhmm}Z")


def iso(instant: int) -> str:
    return f"{DAY}T{(instant // 3600) % 24:02d}:{(instant // 60) % 60:02d}:00Z"


def backfill(api: Api, sid: str, since: int, until: int, **extra: Any) -> Any:
    return api.post(
        f"/v1/schedules/{sid}/backfill", {"from": iso(since), "to": iso(until), **extra}
    )


def occurrences(aws: Services, sid: str) -> dict[int, list[dict[str, Any]]]:
    """The schedule's occurrence items by instant."""
    found: dict[int, list[dict[str, Any]]] = {}
    for item in occurrence_items(aws, sid):
        found.setdefault(int(item["scheduled_for"]["N"]), []).append(item)
    return found


def running_since_0940(aws: Services, clock: Clock, *, lost: set[int]) -> str:
    """A */5 schedule made at 09:40, materialized up to 10:30 but for the ``lost`` instants
    (the materializer passed them with no record)."""
    clock.now = at("09:40")
    sid = make(aws, spec={"kind": "cron", "expression": "*/5 * * * *", "timezone": "UTC"})
    materialize_until(aws, clock, at("10:30"), shards_of(aws, [sid]), skip=lambda s, t: t in lost)
    return sid


def test_backfill_makes_only_the_fires_without_an_occurrence_and_a_dry_run_makes_none(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule made at 09:40 whose 10:15 instant was lost
    sid = running_since_0940(aws, clock, lost={at("10:15")})
    before = occurrences(aws, sid)
    clock.now = at("10:31")
    # WHEN its owner asks for a dry run of [09:00, 10:30)
    dry = backfill(alice, sid, at("09:00"), at("10:30"), dry_run=True)
    # THEN 18 fires: 9 with an occurrence, 9 to make (the 8 before it existed, and 10:15)
    assert dry.status == 200, dry.body
    assert {k: dry.body[k] for k in ("dry_run", "fires", "existing", "planned", "created")} == {
        "dry_run": True,
        "fires": 18,
        "existing": 9,
        "planned": 0,
        "created": 9,
    }
    shown = [o["scheduled_for"] for o in dry.body["occurrences"]]
    assert shown == [iso(t) for t in [*range(at("09:00"), at("09:40"), 300), at("10:15")]]
    # AND nothing was written
    assert occurrences(aws, sid) == before
    # WHEN it backfills for real
    done = backfill(alice, sid, at("09:00"), at("10:30"))
    assert done.status == 200, done.body
    assert (done.body["created"], done.body["existing"], done.body["dry_run"]) == (9, 9, False)
    # THEN every instant of the range has exactly one occurrence
    after = occurrences(aws, sid)
    assert {t: len(items) for t, items in after.items() if t < at("10:30")} == dict.fromkeys(
        range(at("09:00"), at("10:30"), 300), 1
    )
    # AND the lost fire got its own id (not manual: the reconciler's repair meets it), the
    # ones before the schedule existed the schedule's backfill ids (manual)
    [lost] = after[at("10:15")]
    assert lost["occurrence_id"]["S"] == occurrence_id(sid, 1, at("10:15"))
    tag = backfill_tag(sid)
    for instant in range(at("09:00"), at("09:40"), 300):
        [made] = after[instant]
        assert occurrence_name(made["occurrence_id"]["S"]) == (sid, 1, instant, tag)
    # AND they are receivable from now, one a second (the default catch-up pace), in order
    made_ids = {o["occurrence_id"] for o in done.body["occurrences"]}
    assert len(made_ids) == 9
    receivable = sorted(
        int(items[0]["available_at"]["N"])
        for items in after.values()
        if items[0]["occurrence_id"]["S"] in made_ids
    )
    assert receivable == list(range(at("10:31"), at("10:31") + 9))
    # AND they go by the catch-up lane (relayed apart from fires due now), the materializer's
    # by the on-time lane
    lanes = {i[0]["occurrence_id"]["S"]: i[0].get("lane", {}).get("S") for i in after.values()}
    assert {lanes[o] for o in made_ids} == {"CATCHUP"}
    assert {lane for o, lane in lanes.items() if o not in made_ids} == {None}
    listed = alice.get(f"/v1/schedules/{sid}/occurrences").body["occurrences"]
    assert sum(o["manual"] for o in listed) == 8
    # AND asking again makes nothing (a retry, an overlapping range)
    again = backfill(alice, sid, at("08:50"), at("10:30"))
    assert (again.body["created"], again.body["existing"]) == (2, 18)
    assert backfill(alice, sid, at("09:00"), at("10:30")).body["created"] == 0


def test_backfill_of_a_lost_fire_still_ahead_makes_it_at_its_own_time_on_time(
    aws: Services, clock: Clock
):
    # GIVEN a tenant allowed one catch-up fire a minute, a */5 schedule made at 09:40 and
    # materialized up to 10:30 with no record of 10:15 and of 10:25, and now is 10:21:
    # 10:25 is ahead, within what the materializer passed
    alice = bootstrap("alice", ALICE, catchup_per_minute=1)
    sid = running_since_0940(aws, clock, lost={at("10:15"), at("10:25")})
    clock.now = at("10:21")
    # WHEN [09:00, 10:30) is backfilled: 8 fires before the schedule existed, 10:15, 10:25
    answer = backfill(alice, sid, at("09:00"), at("10:30"))
    assert (answer.status, answer.body["created"]) == (200, 10), answer.body
    after = occurrences(aws, sid)
    [past], [ahead] = after[at("10:15")], after[at("10:25")]
    # THEN the past ones are paced from now (a minute apart), in the catch-up lane
    assert (int(past["available_at"]["N"]), past["lane"]) == (
        at("10:21") + 8 * 60,
        {"S": "CATCHUP"},
    )
    # AND the one ahead is receivable at its own time, neither early nor held back by the
    # pace (ninth in line, it would be paced to 10:30), in the on-time lane
    assert int(ahead["available_at"]["N"]) == at("10:25")
    assert "lane" not in ahead


def test_backfill_leaves_the_fires_the_materializer_has_not_reached_to_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the schedule planned up to a little after 10:30
    sid = running_since_0940(aws, clock, lost=set())
    clock.now = at("10:31")
    # WHEN the next hour is backfilled
    answer = backfill(alice, sid, at("10:30"), at("11:30"))
    # THEN the fires already made exist, the others are planned, and none is made
    body = answer.body
    assert answer.status == 200, body
    assert body["fires"] == 12
    assert body["created"] == 0
    assert body["existing"] == len([t for t in occurrences(aws, sid) if t >= at("10:30")])
    assert body["planned"] == 12 - body["existing"] > 0


def test_backfill_never_doubles_a_fire_of_an_earlier_version_and_remakes_a_missed_one(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN the schedule's fires from 09:40 run (SUCCEEDED), but 10:05's recorded MISSED,
    # then the schedule updated at 10:31 (version 2)
    sid = running_since_0940(aws, clock, lost=set())
    for instant in range(at("09:40"), at("10:30"), 300):
        state = "MISSED" if instant == at("10:05") else "SUCCEEDED"
        set_occurrence_state(aws, occurrence_id(sid, 1, instant), state)
    clock.now = at("10:31")
    assert patch(alice, sid, {"payload": {"v": 2}}, 1).status == 200
    # WHEN version 2 backfills [09:40, 10:30), which version 1 owned
    answer = backfill(alice, sid, at("09:40"), at("10:30"))
    # THEN only the MISSED instant is made again, under version 2 with its backfill id
    assert (answer.body["created"], answer.body["existing"]) == (1, 9), answer.body
    [made] = answer.body["occurrences"]
    assert occurrence_name(made["occurrence_id"]) == (sid, 2, at("10:05"), backfill_tag(sid))
    assert made["manual"] is True


def test_backfill_then_reconcile_finds_no_gap_and_no_stray(alice: Api, aws: Services, clock: Clock):
    # GIVEN a schedule whose 10:15 instant was lost, backfilled over the hour before
    sid = running_since_0940(aws, clock, lost={at("10:15")})
    clock.now = at("10:31")
    assert backfill(alice, sid, at("09:00"), at("10:30")).body["created"] == 9
    materialize_until(aws, clock, at("11:10"), shards_of(aws, [sid]))
    # WHEN the reconciler checks [09:00, 10:00) and [10:00, 11:00)
    clock.now = at("11:05")
    results = Reconciler(aws, repair=True).run(shards_of(aws, [sid]), at("09:00"), at("11:00"))
    # THEN nothing is missing (10:15 exists), nothing unexpected, nothing repaired again
    counts = results[0].report.counts
    assert counts.get(Finding.MISSING, 0) == 0
    assert counts.get(Finding.UNEXPECTED, 0) == 0
    assert results[0].fired == []
    assert len(occurrences(aws, sid)[at("10:15")]) == 1


def test_backfill_whose_commit_answer_was_lost_makes_nothing_twice_when_asked_again(
    alice: Api, aws: Services, clock: Clock
):
    from botocore.exceptions import ReadTimeoutError

    from punctual.control.plane import ControlPlane
    from punctual.domain.errors import Retryable

    # GIVEN a backfill whose transaction commits but whose answer is lost (a timeout)
    sid = running_since_0940(aws, clock, lost={at("10:15")})
    clock.now = at("10:31")
    faults = Faults(FaultPlan.none(), clock)
    lossy = dataclasses.replace(aws, dynamodb=FaultyDynamoDB(aws.dynamodb, faults))
    calls: list[int] = []

    def commit_then_time_out(_: str, request: dict[str, Any]) -> None:
        calls.append(len(request["TransactItems"]))
        if len(calls) == 1:
            aws.dynamodb.transact_write_items(**request)
            raise ReadTimeoutError(endpoint_url="https://injected.local")

    faults.before["transact_write_items"] = commit_then_time_out
    # WHEN the control plane backfills: the call fails, retryable (the API answers 503) ...
    with pytest.raises(Retryable):
        ControlPlane(lossy).backfill("alice", sid, at("09:00"), at("10:30"), dry_run=False)
    # ... and the client asks again
    again = ControlPlane(lossy).backfill("alice", sid, at("09:00"), at("10:30"), dry_run=False)
    # THEN the second finds them all made (the first's one transaction: the schedule's
    # check, the backfill's record, 9 occurrences), and each instant has one occurrence
    assert calls == [11]
    assert (len(again.made), again.existing) == (0, 18)
    assert {len(v) for t, v in occurrences(aws, sid).items() if t < at("10:30")} == {1}


def test_backfill_asked_again_a_moment_later_on_a_lagging_replica_makes_nothing_twice(
    alice: Api, aws: Services, clock: Clock
):
    from punctual.control.plane import ControlPlane

    # GIVEN a backfill of [09:00, 10:30) made through a replica a minute behind
    sid = running_since_0940(aws, clock, lost={at("10:15")})
    clock.now = at("10:31")
    replica = FaultyDynamoDB(aws.dynamodb, Faults(FaultPlan(stale=1.0, stale_seconds=60), clock))
    plane = ControlPlane(dataclasses.replace(aws, dynamodb=replica))
    first = plane.backfill("alice", sid, at("09:00"), at("10:30"), dry_run=False)
    assert len(first.made) == 9
    # WHEN the client asks again a second later
    clock.advance(1)
    again = plane.backfill("alice", sid, at("09:00"), at("10:30"), dry_run=False)
    # THEN it finds them all (strongly consistent: a stale read would not see the nine just
    # made) and makes nothing
    assert (len(again.made), again.existing) == (0, 18)
    assert {len(v) for t, v in occurrences(aws, sid).items() if t < at("10:30")} == {1}


def test_backfill_is_refused_with_its_reason(alice: Api, bob: Api, aws: Services, clock: Clock):
    sid = create(alice, cron())["schedule"]["schedule_id"]
    # to not after from: 400 naming "to"
    answer = alice.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-11-18T10:00:00Z", "to": "2026-11-18T10:00:00Z"},
    )
    assert assert_error(answer, 400, "invalid_input")["fields"][0]["field"] == "to"
    # a missing or unknown field: 400
    missing = alice.post(f"/v1/schedules/{sid}/backfill", {"from": "2026-11-18T10:00:00Z"})
    assert missing.status == 400
    # another tenant's schedule: 404, as if it did not exist
    theirs = bob.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-11-18T09:00:00Z", "to": "2026-11-18T10:00:00Z"},
    )
    assert_error(theirs, 404, "not_found")
    # a paused one: 409 with its state
    assert alice.post(f"/v1/schedules/{sid}/pause").status == 200
    paused = alice.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-11-18T09:00:00Z", "to": "2026-11-18T10:00:00Z"},
    )
    assert assert_error(paused, 409, "conflict")["details"] == {"state": "PAUSED"}


def test_backfill_is_bounded_by_max_backfill_occurrences(aws: Services, clock: Clock):
    carol = bootstrap("carol", "arn:aws:iam::111111111111:role/carol", max_backfill_occurrences=12)
    sid = create(carol, cron())["schedule"]["schedule_id"]
    # 12 fires in an hour of */5: allowed; 13 (an hour and 5 minutes): refused, nothing made
    assert (
        carol.post(
            f"/v1/schedules/{sid}/backfill",
            {"from": "2026-11-18T08:00:00Z", "to": "2026-11-18T09:00:00Z", "dry_run": True},
        ).body["fires"]
        == 12
    )
    refused = carol.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-11-18T08:00:00Z", "to": "2026-11-18T09:05:00Z"},
    )
    error = assert_error(refused, 400, "invalid_input")
    assert error["fields"][0]["field"] == "to"
    assert "max_backfill_occurrences" in error["message"]
    listed = carol.get(f"/v1/schedules/{sid}/occurrences").body["occurrences"]
    assert all(o["scheduled_for"] >= "2026-11-18T11" for o in listed)


def test_backfill_refuses_a_range_older_than_the_retention(alice: Api, aws: Services, clock: Clock):
    # GIVEN a schedule; its occurrences expire after retention_days (30)
    sid = create(alice, cron())["schedule"]["schedule_id"]
    # WHEN the range starts before that (whether those fires ran is no longer recorded)
    for since in ("2026-10-18T00:00:00Z", "1969-12-31T23:00:00Z"):
        answer = alice.post(
            f"/v1/schedules/{sid}/backfill", {"from": since, "to": "2026-11-18T10:00:00Z"}
        )
        # THEN 400 naming from, and nothing is made
        error = assert_error(answer, 400, "invalid_input")
        assert error["fields"][0]["field"] == "from"
        assert "retention" in error["message"]
    within = alice.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-10-20T00:00:00Z", "to": "2026-10-20T01:00:00Z", "dry_run": True},
    )
    assert within.status == 200, within.body


def test_backfill_rounds_fractional_instants_up(alice: Api, aws: Services, clock: Clock):
    sid = create(alice, cron())["schedule"]["schedule_id"]
    # [09:00:00.5, 09:05:00.5) holds the fire at 09:05 and not the one at 09:00
    answer = alice.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-11-18T09:00:00.5Z", "to": "2026-11-18T09:05:00.5Z", "dry_run": True},
    )
    assert answer.status == 200, answer.body
    assert [o["scheduled_for"] for o in answer.body["occurrences"]] == ["2026-11-18T09:05:00Z"]


# --- two backfills of one schedule: one pace, not two -------------------------------------


def paced(aws: Services, sid: str, since: int, until: int) -> list[int]:
    """When the schedule's occurrences of [since, until) become receivable, in order."""
    return sorted(
        int(item["available_at"]["N"])
        for instant, items in occurrences(aws, sid).items()
        if since <= instant < until
        for item in items
    )


def test_backfill_second_in_a_row_is_paced_after_the_firsts_last_occurrence(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule made at 09:40, and at 10:31 a backfill of [09:00, 09:40): its 8
    # fires paced from now, one a second (the default catch-up pace)
    sid = running_since_0940(aws, clock, lost=set())
    clock.now = at("10:31")
    first = ControlPlane(aws).backfill("alice", sid, at("09:00"), at("09:40"), dry_run=False)
    assert len(first.made) == 8
    # WHEN a second backfill, of the disjoint [08:00, 08:40), follows in the same second
    second = ControlPlane(aws).backfill("alice", sid, at("08:00"), at("08:40"), dry_run=False)
    # THEN its 8 are paced on after the first's last one, a second apart: the schedule's
    # catch-up never runs faster than the tenant's pace, however many backfills ask
    assert len(second.made) == 8
    assert paced(aws, sid, at("09:00"), at("09:40")) == list(range(at("10:31"), at("10:31") + 8))
    assert paced(aws, sid, at("08:00"), at("08:40")) == list(
        range(at("10:31") + 8, at("10:31") + 16)
    )


def test_backfill_that_read_the_schedule_before_another_committed_is_paced_after_it(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a */5 schedule made at 09:40, and at 10:31 a backfill of [08:00, 08:40) that
    # read the schedule before another backfill, of [09:00, 09:40), committed (both paced
    # from now as they read it)
    sid = running_since_0940(aws, clock, lost=set())
    clock.now = at("10:31")
    plane, rival = overtaken_at_commit(
        aws,
        clock,
        lambda: ControlPlane(aws).backfill("alice", sid, at("09:00"), at("09:40"), dry_run=False),
    )
    # WHEN it commits
    done = plane.backfill("alice", sid, at("08:00"), at("08:40"), dry_run=False)
    # THEN its first commit was refused (the pace it started from was taken) and it was
    # paced again after the other's last occurrence: no second of the catch-up twice
    [other] = rival
    assert [o.available_at for o in other.made] == list(range(at("10:31"), at("10:31") + 8))
    assert [o.available_at for o in done.made] == list(range(at("10:31") + 8, at("10:31") + 16))
    assert paced(aws, sid, at("08:00"), at("09:40")) == list(range(at("10:31"), at("10:31") + 16))


def test_backfill_after_a_pace_that_fills_sqss_delay_is_refused_with_when_to_retry(
    aws: Services, clock: Clock
):
    # GIVEN a tenant allowed one catch-up fire a minute, and a backfill at 10:31 of 15 fires
    # (08:25 to 09:35), paced a minute apart: its last one receivable 14 minutes on, as
    # far as SQS's delay (900 s, a tick to spare) reaches
    alice = bootstrap("alice", ALICE, catchup_per_minute=1)
    sid = running_since_0940(aws, clock, lost=set())
    clock.now = at("10:31")
    first = backfill(alice, sid, at("08:25"), at("09:40"))
    assert (first.status, first.body["created"]) == (200, 15), first.body
    assert paced(aws, sid, at("08:25"), at("09:40"))[-1] == at("10:45")
    # WHEN another backfill, of [08:00, 08:25), is asked at once
    refused = backfill(alice, sid, at("08:00"), at("08:25"))
    # THEN it is refused (its first fire, a minute after 10:45, is beyond SQS's delay),
    # saying when to ask again, and makes nothing
    error = assert_error(refused, 409, "conflict")
    assert error["details"] == {"retry_after": 60}
    assert paced(aws, sid, at("08:00"), at("08:25")) == []
    # AND asked again then, it is accepted, paced after the first's last one, within SQS's
    # delay
    clock.advance(60)
    again = backfill(alice, sid, at("08:00"), at("08:25"))
    assert (again.status, again.body["created"]) == (200, 5), again.body
    receivable = paced(aws, sid, at("08:00"), at("08:25"))
    assert receivable[0] == at("10:46")
    assert receivable[-1] - clock.now <= 900


def _sent(aws: Services) -> list[str]:
    return sorted(m["occurrence_id"] for m in messages(aws, "alice"))


def _checked(aws: Services, sid: str, at_: int, window: tuple[int, int]) -> Any:
    """The scheduled reconciler run at ``at_``: its result for ``window`` (None: not checked)."""
    results = Reconciler(aws).catch_up(shards_of(aws, [sid]), at_)
    return next((r for r in results if r.report.window_end == window[1]), None)


def _healthy_until(aws: Services, clock: Clock, sid: str, until: int, keep: list[str]) -> None:
    """The materializer ticks up to ``until``, and a worker does every fire but ``keep``."""
    materialize_until(aws, clock, until, shards_of(aws, [sid]))
    for items in occurrences(aws, sid).values():
        for item in items:
            open_ = item["state"]["S"] in ("SCHEDULED", "RUNNING", "RETRY_WAIT")
            if open_ and item["occurrence_id"]["S"] not in keep:
                set_occurrence_state(aws, item["occurrence_id"]["S"], "SUCCEEDED")
    clock.now = until


@pytest.mark.parametrize("case", ["before_it_existed", "in_a_settled_hour", "then_updated"])
def test_backfilled_occurrences_whose_messages_were_lost_are_sent_again_until_done(
    alice: Api, aws: Services, clock: Clock, case: str
):
    # GIVEN a */5 schedule made at 09:40, healthy since, every fire done
    sid = running_since_0940(aws, clock, lost=set())
    _healthy_until(aws, clock, sid, at("12:05"), keep=[])
    if case in ("before_it_existed", "then_updated"):
        # (fires before the schedule existed: no hour's check ever reads them)
        since, until = at("07:00"), at("07:30")
    else:
        # (10:15 recorded MISSED, and its hour checked and settled at 12:05)
        since, until = at("10:15"), at("10:20")
        set_occurrence_state(aws, occurrence_id(sid, 1, at("10:15")), "MISSED")
        checked = _checked(aws, sid, at("12:05"), (at("10:00"), at("11:00")))
        assert checked is not None
        assert checked.report.settled
    # WHEN its owner backfills a range at 12:10, and every message of it is lost (never
    # relayed: the stream record trimmed, the message dropped)
    clock.now = at("12:10")
    done = backfill(alice, sid, since, until)
    assert done.status == 200, done.body
    made = sorted(o["occurrence_id"] for o in done.body["occurrences"])
    assert len(made) == done.body["created"] > 0
    if case == "then_updated":
        # (a worker took them, under a lease until 12:40, and died; a new version at 12:30,
        # which leaves running ones be, writes the schedule's item whole: the backfill's
        # mark on it is gone)
        for oid in made:
            set_occurrence_state(aws, oid, "RUNNING")
            aws.dynamodb.update_item(
                TableName=aws.settings.occurrences_table,
                Key=to_dynamo(occurrence_key(oid)),
                UpdateExpression="SET lease_expires_at = :at",
                ExpressionAttributeValues={":at": {"N": str(at("12:40"))}},
            )
        clock.now = at("12:30")
        changed = patch(alice, sid, {"payload": {"v": 2}}, 1)
        assert changed.status == 200, changed.body
    # THEN the reconciler's check of the hour the backfill was made in sends each again,
    # same id, once overdue, and leaves that hour open while they are
    watch = _window_of(at("12:10"))
    _healthy_until(aws, clock, sid, at("14:05"), keep=made)
    first = _checked(aws, sid, at("14:05"), watch)
    assert first is not None
    assert sorted(first.redriven) == made
    assert not first.report.settled
    assert _sent(aws) == made
    # AND a later run checks that hour again while they are open, and sends them again
    _healthy_until(aws, clock, sid, at("15:05"), keep=made)
    again = _checked(aws, sid, at("15:05"), watch)
    assert again is not None
    assert sorted(again.redriven) == made
    # AND once they are done the hour settles, and no later run checks it or sends more
    _healthy_until(aws, clock, sid, at("16:05"), keep=[])
    last = _checked(aws, sid, at("16:05"), watch)
    assert last is not None
    assert last.report.settled
    assert last.redriven == []
    _healthy_until(aws, clock, sid, at("17:05"), keep=[])
    assert _checked(aws, sid, at("17:05"), watch) is None


def test_backfill_made_a_moment_before_its_hour_is_checked_keeps_the_hour_open_on_lagging_replicas(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a healthy */5 schedule, backfilled at 12:59:58 (fires before it existed), on
    # replicas and an index that lag 5 s
    sid = running_since_0940(aws, clock, lost=set())
    _healthy_until(aws, clock, sid, at("12:59") + 58, keep=[])
    replicas = lagging(aws, clock)
    made = ControlPlane(replicas).backfill("alice", sid, at("07:00"), at("07:30"), dry_run=False)
    assert len(made.made) == 6
    # WHEN an operator checks [12:00, 13:00) three seconds later, on those replicas
    clock.now = at("13:00") + 1
    [result] = Reconciler(replicas).run(shards_of(aws, [sid]), at("12:00"), at("13:00"))
    # THEN the backfill's record and occurrences are read as they are now: in flight, the
    # hour not settled (so the scheduled run checks it again, and re-sends them if lost)
    assert result.report.counts.get(Finding.IN_FLIGHT, 0) == 6
    assert not result.report.settled


def test_backfill_of_more_fires_than_a_transaction_holds_commits_them_in_chunks_under_one_record(
    alice: Api, aws: Services, clock: Clock
):
    # GIVEN a minutely schedule made at 09:40, and its owner backfilling the 200 fires of
    # [06:00, 09:20) at 09:41
    clock.now = at("09:40")
    sid = make(aws, spec={"kind": "cron", "expression": "* * * * *", "timezone": "UTC"})
    clock.now = at("09:41")
    sizes: list[int] = []
    aws.dynamodb.meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems",
        lambda params, **_: sizes.append(len(params["TransactItems"])),
    )
    done = backfill(alice, sid, at("06:00"), at("09:20"))
    # THEN every fire is made, in transactions of at most 100 actions: the first with the
    # schedule's mark and the backfill's record, each with the schedule's version check
    assert (done.status, done.body["created"]) == (200, 200), done.body
    assert sizes == [100, 99, 5]  # (98 + 2, 98 + 1, 4 + 1)
    made = occurrences(aws, sid)
    assert all(len(made[t]) == 1 for t in range(at("06:00"), at("09:20"), 60))
    # AND one record covers them all, found by the check of the hour it was made in
    unreadable: list[str] = []
    ranges = aws.occurrences.backfilled(
        sid, since=at("09:00"), until=at("10:00"), unreadable=unreadable
    )
    assert (ranges, unreadable) == ([(at("06:00"), at("09:19") + 1)], [])


@pytest.mark.parametrize(("repeat", "fired"), [("FIRST", ["05:30"]), ("BOTH", ["05:30", "06:30"])])
def test_backfill_follows_the_schedules_dst_choice(
    alice: Api, aws: Services, clock: Clock, repeat: str, fired: list[str]
):
    # GIVEN 01:30 daily in New York with a repeat choice, made a day after the fall-back of
    # 2026-11-01 (01:30 was 05:30Z, then again 06:30Z)
    clock.now = epoch("2026-11-02T03:00:00Z")
    spec = cron("30 1 * * *", "America/New_York")["spec"] | {"dst": {"repeat": repeat}}
    sid = create(alice, {"spec": spec, "target": "default"})["schedule"]["schedule_id"]
    # WHEN its owner backfills that night
    answer = alice.post(
        f"/v1/schedules/{sid}/backfill",
        {"from": "2026-11-01T04:00:00Z", "to": "2026-11-01T08:00:00Z"},
    )
    # THEN the fires made are the choice's: the first 01:30 only, or both
    assert answer.status in (200, 202), answer.body
    made = sorted(occurrences(aws, sid))
    assert made == [epoch(f"2026-11-01T{t}:00Z") for t in fired]
