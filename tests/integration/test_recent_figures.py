"""GET /v1/schedules/{id}'s recent figures, on moto with the injected clock: fires made by the
API, relayed and run by the worker SDK (succeeded, retried, dead), a manual run left out, a
fire not yet due left out, the read bounded, and the ``recent`` parameter's bounds."""

from __future__ import annotations

from typing import Any

from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo
from punctual.dal.occurrences import EXAMINED_PER_FIRE, LATEST_PAGES, OccurrenceStore
from punctual.dal.tables import occurrence_sk
from punctual.services import Services
from punctual_client.worker import Job, Outcome, PermanentError
from tests.instants import iso
from tests.integration.conftest import START, Api, Clock
from tests.integration.helpers import assert_error
from tests.integration.worker.helpers import (
    Flaky,
    by_occurrence,
    rate_schedule,
    receive,
    redeliver,
    relay,
    worker,
)


class Refused(PermanentError):
    pass


def _run(aws: Services, deliveries: dict[str, Any], occurrence: str, then: Any) -> None:
    def handler(job: Job) -> None:
        if then is not None:
            raise then

    worker(aws, handler).process(deliveries[occurrence])


def test_figures_count_the_fires_run_and_measure_their_lags(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a rate(1 minute) schedule whose first four fires are due (made by the API),
    # relayed a minute after the first: one succeeds, one fails and waits for a retry, one
    # fails permanently, one is not taken yet
    sid, made = rate_schedule(aws, "rate(1 minute)", retry={"max_attempts": 3})
    clock.advance(180)
    relay(aws, *made[:4])
    deliveries = by_occurrence(receive(aws))
    _run(aws, deliveries, made[0], None)
    _run(aws, deliveries, made[1], Flaky("try later"))
    clock.advance(5)
    _run(aws, deliveries, made[2], Refused("no such invoice"))
    # and a run now, which is no fire of the schedule
    assert alice.post(f"/v1/schedules/{sid}/trigger").status == 201
    # WHEN alice reads the schedule
    answer = alice.get(f"/v1/schedules/{sid}")
    # THEN the figures cover the four fires due, none of the fires ahead, not the run now
    assert answer.status == 200, answer.body
    recent = answer.body["recent"]
    assert recent["fires"] == 4
    assert recent["since"] == iso(START)
    assert recent["outcomes"] == {
        "succeeded": 1,
        "retried": 0,
        "dead": 1,
        "missed": 0,
        "skipped": 0,
        "canceled": 0,
        "open": 2,
    }
    # Claimed at START+180 (two of them) and START+185, each due a minute after the one
    # before: 180, 120 and 65 s; the message counts as sent at its claim (no SentTimestamp).
    lag = {"count": 3, "p50_seconds": 120, "p99_seconds": 180, "max_seconds": 180}
    assert recent["receivable_lag"] == lag
    assert recent["start_lag"] == lag
    assert recent["last_failure"] == {
        "occurrence_id": made[2],
        "scheduled_for": iso(START + 120),
        "at": iso(START + 185),
        "what": "DEAD",
        "error": "permanent: Refused: no such invoice",
    }
    assert recent["unreadable"] == 0
    # AND the failed fire's retry, run and succeeding, makes it retried and succeeded
    clock.advance(600)
    retry = redeliver(aws, deliveries[made[1]])
    assert worker(aws, lambda job: None).process(retry).outcome is Outcome.SUCCEEDED
    later = alice.get(f"/v1/schedules/{sid}").body["recent"]
    outcomes = later["outcomes"]
    assert (outcomes["succeeded"], outcomes["retried"], outcomes["dead"]) == (2, 1, 1)
    # (every fire the API made is due by now, and no other was made: no materializer ran)
    assert later["fires"] == len(made) == outcomes["open"] + 3


def test_the_recent_parameter_bounds_the_fires_and_zero_reads_none(
    alice: Api, aws: Services, clock: Clock
) -> None:
    sid, _ = rate_schedule(aws, "rate(1 minute)")
    clock.advance(240)
    assert alice.get(f"/v1/schedules/{sid}", recent=2).body["recent"]["fires"] == 2
    assert alice.get(f"/v1/schedules/{sid}", recent=2).body["recent"]["since"] == iso(START + 180)
    assert alice.get(f"/v1/schedules/{sid}", recent=0).body["recent"] is None
    assert alice.get(f"/v1/schedules/{sid}", recent=500).body["recent"]["fires"] == 5
    for bad in ("-1", "501", "many"):
        body = assert_error(alice.get(f"/v1/schedules/{sid}", recent=bad), 400, "invalid_input")
        assert [f["field"] for f in body["fields"]] == ["recent"], body


def test_a_backfill_newer_than_the_fires_bounds_the_read_rather_than_lengthening_it(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a schedule with 5 fires due, and after them more manual runs than a read of 2
    # fires examines (a backfill of the last hours' fires: manual occurrences)
    sid, _ = rate_schedule(aws, "rate(1 minute)")
    clock.advance(240)
    plane = ControlPlane(aws)
    trigger_count = EXAMINED_PER_FIRE * 2 + 1
    for n in range(trigger_count):
        plane.trigger("alice", sid, f"key-{n}")
        clock.advance(1)
    # WHEN alice asks for the figures of 2 fires, then of 5
    two = alice.get(f"/v1/schedules/{sid}", recent=2).body["recent"]
    five = alice.get(f"/v1/schedules/{sid}", recent=5).body["recent"]
    # THEN the first read stopped at its bound, having found no fire; the second found all
    assert two["fires"] == 0
    assert five["fires"] == 5


def test_another_tenants_schedule_has_no_figures_to_read(
    alice: Api, bob: Api, aws: Services, clock: Clock
) -> None:
    sid, _ = rate_schedule(aws, "rate(1 minute)")
    clock.advance(60)
    assert bob.get(f"/v1/schedules/{sid}", recent=5).status == 404


class EmptyPageFirst:
    """DynamoDB's Query as AWS may answer it: the first page empty, with a key to go on
    from (a page's filtered-out or throttled-out items), then the real pages."""

    def __init__(self, real: Any, start: dict[str, Any]) -> None:
        self.real, self.start, self.queries = real, start, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def query(self, **request: Any) -> Any:
        self.queries += 1
        if self.queries == 1:
            return {"Items": [], "Count": 0, "LastEvaluatedKey": self.start}
        return self.real.query(**request)


def test_an_empty_page_mid_read_is_read_past_not_taken_for_the_end(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN a schedule with 5 fires due, and a Query that answers an empty first page
    sid, _ = rate_schedule(aws, "rate(1 minute)")
    clock.advance(240)
    start = to_dynamo({"schedule_id": sid, "sk": occurrence_sk(int(clock.now) + 1, 0)})
    client = EmptyPageFirst(aws.dynamodb, start)
    store = OccurrenceStore(client, aws.settings.occurrences_table)
    # WHEN the latest 3 fires are read
    found = store.latest_fires(sid, until=int(clock.now), count=3)
    # THEN the read went on past the empty page and found them, newest first
    assert client.queries == 2
    assert [o.scheduled_for for o, _ in found.fires] == [START + 240, START + 180, START + 120]


class ShortPages:
    """DynamoDB's Query answering at most 3 items a page (its 1 MB cap, large items), with a
    key to go on from; counts the items handed out and the pages."""

    def __init__(self, real: Any) -> None:
        self.real, self.items, self.pages = real, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def query(self, **request: Any) -> Any:
        answer = dict(self.real.query(**request))
        if len(answer["Items"]) > 3:
            answer["Items"] = answer["Items"][:3]
            last = answer["Items"][-1]
            answer["LastEvaluatedKey"] = {"schedule_id": last["schedule_id"], "sk": last["sk"]}
        self.items += len(answer["Items"])
        self.pages += 1
        return answer


def test_short_pages_never_take_the_read_past_its_bounds(
    alice: Api, aws: Services, clock: Clock
) -> None:
    # GIVEN 5 fires due and, after them, more manual runs than a read of 2 fires examines
    sid, _ = rate_schedule(aws, "rate(1 minute)")
    clock.advance(240)
    for n in range(EXAMINED_PER_FIRE * 2 + 3):
        ControlPlane(aws).trigger("alice", sid, f"key-{n}")
    client = ShortPages(aws.dynamodb)
    # WHEN 2 fires are read through pages of 3
    found = OccurrenceStore(client, aws.settings.occurrences_table).latest_fires(
        sid, until=int(clock.now), count=2
    )
    # THEN it examined at most its bound, in at most its pages, and says it did not reach
    # the schedule's first item
    assert client.items <= EXAMINED_PER_FIRE * 2
    assert client.pages <= LATEST_PAGES
    assert (found.fires, found.reached) == ([], False)
