"""The simulation's oracle (tests/sim/oracle.py) can fail: each check of the contract meets
the violation it is for, planted in a small made-up history, and stays quiet on the same
history without it. (tests/integration/test_simulation.py plants violations in a real run's
stored end state; these cover the checks of what the workers and clients logged.)"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from punctual.dal.schedules import ScheduleVersion
from punctual.dal.tables import occurrence_key
from punctual.domain.findings import Finding, ReconcileReport
from punctual.domain.ids import backfill_tag, occurrence_id, schedule_key_prefix
from punctual.domain.ledger import LedgerEntry
from punctual.domain.occurrence import Attempt, AttemptOutcome, Lane, Occurrence, OccurrenceState
from punctual.domain.policies import OverlapPolicy
from punctual.domain.schedule import MissedEpisode, Schedule
from punctual.pipeline.ownership import Expected
from punctual.settings import Settings
from punctual_client.worker.core import QUEUE_WAIT_SECONDS, Outcome
from tests.sim import oracle
from tests.sim.oracle import Verdict, _Fire
from tests.sim.tenants import Backfill, LedgerRead, Trigger
from tests.sim.workers import Event, HandlerRun
from tests.sim.world import Run

SID = "sch_t0.abc"
OTHER = "sch_t0.def"
T = 1_800_000_000  # (a whole hour)
DAY = 86400


def run_of(**fields: Any) -> Run:
    run = Run(T, T + 86400, Settings(), cast(Any, None), cast(Any, None), skew=3)
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def occurrence(
    instant: int, state: OccurrenceState = OccurrenceState.SUCCEEDED, **fields: Any
) -> Occurrence:
    schedule_id = fields.pop("schedule_id", SID)
    manual = fields.pop("manual", None)
    return Occurrence(
        occurrence_id=occurrence_id(schedule_id, 1, instant, manual),
        tenant_id="t0",
        schedule_id=schedule_id,
        schedule_version=1,
        scheduled_for=instant,
        available_at=fields.pop("available_at", instant),
        target="default",
        state=state,
        **fields,
    )


def handler_run(oid: str, started: float, ended: float, **fields: Any) -> HandlerRun:
    values: dict[str, Any] = {
        "schedule_id": SID,
        "version": 1,
        "attempt": 1,
        "available": started,
        "current": 1,
        "state": "ACTIVE",
        "overlap": OverlapPolicy.QUEUE_ONE,
    } | fields
    return HandlerRun(occurrence_id=oid, started=started, ended=ended, **values)


def schedule(**fields: Any) -> Schedule:
    return Schedule.model_validate(
        {
            "tenant_id": "t0",
            "schedule_id": SID,
            "version": 1,
            "target": "default",
            "spec": {"kind": "cron", "expression": "*/15 * * * *", "timezone": "UTC"},
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
        }
        | fields
    )


# --- runs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "lapsed", "expected"),
    [
        (OverlapPolicy.QUEUE_ONE, False, {"overlapped"}),
        (OverlapPolicy.SKIP_IF_RUNNING, False, {"overlapped"}),
        (OverlapPolicy.QUEUE_ONE, True, set()),  # the first one's lease ran out
        (OverlapPolicy.ALLOW, False, set()),
    ],
)
def test_oracle_two_runs_of_a_one_at_a_time_schedule_at_once(
    policy: OverlapPolicy, lapsed: bool, expected: set[str]
):
    # GIVEN two occurrences of one schedule whose handlers ran at the same time
    runs = [
        handler_run("a", T, T + 40, lapsed=lapsed),
        handler_run("b", T + 10, T + 20),
    ]
    verdict = Verdict()
    # WHEN checked under the policy
    oracle._check_runs(verdict, run_of(runs=runs), {(SID, 1): policy})
    # THEN they overlap only under one that runs one at a time, both holding their leases
    assert set(verdict.violations) == expected


def test_oracle_runs_one_after_the_other_or_of_two_schedules_are_fine():
    runs = [
        handler_run("a", T, T + 10),
        handler_run("b", T + 10, T + 20),
        handler_run("c", T + 5, T + 15, schedule_id=OTHER),
    ]
    verdict = Verdict()
    policies = {(SID, 1): OverlapPolicy.QUEUE_ONE, (OTHER, 1): OverlapPolicy.QUEUE_ONE}
    oracle._check_runs(verdict, run_of(runs=runs), policies)
    assert not verdict.violations


def test_oracle_two_attempts_of_one_occurrence_at_once_under_allow():
    runs = [handler_run("a", T, T + 20), handler_run("a", T + 5, T + 10, attempt=2)]
    verdict = Verdict()
    oracle._check_runs(verdict, run_of(runs=runs), {(SID, 1): OverlapPolicy.ALLOW})
    assert set(verdict.violations) == {"ran_at_once"}


@pytest.mark.parametrize(
    ("started", "current", "state", "kind"),
    [
        (T - 10, 1, "ACTIVE", "early"),
        (T, 2, "ACTIVE", "stale_run"),
        (T, 1, "CANCELED", "stale_run"),
    ],
)
def test_oracle_a_run_early_or_of_a_version_not_in_effect(
    started: int, current: int, state: str, kind: str
):
    runs = [handler_run("a", started, started + 1, available=T, current=current, state=state)]
    verdict = Verdict()
    oracle._check_runs(verdict, run_of(runs=runs), {})
    assert set(verdict.violations) == {kind}


@pytest.mark.parametrize(
    ("outcome", "flagged"), [(AttemptOutcome.SUCCEEDED, True), (AttemptOutcome.LOST, False)]
)
def test_oracle_an_attempt_told_to_stop_is_never_recorded_finished(
    outcome: AttemptOutcome, flagged: bool
):
    # GIVEN a run whose heartbeat said False, and its attempt as stored
    oid = occurrence_id(SID, 1, T)
    attempt = Attempt(
        occurrence_id=oid, attempt_no=1, started_at=T, lease_expires_at=T + 30, outcome=outcome
    )
    services = SimpleNamespace(
        occurrences=SimpleNamespace(get_with_attempts=lambda _: (occurrence(T), [attempt]))
    )
    run = run_of(runs=[handler_run(oid, T, T + 40, stopped=True, lapsed=True)])
    run.services = cast(Any, services)
    verdict = Verdict()
    # WHEN checked; THEN a finished record of it is a violation, LOST is not
    oracle._check_runs(verdict, run, {})
    assert ("stopped_but_recorded" in verdict.violations) is flagged


# --- QUEUE_ONE --------------------------------------------------------------------------


def events(*items: tuple[float, str, str]) -> list[Event]:
    return [Event(at, SID, oid, what) for at, oid, what in items]


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        # b waits while a's wait holds: two waiting
        ([(T, "a", Outcome.WAITING), (T + 10, "b", Outcome.WAITING)], {"two_waiting"}),
        # a is skipped while its wait holds
        ([(T, "a", Outcome.WAITING), (T + 10, "a", Outcome.SKIPPED_OVERLAP)], {"waiting_skipped"}),
        # a ran (its claim emptied the wait slot), then b waits: fine
        (
            [(T, "a", Outcome.WAITING), (T + 5, "a", "START"), (T + 10, "b", Outcome.WAITING)],
            set(),
        ),
        # a's wait ran out (its worker gone): b may wait, and a be skipped later
        (
            [
                (T, "a", Outcome.WAITING),
                (T + QUEUE_WAIT_SECONDS, "b", Outcome.WAITING),
                (T + QUEUE_WAIT_SECONDS + 1, "a", Outcome.SKIPPED_OVERLAP),
            ],
            set(),
        ),
    ],
)
def test_oracle_queue_one_waits_one_at_a_time(
    log: list[tuple[float, str, str]], expected: set[str]
):
    verdict = Verdict()
    oracle._check_queue_one(verdict, run_of(events=events(*log)), {(SID, 1)})
    assert set(verdict.violations) == expected


# --- fires ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        # a repair's second occurrence of one instant (a backfill's tag)
        ([occurrence(T), occurrence(T, manual=backfill_tag(SID))], {"fired_twice"}),
        # one wall time twice in its zone (both instants of a repeated hour)
        (
            [
                occurrence(T, local="2026-11-01T01:30:00"),
                occurrence(T + 3600, local="2026-11-01T01:30:00"),
            ],
            {"fired_twice"},
        ),
        # one canceled, one ran; or a run now at the same instant: fine
        ([occurrence(T, OccurrenceState.CANCELED), occurrence(T, manual="a" * 13)], set()),
    ],
)
def test_oracle_one_fire_one_occurrence_that_runs(stored: list[Occurrence], expected: set[str]):
    verdict = Verdict()
    zoned = schedule(
        spec={"kind": "cron", "expression": "30 1 * * *", "timezone": "America/New_York"}
    )
    oracle._check_once(verdict, stored, {1: zoned})
    assert set(verdict.violations) == expected


def fires(*instants: int) -> list[_Fire]:
    return [
        _Fire(1, [Expected(SID, 1, i, occurrence_id(SID, 1, i), i, True)], True) for i in instants
    ]


def misfire_check(stored: list[Occurrence], ranges: list[MissedEpisode], **misfire: Any) -> Verdict:
    verdict = Verdict()
    by_id = {o.occurrence_id: o for o in stored}
    instants = sorted(
        {o.scheduled_for for o in stored} | {i for r in ranges for i in (r.first, r.last)}
    )
    oracle._check_misfires(
        verdict, fires(*instants), by_id, ranges, {1: schedule(misfire=misfire)}, 3, set(), None, 0
    )
    return verdict


@pytest.mark.parametrize("manual", [None, backfill_tag(SID)])
def test_oracle_names_an_open_occurrence_once(manual: str | None):
    # GIVEN a fire (or a run now) still SCHEDULED after the drain
    stored = [occurrence(T, OccurrenceState.SCHEDULED, manual=manual)]
    versions = [ScheduleVersion(schedule(), T - 3600)]
    verdict = Verdict()
    # WHEN its schedule is checked; THEN it is unsettled, named once (by its fire, or as
    # an occurrence no fire owes)
    oracle._check_schedule(
        verdict, {"schedule_id": SID}, versions, fires(T), stored, run_of(), home(), T + 3600, 0
    )
    assert verdict.violations["unsettled"] == 1


def home(*accounted: int) -> oracle._Accounted:
    """The failed (home) region's reconcile reports: the hours it accounted for."""
    return cast(oracle._Accounted, SimpleNamespace(accounted=lambda shard: set(accounted)))


@pytest.mark.parametrize(
    ("due", "accounted", "expected"),
    [
        # lost in an hour the failed region's reconciler left unaccounted for (down, or its
        # walk behind), long before the take-over: neither region repairs it, a known limit
        (T + 600, [], set()),
        # the failed region checked that hour to the end: its check let a fire go missing
        (T + 600, [T], {"missing"}),
        # due after the take-over's rewound instant: the new region's to repair
        (T + 10 * 3600, [], {"missing"}),
    ],
)
def test_oracle_a_fire_the_failed_region_lost_is_known_only_in_an_hour_it_left_unchecked(
    due: int, accounted: list[int], expected: set[str]
):
    # GIVEN a fail-over at T+8h whose take-over rewound the schedule to T+8h-15min, and a
    # required fire with no occurrence
    run = run_of(failed_over_at=T + 8 * 3600)
    item = {"schedule_id": SID, "shard": 1, "homed_since": T + 8 * 3600 - 900}
    versions = [ScheduleVersion(schedule(), T - 3600)]
    verdict = Verdict()
    # WHEN the oracle checks it
    oracle._check_fires(verdict, item, versions, fires(due), {}, [], run, home(*accounted), T + DAY)
    # THEN it is a violation unless the failed region left its hour unaccounted for
    assert set(verdict.violations) == expected
    assert verdict.left_by_failover == (0 if expected else 1)


def test_oracle_reads_which_hours_the_failed_region_accounted_for():
    # GIVEN the home region's reports of four hours of shard 1: checked to the end (with
    # something still in flight), cut short, with a gap left to a walk that stood behind,
    # and report-only; the fifth hour has none
    def report(hour: int, **fields: Any) -> ReconcileReport:
        values: dict[str, Any] = {
            "shard": 1,
            "window_start": T + hour * 3600,
            "window_end": T + (hour + 1) * 3600,
            "run_at": T + (hour + 2) * 3600,
            "complete": True,
            "repair": True,
            "schedules": 3,
            "counts": {Finding.IN_FLIGHT: 1},
            "examples": {},
            "repaired_fired": 0,
            "repaired_missed": 0,
            "deferred": 0,
            "repair_conflicts": 0,
        }
        return ReconcileReport.model_validate(values | fields)

    reports = [report(0), report(1, complete=False), report(2, deferred=1), report(3, repair=False)]
    asked: list[list[tuple[int, int]]] = []

    def in_windows(shard: int, windows: list[tuple[int, int]]) -> dict[Any, ReconcileReport]:
        asked.append(windows)
        return {(r.window_start, r.window_end): r for r in reports if r.shard == shard}

    run = run_of(failed_over_at=T + 5 * 3600 + 600)
    run.services = cast(Any, SimpleNamespace(reports=SimpleNamespace(in_windows=in_windows)))
    # WHEN the oracle asks which hours the failed region accounted for
    settled = oracle._Accounted(run)
    # THEN only the first: the others left a gap unrepaired, or were never checked
    assert settled.accounted(1) == {T}
    assert settled.accounted(2) == set()
    # AND it asked every hour from before the run's start to the take-over's, each once
    assert (T - 3600, T) in asked[0]
    assert (T + 5 * 3600, T + 6 * 3600) in asked[0]
    settled.accounted(1)
    assert len(asked) == 2


def test_oracle_an_instant_recorded_missed_that_fired_too():
    episode = MissedEpisode(version=1, first=T, last=T + 900, count=2)
    stored = [
        occurrence(T + 900, available_at=T + 5000),
        occurrence(T + 1800, available_at=T + 5000),
    ]
    verdict = misfire_check(stored, [episode], action="FIRE_ONCE", max_lateness_seconds=0)
    assert set(verdict.violations) == {"missed_and_fired"}


def test_oracle_skip_fires_nothing_late():
    stored = [occurrence(T, available_at=T + 600)]
    verdict = misfire_check(stored, [], action="SKIP", max_lateness_seconds=60)
    assert set(verdict.violations) == {"late_under_skip"}
    assert not misfire_check(stored, [], action="SKIP", max_lateness_seconds=900).violations


def test_oracle_fire_once_releases_one_late_fire_after_a_miss():
    # GIVEN an outage: 09:00 recorded MISSED, then 09:15 and 09:30 both fired late at once
    episode = MissedEpisode(version=1, first=T, last=T, count=1)
    stored = [
        occurrence(T + 900, available_at=T + 4000),
        occurrence(T + 1800, available_at=T + 4000),
    ]
    verdict = misfire_check(stored, [episode], action="FIRE_ONCE", max_lateness_seconds=0)
    assert set(verdict.violations) == {"late_over_limit"}
    ok = misfire_check(stored[1:], [episode], action="CATCHUP", catchup_limit=2)
    assert not ok.violations


def test_oracle_catchup_limits_each_outage_not_two_outages_together():
    # GIVEN CATCHUP 3: an outage's three late fires released together at T + 9000, then a
    # fire due after that release, late too (the materializer down again): released at
    # T + 9800, within SQS's spread of the first release
    late = [occurrence(T + n * 900, available_at=T + 9000 + n * 10) for n in range(3)]
    again = occurrence(T + 9060, available_at=T + 9800)
    verdict = misfire_check(
        [*late, again], [], action="CATCHUP", catchup_limit=3, max_lateness_seconds=60
    )
    # THEN each outage kept to its limit: the last was not yet due when the first released
    assert not verdict.violations, dict(verdict.violations)
    # AND four late fires that one release could hold are over the limit
    one_release = [*late, occurrence(T + 2700, available_at=T + 9030)]
    verdict = misfire_check(
        one_release, [], action="CATCHUP", catchup_limit=3, max_lateness_seconds=60
    )
    assert set(verdict.violations) == {"late_over_limit"}


def test_oracle_a_late_fire_released_before_an_earlier_one():
    # GIVEN two late fires of one outage, the later instant released first (a repair's)
    stored = [occurrence(T, available_at=T + 5000), occurrence(T + 900, available_at=T + 4000)]
    verdict = misfire_check(stored, [], action="CATCHUP", catchup_limit=5, max_lateness_seconds=0)
    assert set(verdict.violations) == {"late_out_of_order"}


# --- requests ---------------------------------------------------------------------------


O1, O2, GONE = (occurrence_id(SID, 1, T + n) for n in range(3))


@pytest.mark.parametrize(
    ("triggers", "backfills", "expected"),
    [
        ([Trigger(SID, "k", O1, False), Trigger(SID, "k", O2, True)], [], {"trigger_twice"}),
        ([Trigger(SID, None, O1, False), Trigger(SID, None, O2, False)], [], set()),
        ([Trigger(SID, "k", GONE, False)], [], {"trigger_lost"}),
        (
            [],
            [Backfill(SID, T, T + 60, (occurrence_id(SID, 1, T + 60),), False)],
            {"backfill_outside", "backfill_lost"},
        ),
        ([], [Backfill(SID, T, T + 60, ("never",), True)], set()),  # a dry run makes nothing
    ],
)
def test_oracle_requests_name_what_they_made(
    triggers: list[Trigger], backfills: list[Backfill], expected: set[str]
):
    keys = {(k["schedule_id"], k["sk"]) for k in map(occurrence_key, (O1, O2))}
    verdict = Verdict()
    oracle._check_requests(verdict, run_of(triggers=triggers, backfills=backfills), keys)
    assert set(verdict.violations) == expected


def test_oracle_a_run_now_the_hostile_tenant_made_unreadable_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
):
    # GIVEN the hostile tenant's run now, whose item it then made unreadable (only a state)
    evil = f"{schedule_key_prefix('evil')}x"
    made = occurrence_id(evil, 1, T)
    tampered = {**occurrence_key(made), "state": "SUCCEEDED"}
    run = run_of(triggers=[Trigger(evil, None, made, False)], hostile="evil")
    scans = {run.settings.occurrences_table: [tampered]}
    monkeypatch.setattr(oracle, "_scan", lambda run, table: scans.get(table, []))
    run.services = cast(Any, SimpleNamespace(schedules=None))
    # WHEN checked; THEN the item is counted as the tenant's unreadable one, the run now stored
    verdict = oracle.check(run)
    assert (verdict.violations, verdict.hostile_items) == ({}, 1)
    # (and a run now with no item at all is lost)
    scans.clear()
    assert set(oracle.check(run).violations) == {"trigger_lost"}


def test_oracle_names_a_hostile_record_that_failed_a_batch(monkeypatch: pytest.MonkeyPatch):
    # GIVEN a run (nothing stored) where one of the hostile tenant's records failed a batch
    run = run_of(hostile_failures=["sch_evil.x: ValidationError()"])
    empty: Callable[..., list[dict[str, Any]]] = lambda run, table: []  # noqa: E731
    monkeypatch.setattr(oracle, "_scan", empty)
    run.services = cast(Any, SimpleNamespace(schedules=None))
    # WHEN checked; THEN it is named
    assert set(oracle.check(run).violations) == {"hostile_failed_a_batch"}


# --- the ledger ----------------------------------------------------------------------------


def _read(items: list[tuple[int, str, str, str]], hours: list[int], **fields: Any) -> LedgerRead:
    values: dict[str, Any] = {"tenant": "t0", "at": T + 7200, "since": T, "until": T + 10800}
    return LedgerRead(**(values | fields), items=tuple(items), hours=tuple((h, 2) for h in hours))


def _item(at: int, schedule_id: str = SID) -> tuple[int, str, str, str]:
    return at, occurrence_id(schedule_id, 1, at), schedule_id, "DEAD"


@pytest.mark.parametrize(
    ("read", "kind"),
    [
        (_read([_item(T + 60), _item(T + 120, OTHER)], [T]), None),
        (_read([_item(T + 120), _item(T + 60)], [T]), "ledger_read_order"),
        (_read([_item(T + 60), _item(T + 60)], [T]), "ledger_read_order"),
        (_read([_item(T + 60, "sch_t1.xyz")], [T]), "ledger_read_other_tenant"),
        (_read([_item(T - 60)], [T]), "ledger_read_out_of_range"),
        (_read([_item(T + 10800)], []), "ledger_read_out_of_range"),
        (_read([], [T, T]), "ledger_read_hours"),
        (_read([], [T + 3600, T]), "ledger_read_hours"),
    ],
)
def test_oracle_a_ledger_read_lists_its_own_once_in_order_and_in_range(
    read: LedgerRead, kind: str | None
):
    verdict = Verdict()
    oracle._check_ledger_reads(verdict, run_of(ledger_reads=[read]))
    assert set(verdict.violations) == ({kind} if kind else set())


def _entry(o: Occurrence, state: OccurrenceState | None) -> LedgerEntry:
    return LedgerEntry(
        occurrence_id=o.occurrence_id,
        schedule_id=o.schedule_id,
        scheduled_for=o.scheduled_for,
        finding=Finding.DEAD,
        state=state,
    )


@pytest.mark.parametrize(
    ("tenant", "state", "final", "kind"),
    [
        ("t0", OccurrenceState.DEAD, OccurrenceState.DEAD, None),
        ("t0", OccurrenceState.RUNNING, OccurrenceState.DEAD, None),  # (open when checked)
        ("t0", None, None, None),  # (a fire never made: MISSING, MISSED by a policy)
        ("t1", OccurrenceState.DEAD, OccurrenceState.DEAD, "ledger_other_tenant"),
        ("t0", OccurrenceState.DEAD, OccurrenceState.SUCCEEDED, "ledger_wrong_state"),
        ("t0", OccurrenceState.DEAD, None, "ledger_unknown"),
        ("t0", OccurrenceState.MISSED, None, None),  # (the policy's summary: no item)
    ],
)
def test_oracle_a_ledger_entry_is_its_tenants_and_tells_an_ended_state_true(
    tenant: str,
    state: OccurrenceState | None,
    final: OccurrenceState | None,
    kind: str | None,
):
    o = occurrence(T + 60, final or OccurrenceState.DEAD)
    verdict = Verdict()
    oracle._check_entry(verdict, tenant, _entry(o, state), {o.occurrence_id: o} if final else {})
    assert set(verdict.violations) == ({kind} if kind else set())


@pytest.mark.parametrize(
    ("item", "region", "at", "homed"),
    [
        ({}, "us-east-1", T, True),  # (never moved: its first home)
        ({}, "eu-west-1", T, False),
        ({"home_region": "eu-west-1", "homed_since": T}, "us-east-1", T - 1, True),
        ({"home_region": "eu-west-1", "homed_since": T}, "us-east-1", T, False),
        ({"home_region": "eu-west-1", "homed_since": T}, "eu-west-1", T, True),
        ({"home_region": "eu-west-1", "homed_since": T}, "eu-west-1", T - 1, False),
    ],
)
def test_oracle_knows_where_a_schedule_was_checked(
    item: dict[str, Any], region: str, at: int, homed: bool
):
    assert oracle._homed(item, region, at, "us-east-1") is homed


@pytest.mark.parametrize(
    ("shown", "final", "flagged"),
    [
        ("DEAD", OccurrenceState.DEAD, False),
        ("RUNNING", OccurrenceState.DEAD, False),
        ("SUCCEEDED", OccurrenceState.DEAD, True),
        ("DEAD", OccurrenceState.SUCCEEDED, True),
    ],
)
def test_oracle_a_ledger_read_tells_an_ended_state_true(
    shown: str, final: OccurrenceState, flagged: bool
):
    o = occurrence(T + 60, final)
    read = _read([(T + 60, o.occurrence_id, SID, shown)], [T])
    verdict = Verdict()
    oracle._check_ledger_reads(verdict, run_of(ledger_reads=[read]), {o.occurrence_id: o})
    assert ("ledger_read_wrong_state" in verdict.violations) is flagged


@pytest.mark.parametrize(
    ("attempts", "finished"),
    [
        ([{"finished_at": 5}, {"finished_at": 9}], 9),
        ([{"finished_at": 5}, {"started_at": 7}], None),  # (the last one still running)
        ([{"started_at": 5}, {"finished_at": 9}], 9),  # (a LOST one has no end)
        ("none", None),  # (what the hostile tenant wrote)
        ([], None),
        (["x"], None),
        ([{"finished_at": True}], None),
    ],
)
def test_oracle_reads_when_an_occurrences_last_attempt_finished(
    attempts: Any, finished: int | None
):
    assert oracle._finished(attempts) == finished


@pytest.mark.parametrize(("lane", "flagged"), [(Lane.CATCHUP, False), (None, True)])
def test_oracle_a_fire_listed_missed_may_be_made_late_after_all(lane: Lane | None, flagged: bool):
    # (a backfill of a fire the policy recorded MISSED, or a fail-over's rewind, makes it
    # later in the catch-up lane: the page shows its hour as checked)
    o = occurrence(T + 60, OccurrenceState.SUCCEEDED, lane=lane)
    verdict = Verdict()
    oracle._check_entry(verdict, "t0", _entry(o, OccurrenceState.MISSED), {o.occurrence_id: o})
    read = _read([(T + 60, o.occurrence_id, SID, "MISSED")], [T])
    oracle._check_ledger_reads(verdict, run_of(ledger_reads=[read]), {o.occurrence_id: o})
    assert bool(verdict.violations) is flagged
