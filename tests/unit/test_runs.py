"""The run store's decisions that need no table (punctual.dal.runs): a completion sent again
after its answer was lost meets its own write and counts as done only when the item shows
this lease's completion, never another worker's or a newer attempt's; a release refused
on one slot still frees the other; a refused wait names who waits."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.dal.common import to_dynamo
from punctual.dal.runs import RunLease, RunStore, Seen, _abandoned, _finished_by
from punctual.domain.occurrence import AttemptOutcome, OccurrenceState
from punctual.settings import Settings

NOW = 1_795_000_100
LEASE = RunLease(
    occurrence_id="occ_sch_alice.x_1795000000_1",
    tenant_id="alice",
    schedule_id="sch_alice.x",
    attempt_no=2,
    token="t2",
    expires_at=NOW + 60,
    concurrency_slot=0,
    overlap=False,
    attempt_index=1,
)


def written(**changes: Any) -> dict[str, Any]:
    """The occurrence as this lease's SUCCEEDED completion left it (attempt 1 was LOST)."""
    item: dict[str, Any] = {
        "state": "SUCCEEDED",
        "attempt_count": 2,
        "attempts": [
            {"attempt_no": 1, "outcome": "LOST"},
            {"attempt_no": 2, "outcome": "SUCCEEDED", "finished_at": NOW},
        ],
    }
    for key, value in changes.items():
        if value is None:
            item.pop(key)
        else:
            item[key] = value
    return item


def ours(item: dict[str, Any] | None) -> bool:
    return _finished_by(item, LEASE, OccurrenceState.SUCCEEDED, AttemptOutcome.SUCCEEDED, NOW)


def test_a_repeat_that_finds_its_own_completion_counts_as_done() -> None:
    assert ours(written())


@pytest.mark.parametrize(
    ("case", "item"),
    [
        ("no item", None),
        ("an empty answer", {}),
        ("still running (the condition failed on the token)", written(state="RUNNING")),
        ("another state", written(state="RETRY_WAIT")),
        ("a lease token held", written(lease_token="t3")),
        ("a newer attempt claimed it", written(attempt_count=3)),
        ("no attempt count", written(attempt_count=None)),
        ("no attempt count, for attempt 1", "first"),
        ("a history without this attempt", written(attempts=[{"outcome": "LOST"}])),
        ("no history", written(attempts=None)),
        (
            "this attempt closed otherwise",
            written(attempts=[{}, {"outcome": "LOST", "finished_at": NOW}]),
        ),
        (
            "this attempt closed at another time",
            written(attempts=[{}, {"outcome": "SUCCEEDED", "finished_at": NOW - 1}]),
        ),
        ("this attempt not closed", written(attempts=[{}, {"outcome": "SUCCEEDED"}])),
    ],
)
def test_anything_else_is_not_this_completion(case: str, item: Any) -> None:
    if item == "first":  # a first attempt's lease, an item that shows no attempt count
        first = dataclasses.replace(LEASE, attempt_no=1, attempt_index=0)
        item = written(attempt_count=None, attempts=[{"outcome": "SUCCEEDED", "finished_at": NOW}])
        state, outcome = OccurrenceState.SUCCEEDED, AttemptOutcome.SUCCEEDED
        assert not _finished_by(item, first, state, outcome, NOW), case
        return
    assert not ours(item), case


def test_the_outcome_and_state_asked_for_are_what_must_be_found() -> None:
    # a RETRY completion's repeat finds RETRY_WAIT and the RETRY outcome, not SUCCEEDED
    retried = written(state="RETRY_WAIT", attempts=[{}, {"outcome": "RETRY", "finished_at": NOW}])
    retry = (OccurrenceState.RETRY_WAIT, AttemptOutcome.RETRY)
    assert _finished_by(retried, LEASE, *retry, NOW)
    assert not _finished_by(retried, LEASE, OccurrenceState.SUCCEEDED, AttemptOutcome.RETRY, NOW)
    assert not _finished_by(retried, LEASE, OccurrenceState.RETRY_WAIT, AttemptOutcome.DEAD, NOW)


class Refusing:
    """A DynamoDB client whose UpdateItem calls are recorded; those on the keys in
    ``refused`` fail their condition, with no item in the answer."""

    def __init__(self, *refused: str) -> None:
        self.refused = refused
        self.updates: list[str] = []

    def update_item(self, **request: Any) -> dict[str, Any]:
        sk = request["Key"]["sk"]["S"]
        self.updates.append(sk)
        if sk in self.refused:
            error = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "no"}}
            raise ClientError(error, "UpdateItem")
        return {}


def test_a_release_refused_on_the_concurrency_slot_still_frees_the_run_slot() -> None:
    # GIVEN a lease holding a concurrency slot and the schedule's run slot, and another
    # occurrence took the concurrency slot since (this lease had expired)
    client = Refusing("RUN#00000")
    lease = dataclasses.replace(LEASE, overlap=True)
    # WHEN the lease's slots are released
    RunStore(client, Settings()).release(lease)
    # THEN the refused one is left to its holder and the run slot is freed all the same
    assert client.updates == ["RUN#00000", "SLOT#sch_alice.x"]


def test_a_refused_wait_without_the_slots_item_says_another_occurrence_waits() -> None:
    # DynamoDB returns the item that failed the condition only when it exists and was asked
    # for; without it, the refusal still names a waiter, in words
    store = RunStore(Refusing("WAIT#sch_alice.x"), Settings())
    waiting = store.wait("alice", "sch_alice.x", "occ_x", until=NOW + 60, now=NOW)
    assert waiting == "another occurrence"


@pytest.mark.parametrize(
    ("seen", "abandoned"),
    [
        (Seen(OccurrenceState.RUNNING, 2, "t", ({"attempt_no": 1}, {"attempt_no": 2})), True),
        # a run an old-SDK worker started: its attempt item is apart, the last entry is an
        # earlier attempt that ended already, and must keep its outcome
        (Seen(OccurrenceState.RUNNING, 2, "t", ({"attempt_no": 1, "outcome": "RETRY"},)), False),
        (Seen(OccurrenceState.RUNNING, 1, "t", ()), False),
        (Seen(OccurrenceState.RETRY_WAIT, 1, None, ({"attempt_no": 1},)), False),
    ],
)
def test_only_the_attempt_whose_lease_was_read_is_marked_lost(seen: Seen, abandoned: bool) -> None:
    assert _abandoned(seen) is abandoned


class Reads:
    """A DynamoDB client that records GetItem requests and finds the schedule at version 3."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def get_item(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        return {"Item": {"version": {"N": "3"}, "state": {"S": "ACTIVE"}}}


def test_the_schedules_version_is_read_consistently_only_when_asked() -> None:
    # the cooperative-cancel check is a hint (eventually consistent, cheaper); the check
    # after a claim must see a change committed a moment before (strongly consistent)
    client = Reads()
    store = RunStore(client, Settings())
    assert store.schedule_version("sch_alice.x") == (3, "ACTIVE")
    assert store.schedule_version("sch_alice.x", consistent=True) == (3, "ACTIVE")
    assert [r["ConsistentRead"] for r in client.requests] == [False, True]


class Slots:
    """A DynamoDB client whose tenant table holds concurrency slots 0-2 with these lease
    ends (slot 3 has no item), and records BatchGetItem requests."""

    def __init__(self, expires: dict[int, int]) -> None:
        self.expires = expires
        self.requests: list[dict[str, Any]] = []

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(RequestItems)
        [(table, asked)] = RequestItems.items()
        items = []
        for key in asked["Keys"]:
            slot = int(key["sk"]["S"].removeprefix("RUN#"))
            if slot in self.expires:
                item = {"pk": key["pk"], "sk": key["sk"], "lease_token": {"S": "x"}}
                items.append(item | {"expires_at": {"N": str(self.expires[slot])}})
        return {"Responses": {table: items}}


def test_busy_slots_are_those_whose_lease_outlives_now_read_as_a_hint() -> None:
    # GIVEN slots whose leases ended before now, end exactly now, and end later; one unused
    client = Slots({0: NOW - 1, 1: NOW, 2: NOW + 1})
    store = RunStore(client, Settings())
    # THEN only the lease that outlives now is busy: one that ends now is free, as the
    # claim's condition (expires_at <= :now) takes it
    assert store.busy_slots("alice", [0, 1, 2, 3], NOW) == {2}
    # AND the read is eventually consistent (a hint, half the read units): the claim's
    # condition decides
    assert [r["punctual-tenants"]["ConsistentRead"] for r in client.requests] == [False]


class Unprocessing:
    """DynamoDB answering a BatchGetItem with part of it unprocessed (it may, under load):
    the occurrence first, the schedule's keys handed back to be asked again."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.requests: list[dict[str, Any]] = []

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(RequestItems)
        occurrences, schedules = self.settings.occurrences_table, self.settings.schedules_table
        if len(self.requests) == 1:
            return {
                "Responses": {occurrences: [to_dynamo(OCCURRENCE)]},
                "UnprocessedKeys": {schedules: RequestItems[schedules]},
            }
        return {"Responses": {schedules: [to_dynamo(SCHEDULE)]}, "UnprocessedKeys": {}}


OCCURRENCE = {
    "occurrence_id": LEASE.occurrence_id,
    "tenant_id": LEASE.tenant_id,
    "schedule_version": 1,
    "state": "SCHEDULED",
    "attempt_count": 0,
    "scheduled_for": NOW,
    "available_at": NOW,
}
SCHEDULE = {
    "schedule_id": LEASE.schedule_id,
    "version": 1,
    "state": "ACTIVE",
    "definition": {"retry": {"max_attempts": 3}, "overlap": "SKIP_IF_RUNNING"},
}


def test_a_read_asks_again_for_what_dynamodb_left_unprocessed() -> None:
    # GIVEN a BatchGetItem whose first answer leaves the schedule unprocessed
    client = Unprocessing(Settings())
    # WHEN the worker reads the occurrence and its schedule
    run, schedule = RunStore(client, Settings()).read(LEASE.occurrence_id, LEASE.schedule_id)
    # THEN it asked again for exactly the keys handed back, and has both, strongly consistent
    assert len(client.requests) == 2
    assert client.requests[1] == {
        Settings().schedules_table: client.requests[0][Settings().schedules_table]
    }
    assert all(part["ConsistentRead"] for part in client.requests[0].values())
    assert run is not None
    assert run.state is OccurrenceState.SCHEDULED
    assert schedule is not None
    assert (schedule.run_version, schedule.retry.max_attempts) == (1, 3)
    assert schedule.overlap.value == "SKIP_IF_RUNNING"
