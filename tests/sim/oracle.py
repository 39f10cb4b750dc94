"""The simulation's invariants, checked against what is stored, and what the workers and the
tenants' clients saw, once the system has drained.

What each schedule should have fired comes from its version history and the time engine
(``expected_occurrences``: the reconciler's recomputation, which never uses the planning
code under test). Across a change of the zone rules a zone-based fire is its wall time: it
fired at the instant the rules of its time gave it, and once (docs/time.md), so the fires
of both rule sets are matched by wall time; near the change either instant may hold it.

Fires and occurrences (per schedule, the hostile tenant's excepted):
- **accounted**: every fire a version owns (due before its successor took over) is stored
  in an explained state, or was recorded MISSED by its misfire policy (a fail-over's known
  limit aside: one the failed region lost in its last unchecked hours, counted);
- **settled**: after the drain nothing is left open (SCHEDULED, RUNNING, RETRY_WAIT), run
  now and backfilled occurrences included;
- **owned**: no stored occurrence lacks an owning version (a paused hour, a wrong instant),
  but runs now and backfills, which the tenant asked for;
- **once**: at most one occurrence per fire (its instant, or its wall time in its zone) that
  ran or will (not MISSED or CANCELED), whoever made it: the materializer, a repair, a
  re-plan, a fail-over's rewind, a backfill;
- **misfires**: an instant its policy recorded MISSED never fired as well; SKIP fires
  nothing late; FIRE_ONCE and CATCHUP(K) fire at most 1 and K of an outage, its latest, in
  order (never an earlier one after a later one: a repair's second late fire).

Runs (the workers' log):
- **never early**, **never stale** (a version not in effect, a canceled schedule's);
- **one at a time**: two runs of one occurrence, or of one SKIP_IF_RUNNING or QUEUE_ONE
  schedule, never overlap while both hold their leases;
- **told to stop**: an attempt whose heartbeat said False is never recorded as finished;
- **QUEUE_ONE**: at most one occurrence waits at a time, and one waiting is not skipped
  while its wait holds.

Clocks: each component's measure of its clock against DynamoDB's answers holds its true
offset, and what it publishes is never more off than its clock is, nor off the other way.

Versions: each one changed something (a repeated pause, resume or cancel, or an update to
what the schedule says already, makes none), and one that kept its predecessor's run
version (a rename) changed only the name, and a change of the name alone kept it; a
rename's run version's occurrences are never canceled by it (**accounted**'s
canceled_without_change).

Payloads: every message a worker received, and every occurrence stored to be sent (not a
MISSED record), carries exactly the payload of the schedule version that owns it (its
version item's: the CURRENT item and its index entries hold only a mark of its size).

The ledger (each region's own table): a tenant's page lists only its own schedules'
occurrences, a state it lists as ended is the occurrence's, and an occurrence DEAD before a
check of its hour is listed DEAD; a tenant's read of it lists its own only, once each, in
time order, in the range it asked.

Requests: a run now asked again with its Idempotency-Key names the same occurrence, and
each one made is stored (its item exists: the hostile tenant may have made its own
unreadable since). Quotas: each tenant's usage equals a recount of its live
schedules. The hostile tenant: none of its items failed a relay batch by itself.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pydantic import ValidationError

from punctual.dal.common import from_dynamo
from punctual.dal.ledger import CHECKED, page_from_item
from punctual.dal.occurrences import first_claim, occurrence_from_item
from punctual.dal.schedules import ScheduleVersion, minute_load_of, missed_ranges_of
from punctual.dal.tables import OCCURRENCE_PREFIX, SCHEDULE_CURRENT, occurrence_key
from punctual.domain.figures import RecentFigures, receivable_lag
from punctual.domain.ids import backfill_tag, occurrence_name, schedule_key_prefix
from punctual.domain.ledger import LedgerEntry
from punctual.domain.occurrence import TERMINAL, Lane, Occurrence, OccurrenceState
from punctual.domain.planning import MAX_CATCHUP_SPREAD
from punctual.domain.policies import MisfireAction, OverlapPolicy
from punctual.domain.schedule import MissedEpisode, Schedule, ScheduleDefinition, ScheduleState
from punctual.pipeline.failover import REWIND_SECONDS
from punctual.pipeline.ownership import Expected, expected_occurrences
from punctual.timing import get_zone, local_wall, use_zone_source
from punctual_client.worker.core import QUEUE_WAIT_SECONDS, Outcome
from tests.sim.workers import Event, HandlerRun, payload_digest
from tests.sim.world import DAY, DRAIN_SECONDS, HOUR, OLD_RULES, Run

S = OccurrenceState
_OPEN = (S.SCHEDULED, S.RUNNING, S.RETRY_WAIT)
_NOT_RUN = (S.MISSED, S.CANCELED)
_LIVE = (ScheduleState.ACTIVE.value, ScheduleState.PAUSED.value)
_ONE_AT_A_TIME = (OverlapPolicy.SKIP_IF_RUNNING, OverlapPolicy.QUEUE_ONE)
# Around a change of the zone rules, a wall time may hold its old or its new instant: one
# planned ahead under the old rules stays if it became receivable before the re-plan.
_CHANGE_MARGIN = 15 * 60
EXAMPLES = 5


@dataclass
class Verdict:
    schedules: int = 0
    schedule_days: float = 0.0
    occurrences: int = 0
    runs: int = 0
    fires_checked: int = 0
    missed_by_policy: int = 0
    fired_late: int = 0  # late fires a misfire policy released (or a repair within it)
    manual: int = 0  # runs now and backfilled occurrences checked
    payloads: int = 0  # messages received and occurrences stored whose payload was checked
    left_by_failover: int = 0  # due before a take-over, lost by the failed region (known)
    hostile_items: int = 0  # the hostile tenant's items no reader could parse
    ledger_pages: int = 0  # tenants' ledger pages read (both regions)
    ledger_checked: int = 0  # DEAD occurrences looked for on their ledger page, and found
    ledger_items: int = 0  # items tenants' ledger reads listed
    # Fires found stored at an instant only the schedule's DST choice gives (a gap's end, the
    # later or second instant of a repeated wall time): where the choice was honoured.
    dst_moved: int = 0
    figures_reads: int = 0  # schedules' recent figures read by their honest tenants, checked
    estimated_runs: int = 0  # runs whose worker knew its clock's offset (never early: checked)
    clock_measures: int = 0  # components' estimates of their clock's offset, checked
    clock_skews_seen: int = 0  # of which said the clock is off (a skew of 2 s or more is)
    # The required fires the oracle checked and found stored (what a deletion must break).
    found: set[str] = field(default_factory=set)
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def flag(self, kind: str, what: str) -> None:
        self.violations[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(what)


@dataclass
class _Fire:
    """One fire a version owns: its occurrence under the rules of its time (one id), or,
    near a change of the zone rules, under either set (two ids, one wall time)."""

    version: int
    alternatives: list[Expected]
    required: bool
    superseded: bool = False  # due after its successor took over (by more than the horizon)

    @property
    def first(self) -> Expected:
        return self.alternatives[0]


def _scan(run: Run, table: str) -> list[dict[str, Any]]:
    pages = run.services.dynamodb.get_paginator("scan").paginate(
        TableName=table, ConsistentRead=True
    )
    return [from_dynamo(i) for page in pages for i in page["Items"]]


def _hostile(run: Run, schedule_id: str) -> bool:
    return run.hostile is not None and schedule_id.startswith(schedule_key_prefix(run.hostile))


def check(run: Run) -> Verdict:
    verdict = Verdict(runs=len(run.runs))
    settings = run.settings
    services = run.services
    until = run.end + DRAIN_SECONDS - 600  # every fire due by then has had time to settle
    horizon = settings.planned_horizon_seconds + 180
    current = {
        i["schedule_id"]: i
        for i in _scan(run, settings.schedules_table)
        if i["sk"] == SCHEDULE_CURRENT
    }
    stored: dict[str, list[Occurrence]] = defaultdict(list)
    keys: set[tuple[str, str]] = set()  # every occurrence item's key, readable or not
    payloads: dict[str, Any] = {}  # the payload of each occurrence stored to be sent
    ended: dict[str, int] = {}  # when each occurrence's last attempt finished, if it did
    started: dict[str, int] = {}  # when each occurrence's first attempt started, if it did
    for item in _scan(run, settings.occurrences_table):
        if not str(item["sk"]).startswith(OCCURRENCE_PREFIX):
            continue
        keys.add((item["schedule_id"], item["sk"]))
        try:
            occurrence = occurrence_from_item(item)
            stored[item["schedule_id"]].append(occurrence)
            if occurrence.state is not S.MISSED:  # (a MISSED record is never sent)
                payloads[occurrence.occurrence_id] = item.get("payload")
            finished = _finished(item.get("attempts"))
            if finished is not None:
                ended[occurrence.occurrence_id] = finished
            if (claimed := first_claim(item)) is not None:
                started[occurrence.occurrence_id] = claimed
        except (ValidationError, KeyError, ValueError, TypeError):
            if _hostile(run, str(item["schedule_id"])):
                verdict.hostile_items += 1
            else:
                verdict.flag("unreadable", f"{item['schedule_id']} {item['sk']}")
    histories = {sid: services.schedules.versions_since(sid, 0) for sid in current}
    home = _Accounted(run)
    honest = [sid for sid in current if not _hostile(run, sid)]
    verdict.schedules = len(honest)
    for sid in honest:
        versions = histories[sid]
        born = versions[0].effective_from
        verdict.schedule_days += max(0, run.end - max(born, run.start)) / DAY
        fires = _fires(versions, run.start, until, horizon, run.rules_changed_at)
        _check_schedule(
            verdict, current[sid], versions, fires, stored[sid], run, home, until, horizon
        )
        _check_versions(verdict, versions)
        _count_dst_moved(verdict, versions, fires)
        verdict.occurrences += len(stored[sid])
    overlap = {
        (sid, v.schedule.version): v.schedule.overlap for sid in honest for v in histories[sid]
    }
    _check_runs(verdict, run, overlap)
    _check_queue_one(verdict, run, {k for k, p in overlap.items() if p is OverlapPolicy.QUEUE_ONE})
    _check_requests(verdict, run, keys)
    _check_payloads(verdict, run, {sid: histories[sid] for sid in honest}, payloads)
    _check_quota(verdict, run, current)
    _check_ledger(verdict, run, current, {sid: stored[sid] for sid in honest}, ended)
    _check_ledger_reads(verdict, run, {o.occurrence_id: o for sid in honest for o in stored[sid]})
    _check_figures_reads(verdict, run, {sid: stored[sid] for sid in honest}, started)
    _check_clock_measures(verdict, run)
    for failure in run.hostile_failures:
        verdict.flag("hostile_failed_a_batch", failure)
    return verdict


def _check_clock_measures(verdict: Verdict, run: Run) -> None:
    """Each component's measure of its clock against DynamoDB's (the Date of its answers:
    the run's true clock plus ``server_ahead``) holds its true offset (that minus its skew)
    within its bounds; what it publishes (``least``) is never farther from zero than the
    true offset, nor on the other side of it."""
    for component, found in run.measured:
        verdict.clock_measures += 1
        offset = run.server_ahead - run.skews[component]
        if not found.low - 1e-6 <= offset <= found.high + 1e-6:
            verdict.flag("clock_bounds", f"{component} offset {offset}: {found}")
        if found.least * offset < 0 or abs(found.least) > abs(offset) + 1e-6:
            verdict.flag("clock_published", f"{component} offset {offset}: {found.least}")
        verdict.clock_skews_seen += found.least != 0


def _check_versions(verdict: Verdict, versions: list[ScheduleVersion]) -> None:
    """Every version changed something: a repeated pause, resume or cancel, or an update to
    what the schedule says already, is answered as done and makes none; and a version that
    keeps its predecessor's run version (a rename) changed nothing else."""
    for before, after in pairwise(versions):
        old, new = before.schedule, after.schedule
        said = (old.model_dump(include=_DEFINITION), old.state)
        if said == (new.model_dump(include=_DEFINITION), new.state):
            verdict.flag("version_without_change", f"{new.schedule_id} v{new.version}")
        # (Not the state: a version item records the state it was written in, and the
        # materializer completes a schedule without a version.)
        runs = _DEFINITION - {"name"}
        kept = new.run_version == old.run_version
        same_runs = old.model_dump(include=runs) == new.model_dump(include=runs)
        if kept and not same_runs:
            verdict.flag("run_version_kept_by_a_change", f"{new.schedule_id} v{new.version}")
        if not kept and same_runs and old.state is new.state:
            # A rename that took a run version of its own supersedes (cancels) what ran.
            verdict.flag("rename_superseded", f"{new.schedule_id} v{new.version}")


_DEFINITION = set(ScheduleDefinition.model_fields)


# --- what each schedule should have fired ---------------------------------------------------


def _fires(
    versions: list[ScheduleVersion], start: int, until: int, horizon: int, changed: int | None
) -> list[_Fire]:
    """The fires of ``versions`` in [start, until): under the rules in use, or, across a
    change of the rules at ``changed``, under 2025b before it and the pinned rules after,
    matched by wall time."""
    if changed is None:
        return [
            _Fire(e.version, [e], e.required, not e.required)
            for e in expected_occurrences(versions, start, until, horizon=horizon)
        ]
    zones = {v.schedule.version: v.schedule.zone_name for v in versions}
    sets = []
    for rules in (OLD_RULES, None):
        use_zone_source(rules)
        try:
            found = expected_occurrences(versions, start, until, horizon=horizon)
            sets.append(_by_wall(found, zones))
        finally:
            use_zone_source(None)
    old, new = sets
    fires = []
    for key in old.keys() | new.keys():
        before, after = old.get(key), new.get(key)
        superseded = not all(e.required for e in (before, after) if e is not None)
        required = not superseded and (
            (before is not None and before.available_at < changed - _CHANGE_MARGIN)
            or (after is not None and after.available_at >= changed + _CHANGE_MARGIN)
        )
        # Before the change only the old rules' instant; after it only the new one's.
        if before is not None and before.available_at < changed - _CHANGE_MARGIN:
            alternatives = [before]
        elif after is not None and after.available_at >= changed + _CHANGE_MARGIN:
            alternatives = [after] + ([before] if before and before.available_at < changed else [])
        else:
            alternatives = [e for e in (before, after) if e is not None]
        unique = {e.occurrence_id: e for e in alternatives}
        fires.append(_Fire(key[0], list(unique.values()), required, superseded))
    return sorted(fires, key=lambda f: f.first.scheduled_for)


def _count_dst_moved(verdict: Verdict, versions: list[ScheduleVersion], fires: list[_Fire]) -> None:
    schedules = {v.schedule.version: v.schedule for v in versions}
    for fire in fires:
        spec = schedules[fire.version].spec
        if spec.dst is None or fire.first.occurrence_id not in verdict.found:
            continue
        at = fire.first.scheduled_for
        if at not in spec.model_copy(update={"dst": None}).rule().fires(at - 1, at):
            verdict.dst_moved += 1


def _by_wall(
    found: list[Expected], zones: dict[int, str | None]
) -> dict[tuple[int, str, int], Expected]:
    """Expected fires by version, wall time and pass: a repeated wall time a schedule fires
    at BOTH instants (docs/time.md) has two fires, the first pass's 0 and the second's 1."""
    passes: Counter[tuple[int, str]] = Counter()
    keyed = {}
    for e in sorted(found, key=lambda e: e.scheduled_for):
        wall = _wall_key(e, zones[e.version])
        keyed[(*wall, passes[wall])] = e
        passes[wall] += 1
    return keyed


def _wall_key(expected: Expected, zone: str | None) -> tuple[int, str]:
    if zone is None:
        return expected.version, str(expected.scheduled_for)
    return expected.version, local_wall(expected.scheduled_for, get_zone(zone)).isoformat()


def _manual(occurrence: Occurrence) -> str | None:
    """Its manual tag: a run now's, or the schedule's backfill tag; None for a fire's."""
    return occurrence_name(occurrence.occurrence_id)[3]


def _check_schedule(
    verdict: Verdict,
    item: dict[str, Any],
    versions: list[ScheduleVersion],
    fires: list[_Fire],
    occurrences: list[Occurrence],
    run: Run,
    home: _Accounted,
    until: int,
    horizon: int,
) -> None:
    by_id = {o.occurrence_id: o for o in occurrences}
    owned = {e.occurrence_id: fire for fire in fires for e in fire.alternatives}
    schedules = {v.schedule.version: v.schedule for v in versions}
    ranges = missed_ranges_of(item)
    unsettled = _check_fires(verdict, item, versions, fires, by_id, ranges, run, home, until)
    _check_occurrences(verdict, item, versions, occurrences, owned, run, until, horizon)
    _check_once(verdict, occurrences, schedules)
    lookahead = run.settings.lookahead_seconds + 2 * run.settings.tick_seconds
    _check_misfires(
        verdict,
        fires,
        by_id,
        ranges,
        schedules,
        run.skew,
        run.backfilled_ids,
        run.failed_over_at,
        lookahead,
        run.rewind,
    )
    for o in occurrences:
        if o.state in _OPEN and o.available_at <= until and o.occurrence_id not in unsettled:
            verdict.flag("unsettled", f"{o.occurrence_id} {o.state.value}")


def _check_fires(
    verdict: Verdict,
    item: dict[str, Any],
    versions: list[ScheduleVersion],
    fires: list[_Fire],
    by_id: dict[str, Occurrence],
    ranges: list[MissedEpisode],
    run: Run,
    home: _Accounted,
    until: int,
) -> set[str]:
    """Each required fire due by ``until`` has its occurrence (else the misfire policy
    recorded it MISSED, or a fail-over lost it), and that occurrence ended as its schedule
    allows; the ids of those flagged unsettled (not flagged again as occurrences)."""
    schedules = {v.schedule.version: v.schedule for v in versions}
    # (A rename keeps the run version: its occurrences stay the latest's, never canceled.)
    latest = versions[-1].schedule.run_version
    unsettled: set[str] = set()
    for fire in fires:
        e = fire.first
        if not fire.required or e.available_at > until:
            continue
        verdict.fires_checked += 1
        found = [by_id[a.occurrence_id] for a in fire.alternatives if a.occurrence_id in by_id]
        covered = any(
            r.covers(a.version, a.scheduled_for) for r in ranges for a in fire.alternatives
        )
        if not found:
            if covered:
                verdict.missed_by_policy += 1
            elif _failed_regions(fire.alternatives, item, run, home):
                verdict.left_by_failover += 1
            else:
                verdict.flag("missing", f"{e.occurrence_id} (due {e.available_at})")
            continue
        verdict.found.update(o.occurrence_id for o in found)
        settled = [o for o in found if o.state is not S.CANCELED] or found
        o = settled[0]
        if _check_fire_ended(verdict, o, schedules[e.version], e.version == latest, covered):
            unsettled.add(o.occurrence_id)
    return unsettled


def _check_fire_ended(
    verdict: Verdict, o: Occurrence, schedule: Schedule, of_latest: bool, covered: bool
) -> bool:
    """A fire's occurrence ended as its schedule allows: canceled only by a change (or a
    pause, or as MISSED), skipped only under an overlap policy; whether it was flagged
    unsettled (still open)."""
    if o.state in _OPEN:
        verdict.flag("unsettled", f"{o.occurrence_id} {o.state.value}")
        return True
    if (
        o.state is S.CANCELED
        and of_latest
        and schedule.state not in (ScheduleState.CANCELED, ScheduleState.PAUSED)
        and not covered
    ):
        verdict.flag("canceled_without_change", o.occurrence_id)
    elif o.state is S.SKIPPED_OVERLAP and schedule.overlap not in _ONE_AT_A_TIME:
        verdict.flag("skipped_without_policy", o.occurrence_id)
    elif o.state is S.MISSED:
        verdict.missed_by_policy += 1
    return False


def _check_occurrences(
    verdict: Verdict,
    item: dict[str, Any],
    versions: list[ScheduleVersion],
    occurrences: list[Occurrence],
    owned: dict[str, _Fire],
    run: Run,
    until: int,
    horizon: int,
) -> None:
    """Each occurrence is a fire's (one made in the run's window by no fire is flagged),
    a backfilled one on its rule, and a superseded fire's ran only before its change."""
    schedules = {v.schedule.version: v.schedule for v in versions}
    backfilled = backfill_tag(item["schedule_id"])
    for o in occurrences:
        tag = _manual(o)
        if tag is not None:
            if tag == backfilled and o.occurrence_id not in owned:
                _check_backfilled(verdict, o, schedules)
            continue
        if o.occurrence_id not in owned and run.start <= o.scheduled_for <= until - horizon:
            verdict.flag("unowned", f"{o.occurrence_id} {o.state.value}")
        elif (
            o.state is S.SUCCEEDED
            and o.occurrence_id in owned
            and owned[o.occurrence_id].superseded
        ):
            _check_superseded_run(verdict, o, versions, run.skew)


def _failed_regions(
    alternatives: list[Expected], item: dict[str, Any], run: Run, home: _Accounted
) -> bool:
    """Due before a take-over moved the schedule, in an hour the failed region's reconciler
    left unaccounted for (it had not come to it yet, or it was down, or it deferred a gap to
    a walk that stood behind, or lost a repair's race): a fire that region lost there is
    repaired by neither (docs/multi-region.md, *What a fail-over cannot repair*: the new
    region leaves what was due before ``homed_since`` to the failed region's table; the
    failed region's reconciler no longer checks a schedule homed elsewhere). Counted, not a
    violation: a known limit. A fire missing from an hour the failed region checked to the
    end (every gap repaired) is a violation: its check or its repair failed. (Around a
    change of the zone rules a fire has two instants, maybe in two hours: the reconciler
    looked for it at the one its rules gave, so either hour left unchecked excuses it.)"""
    since = item.get("homed_since")
    e = alternatives[0]
    if run.failed_over_at is None or since is None or e.available_at > int(since):
        return False
    accounted = home.accounted(int(item["shard"]))
    return any(a.scheduled_for - a.scheduled_for % HOUR not in accounted for a in alternatives)


class _Accounted:
    """The hours whose every gap the home region's reconciler accounted for, per shard: a
    complete, repairing check that deferred nothing and lost no repair's race (what is in
    flight may still be open: the gaps were filled). Read once per shard from the home
    region's leases table; the new region keeps its reports in its own."""

    def __init__(self, run: Run) -> None:
        self._run = run
        first = run.start - run.start % HOUR - HOUR
        last = (run.failed_over_at or run.start) + HOUR
        self._windows = [(h, h + HOUR) for h in range(first, last, HOUR)]
        self._by_shard: dict[int, set[int]] = {}

    def accounted(self, shard: int) -> set[int]:
        if shard not in self._by_shard:
            found = self._run.services.reports.in_windows(shard, self._windows)
            self._by_shard[shard] = {
                start
                for (start, _), r in found.items()
                if r.complete and r.repair and r.deferred == 0 and r.repair_conflicts == 0
            }
        return self._by_shard[shard]


def _check_superseded_run(
    verdict: Verdict, o: Occurrence, versions: list[ScheduleVersion], skew: int
) -> None:
    # A run up to ``skew`` early (the relay's clock ahead, as the run injects it) can come
    # before a change made in those seconds: legitimate, as the run-time check (stale_run)
    # judges it. Superseded earlier than that, its run is a bug.
    successor = next(
        (v.effective_from for v in versions if v.schedule.run_version > o.schedule_version),
        None,
    )
    if successor is None or successor <= o.available_at - skew:
        verdict.flag("superseded_ran", o.occurrence_id)


def _check_backfilled(verdict: Verdict, o: Occurrence, schedules: dict[int, Schedule]) -> None:
    """A backfilled occurrence is a fire of its version's rule (the rule's instant)."""
    verdict.manual += 1
    schedule = schedules.get(o.schedule_version)
    if schedule is None or schedule.rule().next_after(o.scheduled_for - 1) != o.scheduled_for:
        verdict.flag("backfilled_off_rule", o.occurrence_id)


def _once_key(o: Occurrence, schedules: dict[int, Schedule]) -> tuple[str, str]:
    schedule = schedules.get(o.schedule_version)
    zone = schedule.zone_name if schedule is not None else None
    if zone is not None and o.local is not None:
        return zone, o.local
    return "", str(o.scheduled_for)


def _check_once(
    verdict: Verdict, occurrences: list[Occurrence], schedules: dict[int, Schedule]
) -> None:
    """One fire, one occurrence that ran or will: by instant, and by wall time in its zone."""
    by_instant: Counter[int] = Counter()
    by_wall: Counter[tuple[str, str]] = Counter()
    for o in occurrences:
        tag = _manual(o)
        if o.state in _NOT_RUN or (tag is not None and tag != backfill_tag(o.schedule_id)):
            continue
        by_instant[o.scheduled_for] += 1
        by_wall[_once_key(o, schedules)] += 1
    for instant, count in by_instant.items():
        if count > 1:
            verdict.flag("fired_twice", f"{occurrences[0].schedule_id} at {instant}")
    for (zone, wall), count in by_wall.items():
        if count > 1 and zone:
            verdict.flag("fired_twice", f"{occurrences[0].schedule_id} at {wall} {zone}")


def _check_misfires(
    verdict: Verdict,
    fires: list[_Fire],
    by_id: dict[str, Occurrence],
    ranges: list[MissedEpisode],
    schedules: dict[int, Schedule],
    skew: int,
    backfilled: set[str],
    failed_over: int | None,
    lookahead: int,
    rewind: int = REWIND_SECONDS,
) -> None:
    """What each misfire policy lets exist of an outage: per version, its fires in order,
    each missed, fired late (released by the policy: later than max_lateness), or on time."""
    per_version: dict[int, list[tuple[str, Occurrence | None]]] = defaultdict(list)

    def rewound(o: Occurrence) -> bool:
        """Due in the minutes a fail-over planned again (or planned ahead by the failed
        region, up to its lookahead): the new region judges them late and, under SKIP,
        records them MISSED, not knowing that the failed region delivered them
        (docs/multi-region.md, *Why the rewind*)."""
        return (
            failed_over is not None
            and failed_over - rewind - 60 <= o.available_at <= failed_over + lookahead
        )

    for fire in fires:
        if not fire.required:
            continue
        found = [by_id[a.occurrence_id] for a in fire.alternatives if a.occurrence_id in by_id]
        live = next((o for o in found if o.state not in _NOT_RUN), None)
        if live is not None and live.occurrence_id in backfilled:
            continue  # the tenant asked for it (a backfill may run a missed fire)
        covered = any(
            r.covers(a.version, a.scheduled_for) for r in ranges for a in fire.alternatives
        )
        if covered and live is not None and not rewound(live):
            # The policy settled this instant as MISSED, and something fired it anyway.
            verdict.flag("missed_and_fired", live.occurrence_id)
        lateness = schedules[fire.version].misfire.max_lateness_seconds
        due = next(
            (
                a.available_at
                for a in fire.alternatives
                if live and a.occurrence_id == live.occurrence_id
            ),
            fire.first.available_at,
        )
        if covered or any(o.state is S.MISSED for o in found):
            per_version[fire.version].append(("missed", None))
        elif live is not None and live.available_at - due > lateness + skew:
            per_version[fire.version].append(("late", live))
        else:
            per_version[fire.version].append(("ok", None))
    for version, statuses in per_version.items():
        misfire = schedules[version].misfire
        limit = misfire.effective_catchup_limit
        late = [o for status, o in statuses if status == "late" and o is not None]
        verdict.fired_late += len(late)
        if misfire.action is MisfireAction.SKIP:
            for o in late:
                verdict.flag("late_under_skip", o.occurrence_id)
            continue
        _check_outages(verdict, statuses, limit)


def _check_outages(
    verdict: Verdict, statuses: list[tuple[str, Occurrence | None]], limit: int
) -> None:
    """Within an outage (a run of fires not on time), late fires are released in their own
    order, and after a recorded miss at most ``limit`` of them come in one catch-up."""
    previous: Occurrence | None = None
    burst: list[Occurrence] = []  # late fires released by one catch-up (within SQS's delay)
    for status, o in statuses:
        if status == "ok":
            previous, burst = None, []
            continue
        if status == "missed":
            burst = []
            continue
        assert o is not None
        if previous is not None and o.available_at < previous.available_at:
            verdict.flag("late_out_of_order", f"{o.occurrence_id} before {previous.occurrence_id}")
        previous = o
        if burst and (
            o.available_at > burst[0].available_at + MAX_CATCHUP_SPREAD + 60
            # Not yet due when the burst's step released its first: a later step's (the
            # materializer down again after catching up), its own outage's catch-up.
            or o.scheduled_for > burst[0].available_at
        ):
            burst = []  # another outage's catch-up
        burst.append(o)
        if len(burst) > limit:
            verdict.flag("late_over_limit", o.occurrence_id)


# --- runs -------------------------------------------------------------------------------


def _check_runs(verdict: Verdict, run: Run, overlap: dict[tuple[str, int], OverlapPolicy]) -> None:
    honest = [r for r in run.runs if not _hostile(run, r.schedule_id)]
    for r in honest:
        # The relay computes each delay on its own clock: one that runs ahead makes a
        # message receivable early by as much. The run injects up to ``skew`` seconds of it;
        # beyond that, early is a bug.
        if r.started + run.skew < r.available:
            verdict.flag("early", f"{r.occurrence_id} ran at {r.started}, available {r.available}")
        # A worker that measured its clock's offset holds a message received before its
        # instant (early delivery, a relay's clock ahead) until then: by the true clock.
        if r.estimated and r.started < r.available:
            verdict.flag(
                "early_start", f"{r.occurrence_id} ran at {r.started}, available {r.available}"
            )
        verdict.estimated_runs += r.estimated
        if r.current != r.version or r.state not in (
            ScheduleState.ACTIVE.value,
            ScheduleState.COMPLETED.value,
        ):
            verdict.flag(
                "stale_run",
                f"{r.occurrence_id} (v{r.version}) ran while v{r.current} was {r.state}",
            )
        if r.stopped:
            _check_stopped(verdict, r, run)
    for a, b in _overlapping(honest):
        if a.lapsed or b.lapsed:
            continue  # the lease ran out: the run may have passed on (docs/worker.md)
        if a.occurrence_id == b.occurrence_id:
            verdict.flag("ran_at_once", f"{a.occurrence_id} attempts {a.attempt}, {b.attempt}")
        elif (
            a.schedule_id == b.schedule_id
            and overlap.get((a.schedule_id, a.version)) in _ONE_AT_A_TIME
            and overlap.get((b.schedule_id, b.version)) in _ONE_AT_A_TIME
        ):
            verdict.flag("overlapped", f"{a.occurrence_id} and {b.occurrence_id}")


def _overlapping(runs: list[HandlerRun]) -> Iterable[tuple[HandlerRun, HandlerRun]]:
    by_schedule: dict[str, list[HandlerRun]] = defaultdict(list)
    for r in runs:
        by_schedule[r.schedule_id].append(r)
    for group in by_schedule.values():
        group.sort(key=lambda r: r.started)
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if b.started >= a.ended:
                    break
                yield a, b


def _check_stopped(verdict: Verdict, r: HandlerRun, run: Run) -> None:
    """A run told to stop (a heartbeat said False) is recorded as nothing: the attempt ends
    LOST when another takes the occurrence over, never SUCCEEDED, RETRY or DEAD."""
    found = run.services.occurrences.get_with_attempts(r.occurrence_id)
    if found is None:
        return
    for attempt in found[1]:
        if attempt.attempt_no == r.attempt and attempt.outcome.value in (
            "SUCCEEDED",
            "RETRY",
            "DEAD",
        ):
            verdict.flag(
                "stopped_but_recorded", f"{r.occurrence_id} attempt {r.attempt} {attempt.outcome}"
            )


def _check_queue_one(verdict: Verdict, run: Run, queue_one: set[tuple[str, int]]) -> None:
    """At most one occurrence of a QUEUE_ONE schedule waits at a time; one that waits is
    not skipped while its wait holds (it runs next)."""
    schedules = {sid for sid, _ in queue_one}
    holds = QUEUE_WAIT_SECONDS - 2 * run.skew
    waiting: dict[str, dict[str, float]] = defaultdict(dict)
    for event in run.events:
        if event.schedule_id not in schedules:
            continue
        mine = waiting[event.schedule_id]
        if event.what == Outcome.WAITING:
            others = [
                o for o, t in mine.items() if o != event.occurrence_id and event.at < t + holds
            ]
            if others:
                verdict.flag("two_waiting", f"{event.occurrence_id} beside {others[0]}")
            mine[event.occurrence_id] = event.at
        elif event.what == Outcome.SKIPPED_OVERLAP:
            since = mine.pop(event.occurrence_id, None)
            if since is not None and event.at < since + holds:
                verdict.flag("waiting_skipped", event.occurrence_id)
        elif event.what in ("START", *_FINAL) or event.detail.startswith(_UNDONE):
            # Claimed (the claim empties the wait slot), or done with: no longer waiting. (A
            # processing that raised may have claimed it too: not known to be waiting.)
            mine.pop(event.occurrence_id, None)


# Outcomes that say the occurrence was claimed (a claim empties its wait slot), whatever
# came of it (clients/python/punctual_client/worker/core.py): it runs under a lease (its
# own claim, whose answer was lost, among them), or a claim was undone after the schedule
# could not be read or changed; and a processing that raised may have claimed it.
_UNDONE = (
    "another worker holds the lease",
    "the schedule could not be read",
    "a stale claim",
    "raised",
)
_FINAL = (
    Outcome.SUCCEEDED,
    Outcome.DEAD,
    Outcome.STALE,
    Outcome.ALREADY_DONE,
    Outcome.REJECTED,
)


# --- requests, quotas -------------------------------------------------------------------


def _check_requests(verdict: Verdict, run: Run, keys: set[tuple[str, str]]) -> None:
    """Each run now and backfilled occurrence made is stored: its item exists, by key (the
    hostile tenant may have made its own unreadable since, which is not a loss)."""

    def stored(occurrence_id: str) -> bool:
        key = occurrence_key(occurrence_id)
        return (key["schedule_id"], key["sk"]) in keys

    named: dict[tuple[str, str], set[str]] = defaultdict(set)
    for trigger in run.triggers:
        verdict.manual += 1
        if not stored(trigger.occurrence_id):
            verdict.flag("trigger_lost", trigger.occurrence_id)
        if trigger.key is not None:
            named[(trigger.schedule_id, trigger.key)].add(trigger.occurrence_id)
    for (sid, key), named_ids in named.items():
        if len(named_ids) > 1:
            verdict.flag("trigger_twice", f"{sid} key {key}: {sorted(named_ids)}")
    for backfill in run.backfills:
        if backfill.dry_run:
            continue
        for made in backfill.made:
            if not stored(made):
                verdict.flag("backfill_lost", made)
            instant = occurrence_name(made)[2]
            if not backfill.since <= instant < backfill.until:
                verdict.flag(
                    "backfill_outside", f"{made} not in [{backfill.since}, {backfill.until})"
                )


def _check_payloads(
    verdict: Verdict,
    run: Run,
    histories: dict[str, list[ScheduleVersion]],
    stored: dict[str, Any],
) -> None:
    """Every message received and every occurrence stored to be sent carries the payload of
    the schedule version it names (the one that owns it), exactly."""
    owned = {
        (sid, v.schedule.version): payload_digest(v.schedule.known_payload)
        for sid, versions in histories.items()
        for v in versions
    }
    for d in run.deliveries:
        if _hostile(run, d.schedule_id):
            continue
        verdict.payloads += 1
        if owned.get((d.schedule_id, d.version)) != d.payload:
            verdict.flag(
                "wrong_payload",
                f"{d.occurrence_id} delivered {d.size} bytes, not version {d.version}'s",
            )
    for oid, payload in stored.items():
        sid, version, _, _ = occurrence_name(oid)
        if sid not in histories:
            continue  # (the hostile tenant's)
        verdict.payloads += 1
        if not isinstance(payload, dict) or owned.get((sid, version)) != payload_digest(payload):
            verdict.flag("wrong_payload", f"{oid} stored a payload not version {version}'s")


def _check_quota(verdict: Verdict, run: Run, current: dict[str, dict[str, Any]]) -> None:
    live: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in current.values():
        if item["state"] in _LIVE:
            live[item["tenant_id"]].append(item)
    for tenant in _scan(run, run.settings.tenants_table):
        if tenant.get("sk") != "TENANT":
            continue
        tenant_id = tenant["tenant_id"]
        count = len(live[tenant_id])
        if int(tenant.get("schedule_count", 0)) != count:
            verdict.flag(
                "quota_count", f"{tenant_id}: usage {tenant.get('schedule_count')}, live {count}"
            )
        load: Counter[int] = Counter()
        for item in live[tenant_id]:
            load.update(minute_load_of(item))
        for minute in range(60):
            if int(tenant.get(f"f{minute:02d}", 0)) != load[minute]:
                verdict.flag("quota_load", f"{tenant_id} minute {minute}")
                break


__all__ = ["Event", "Verdict", "check"]


def _finished(attempts: Any) -> int | None:
    """When an item's last attempt finished, if it did (an earlier one may have been LOST,
    with no end of its own; what the hostile tenant wrote there may be anything: None)."""
    if not isinstance(attempts, list) or not attempts or not isinstance(attempts[-1], dict):
        return None
    end = attempts[-1].get("finished_at")
    if not isinstance(end, int | float) or isinstance(end, bool):
        return None
    return int(end)


def _check_ledger(
    verdict: Verdict,
    run: Run,
    current: dict[str, dict[str, Any]],
    stored: dict[str, list[Occurrence]],
    ended: dict[str, int],
) -> None:
    """Each region's ledger pages (its own table): a tenant's page lists only its own
    schedules' occurrences (never another's, whatever the hostile tenant's items say); a
    state it lists as ended is the occurrence's state; and every honest occurrence that ended
    DEAD before a check of its hour and shard (its last attempt finished a margin before) is
    listed DEAD on its tenant's page of that check, when its schedule was homed there."""
    margin = 10 * 60 + 2 * run.skew  # (clocks apart, and a stale read of a DEAD a moment old)
    by_id = {o.occurrence_id: o for found in stored.values() for o in found}
    for settings in (run.settings, *([run.other] if run.other else [])):
        checked: dict[tuple[int, int], int] = {}
        listed: dict[tuple[str, int, int], dict[str, LedgerEntry]] = {}
        for item in _scan(run, settings.ledger_table):
            if str(item["pk"]).startswith(CHECKED + "#"):
                hour, shard = (int(part) for part in str(item["sk"]).split("#"))
                checked[(hour, shard)] = int(item["checked_at"])
                continue
            try:
                page = page_from_item(item)
            except (ValidationError, ValueError, TypeError, KeyError):
                verdict.flag("ledger_unreadable", f"{item['pk']} {item['sk']}")
                continue
            verdict.ledger_pages += 1
            if page.tenant_id == run.hostile:
                continue
            for entry in page.entries:
                _check_entry(verdict, page.tenant_id, entry, by_id)
            if not page.unlisted:
                listed[(page.tenant_id, page.hour, page.shard)] = {
                    e.occurrence_id: e for e in page.entries
                }
        for sid, found in stored.items():
            tenant, shard = str(current[sid]["tenant_id"]), int(current[sid]["shard"])
            for o in found:
                if o.state is not S.DEAD or o.occurrence_id not in ended:
                    continue
                hour = o.scheduled_for - o.scheduled_for % HOUR
                at = checked.get((hour, shard))
                if at is None or ended[o.occurrence_id] + margin > at:
                    continue
                if not _homed(current[sid], settings.region, at, run.settings.region):
                    continue
                verdict.ledger_checked += 1
                shown = listed.get((tenant, hour, shard), {}).get(o.occurrence_id)
                if shown is None or shown.state is not S.DEAD:
                    verdict.flag("ledger_dead_unlisted", f"{o.occurrence_id} on {settings.region}")


def _check_entry(
    verdict: Verdict, tenant: str, entry: LedgerEntry, by_id: dict[str, Occurrence]
) -> None:
    if not entry.schedule_id.startswith(schedule_key_prefix(tenant)):
        verdict.flag("ledger_other_tenant", f"{entry.occurrence_id} on {tenant}'s page")
        return
    found = by_id.get(entry.occurrence_id)
    if entry.state not in (None, S.MISSED) and found is None:
        # (MISSED with no item: the misfire policy's summary recorded it)
        verdict.flag("ledger_unknown", f"{entry.occurrence_id} listed {entry.state}")
    elif _ended_otherwise(entry.state, found):
        verdict.flag("ledger_wrong_state", f"{entry.occurrence_id} {entry.state} is {found}")


def _ended_otherwise(shown: str | None, found: Occurrence | None) -> bool:
    """A page or a read said an occurrence had ended one way, and it ended another. (A fire
    recorded MISSED may be made later all the same, in the catch-up lane: a backfill asked
    for it, a fail-over's rewind; the page shows its hour as its check found it.)"""
    if found is None or shown not in TERMINAL or found.state.value == shown:
        return False
    return not (shown == S.MISSED and found.lane is Lane.CATCHUP)


def _homed(item: dict[str, Any], region: str, at: int, home: str) -> bool:
    """Whether the schedule was planned (and checked) in ``region`` at ``at``: its home now
    since ``homed_since``, or before that its first home (one take-over in a run)."""
    since = item.get("homed_since")
    now_home = str(item.get("home_region") or home)
    if since is None or at >= int(since):
        return now_home == region
    return region == home and now_home != home


def _check_ledger_reads(
    verdict: Verdict, run: Run, final: dict[str, Occurrence] | None = None
) -> None:
    """What tenants' reads of their ledger listed: their own schedules only, in one strict
    time order across pages (none twice), inside the range asked, an ended state the
    occurrence's own (from a page or read live); each hour summarized once, in order."""
    final = final or {}
    for read in run.ledger_reads:
        for _, oid, _, state in read.items:
            found = final.get(oid)
            if _ended_otherwise(state, found):
                verdict.flag("ledger_read_wrong_state", f"{oid} read {state}, is {found}")
        keys = [(at, oid) for at, oid, _, _ in read.items]
        what = f"{read.tenant} at {read.at}"
        if keys != sorted(set(keys)):
            verdict.flag("ledger_read_order", what)
        if any(not sid.startswith(schedule_key_prefix(read.tenant)) for _, _, sid, _ in read.items):
            verdict.flag("ledger_read_other_tenant", what)
        if any(not read.since <= at < read.until for at, _ in keys):
            verdict.flag("ledger_read_out_of_range", what)
        hours = [hour for hour, _ in read.hours]
        if hours != sorted(set(hours)):
            verdict.flag("ledger_read_hours", what)
        verdict.ledger_items += len(read.items)


def _check_figures_reads(
    verdict: Verdict, run: Run, stored: dict[str, list[Occurrence]], started: dict[str, int]
) -> None:
    """What honest tenants' reads of a schedule's recent figures said, against the
    occurrences stored at the end: every fire counted once (the outcomes add up to the
    fires); no more fires than asked and stored in the window read (a manual run is no fire);
    an ended outcome never counted more often than the window's occurrences ended so (an
    ended state never changes; a read may be stale, so fewer is allowed); no lag longer than
    any stored there; and the last failure one of the schedule's own fires, ended as it said
    when it said it ended."""
    for read in run.figures_reads:
        if read.tenant == run.hostile:
            continue  # (it answered: its own bad items are counted, not an error)
        verdict.figures_reads += 1
        f, what = read.figures, f"{read.schedule_id} at {read.at}"
        total = f.succeeded + f.dead + f.missed + f.skipped + f.canceled + f.open
        if total != f.fires:
            verdict.flag("figures_sum", f"{what}: {total} counted of {f.fires}")
        since = read.at if f.since is None else f.since
        window = [
            o
            for o in stored.get(read.schedule_id, [])
            if since <= o.scheduled_for <= read.at and _manual(o) is None
        ]
        fires_read = f.fires - f.missed  # at least the items read (an episode's are missed)
        if fires_read > min(read.count, len(window)):
            verdict.flag("figures_more_than_stored", f"{what}: {fires_read} of {len(window)}")
        ended = Counter(o.state for o in window)
        shown = {S.SUCCEEDED: f.succeeded, S.DEAD: f.dead, S.SKIPPED_OVERLAP: f.skipped}
        for state, count in (shown | {S.CANCELED: f.canceled}).items():
            if count > ended[state]:
                verdict.flag("figures_overcounted", f"{what}: {count} {state} of {ended[state]}")
        _check_figures_lags(verdict, what, f, window, started)
        _check_figures_failure(verdict, what, f, {o.occurrence_id: o for o in window})


def _check_figures_lags(
    verdict: Verdict,
    what: str,
    f: RecentFigures,
    window: list[Occurrence],
    started: dict[str, int],
) -> None:
    longest = max((lag for o in window if (lag := receivable_lag(o)) is not None), default=None)
    if f.receivable_lag is not None and (longest is None or f.receivable_lag.max > longest):
        verdict.flag("figures_lag", f"{what}: receivable {f.receivable_lag.max} > {longest}")
    starts = [
        started[o.occurrence_id] - o.available_at for o in window if o.occurrence_id in started
    ]
    if f.start_lag is not None and (not starts or f.start_lag.max > max(starts)):
        verdict.flag(
            "figures_lag", f"{what}: start {f.start_lag.max} > {max(starts, default=None)}"
        )


def _check_figures_failure(
    verdict: Verdict, what: str, f: RecentFigures, window: dict[str, Occurrence]
) -> None:
    failure = f.last_failure
    if failure is None or failure.occurrence_id is None:
        return
    found = window.get(failure.occurrence_id)
    if found is None:
        verdict.flag("figures_failure_unknown", f"{what}: {failure.occurrence_id}")
    elif failure.what in (S.DEAD, S.MISSED) and _ended_otherwise(failure.what, found):
        verdict.flag("figures_failure_state", f"{what}: {failure.what}, is {found.state}")
