"""What tenants do in the simulation: create schedules of every kind the API offers, change
them (update, rename, pause, resume, cancel), run them now and backfill them, with the retries a
client makes and with two requests racing (the second made at the first's first write, as
two concurrent requests interleave).

Every run now and backfill is logged for the oracle (tests/sim/oracle.py): a retried run
now with the same Idempotency-Key must name one occurrence, and neither may fire again a
fire that ran or will.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from punctual.control.ledger import UPCOMING, LedgerAnswer, LedgerFilter, Upcoming, shown_state
from punctual.control.manual import Backfilled, Triggered
from punctual.control.plane import ControlPlane
from punctual.dal.common import to_dynamo, values
from punctual.dal.schedules import PAYLOAD_MARK, payload_bytes
from punctual.dal.tables import current_key
from punctual.domain.errors import PunctualError
from punctual.domain.figures import RecentFigures
from punctual.domain.ids import tenant_of_schedule
from punctual.domain.ledger import LedgerEntry
from punctual.domain.schedule import MAX_PAYLOAD_BYTES, ScheduleDefinition, ScheduleState
from punctual.domain.tenancy import Quotas
from punctual.services import Services
from punctual.timing import get_zone

if TYPE_CHECKING:
    from tests.sim.world import Simulation

MINUTE = 60
HOUR = 3600
EARLY_DELIVERY_SHARE = 0.5  # of the tenants, whose default target has early delivery
DAY = 86400
ZONES = (
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Sao_Paulo",
    # Its rules differ between IANA 2025b and the pinned release from November 2026 (UTC-7
    # all year): the simulation's change of rules moves its wall times (tests/sim/world.py).
    "America/Vancouver",
)
CRONS = (
    "0 * * * *",
    "*/15 * * * *",
    "30 2 * * *",
    "0 9 * * 1-5",
    "0 0 * * *",
    "@hourly",
    "15,45 1-3 * * *",
    "30 */2 * * *",
)
RATES = ("rate(1 hour)", "rate(90 minutes)", "rate(1 day)", "rate(20 minutes)", "rate(3 hours)")
OVERLAPS = ("ALLOW", "ALLOW", "SKIP_IF_RUNNING", "QUEUE_ONE")
# How often a cron or one-shot chooses its DST behaviour, and the choices.
DST_CHOSEN = 0.5
DST_DRAWS = 3  # the DST choices' RNG seed offset
GAPS = ("SKIP", "SHIFT")
REPEATS = ("FIRST", "LAST", "BOTH")
# The first writes of a request: where a racing request is made.
RACE_POINTS = ("transact_write_items", "update_item", "put_item")
CHANGES = ("update", "rename", "pause", "resume", "cancel")
MANUAL = ("trigger", "backfill")
# Payload sizes (bytes of JSON) a schedule version gets, up to near the API's largest: every
# fire must carry its own version's, read from the version item (the CURRENT item and its
# index entries hold only a mark of it).
PAYLOAD_SIZES = (0, 0, 20, 20, 20, 300, 1_500, 5_000, 20_000, MAX_PAYLOAD_BYTES - 40)
# Of the schedules made: rewritten at once as Punctual wrote them before 2026-12-06 (the
# payload nested in the CURRENT item), which every reader must still read whole.
WRITTEN_BEFORE = 0.2


@dataclass(frozen=True)
class Trigger:
    """A run now the API answered: the key it was asked with, and the occurrence it named."""

    schedule_id: str
    key: str | None
    occurrence_id: str
    replayed: bool


@dataclass(frozen=True)
class Backfill:
    schedule_id: str
    since: int
    until: int
    made: tuple[str, ...]
    dry_run: bool


@dataclass(frozen=True)
class LedgerRead:
    """A tenant's read of its ledger to the end (GET /v1/occurrences, every page): what it
    listed, in the order given, and each hour's summary."""

    tenant: str
    at: int
    since: int
    until: int
    items: tuple[tuple[int, str, str, str], ...]  # (scheduled_for, id, schedule, state)
    hours: tuple[tuple[int, int], ...]  # (hour, shards checked)


@dataclass(frozen=True)
class FiguresRead:
    """A tenant's read of one of its schedules' recent figures (GET /v1/schedules/{id},
    ``recent``): which, when, how many fires asked, and what it answered."""

    tenant: str
    schedule_id: str
    at: int
    count: int
    figures: RecentFigures


class Tenants:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.rng = sim.rng
        # (Its own generator: the run's draws, and so every earlier seed's world, unchanged.)
        self.payload_rng = random.Random(sim.config.seed * 7927 + 5)
        # The DST choices' draws: an RNG of their own, so the rest of the world draws as
        # it did before schedules had one.
        self.dst_rng = random.Random(sim.config.seed * 7933 + DST_DRAWS)
        self.schedule_ids: list[str] = []
        # The figures reads' fault draws: an RNG of their own (swapped into the shared
        # faults for each read), so the world's faults fall where they did before them.
        self.figures_faults_rng = random.Random(sim.config.seed * 7949 + 17)
        # Which tenants' targets take messages early (their workers hold them to the
        # instant): an RNG of its own too.
        self.early_rng = random.Random(sim.config.seed * 7951 + 19)

    def bootstrap(self) -> None:
        plane = ControlPlane(self.sim.services("api"))
        for tenant in self.sim.tenants + ([self.sim.hostile] if self.sim.hostile else []):
            plane.create_tenant(
                tenant,
                Quotas(
                    max_schedules=self.sim.config.schedules,
                    max_strict_fires_per_minute=self.sim.config.schedules,
                    catchup_per_minute=self.rng.choice([6, 60, 600]),
                ),
            )
            plane.create_target(tenant, "default")
            if self.early_rng.random() < EARLY_DELIVERY_SHARE:
                plane.set_early_delivery(tenant, "default", True)
                self.sim.run_record.counts["early_delivery_targets"] += 1
        self._meets_a_transition()

    def _meets_a_transition(self) -> None:
        """A schedule whose DST choice decides some of its fires in this run: every quarter
        hour in the first zone of ZONES whose clocks skip or repeat wall times within the
        run (or up to three hours before it: the second pass of a repeated hour may be in
        it), choosing SHIFT for a gap or LAST or BOTH for a repeated hour (the others draw
        their choices blind, and most runs' zones and crons meet no transition)."""
        clock = self.sim.clock
        found = next(
            ((name, change) for name in ZONES if (change := self._offset_change(name))), None
        )
        if found is None:
            return
        name, (before, after) = found
        gap = "SHIFT" if after > before else self.dst_rng.choice(GAPS)
        repeat = self.dst_rng.choice(REPEATS[1:]) if after < before else "FIRST"
        spec = {"kind": "cron", "expression": "*/15 * * * *", "timezone": name}
        definition = ScheduleDefinition.model_validate(
            {"spec": spec | {"dst": {"gap": gap, "repeat": repeat}}, "target": "default"}
        )
        # (Made with the clients without faults: the faults' draws, and so the rest of the
        # world, stay as they were.)
        plain = Services(self.sim.real, self.sim.sqs, self.sim.region, lambda: clock.now)
        ControlPlane(plain).create(self.dst_rng.choice(self.sim.tenants), definition)
        self.sim.run_record.counts["meets_a_transition"] += 1

    def _offset_change(self, zone_name: str) -> tuple[timedelta, timedelta] | None:
        """The zone's first UTC offset change (before, after) from three hours before now to
        the run's end, if any."""
        zone = get_zone(zone_name)
        now = int(self.sim.clock.now)
        offsets = [
            datetime.fromtimestamp(t, zone).utcoffset()
            for t in range(now - 3 * HOUR, self.sim.end, 900)
        ]
        return next(
            ((a, b) for a, b in pairwise(offsets) if a != b and a is not None and b is not None),
            None,
        )

    # --- calls ----------------------------------------------------------------------------

    def call(self, name: str, call: Callable[[], Any]) -> Any:
        """A client call with the SDK-style retries a tenant's client makes."""
        counts = self.sim.run_record.counts
        for _ in range(4):
            try:
                return call()
            except PunctualError as error:
                if error.callers_fault:
                    counts[f"api_{name}_refused"] += 1
                    return None
            except (ClientError, BotoCoreError):
                pass
        counts[f"api_{name}_gave_up"] += 1
        return None

    def raced(self, name: str, call: Callable[[], Any], rival: Callable[[], Any]) -> Any:
        """``call``, with ``rival`` made at the first write of it (a transaction, an update
        or a put): two concurrent requests, the rival's commit between the first's reads
        and its commit."""
        faults = self.sim.faults
        saved = {point: faults.before.get(point) for point in RACE_POINTS}
        done = False

        def restore() -> None:
            for point, hook in saved.items():
                if hook is None:
                    faults.before.pop(point, None)
                else:
                    faults.before[point] = hook

        def race(operation: str, request: dict[str, Any]) -> None:
            nonlocal done
            restore()
            if not done:
                done = True
                self.sim.run_record.counts[f"raced_{name}"] += 1
                rival()
            if saved[operation] is not None:
                saved[operation](operation, request)  # type: ignore[misc]

        for point in RACE_POINTS:
            faults.before[point] = race
        try:
            return call()
        finally:
            restore()

    # --- schedules ------------------------------------------------------------------------

    def definition(self) -> dict[str, Any]:
        rng = self.rng
        kind = rng.choice(["cron", "cron", "cron", "rate", "at"])
        zone = rng.choice(ZONES)
        now = int(self.sim.clock.now)
        if kind == "cron":
            spec: dict[str, Any] = {
                "kind": "cron",
                "expression": rng.choice(CRONS),
                "timezone": zone,
            }
        elif kind == "rate":
            spec = {"kind": "rate", "expression": rng.choice(RATES)}
        else:
            at = now + rng.randint(0, max(60, self.sim.end - now))
            local = datetime.fromtimestamp(at, UTC).astimezone(get_zone(zone)).replace(tzinfo=None)
            spec = {"kind": "at", "at": local.isoformat(timespec="seconds"), "timezone": zone}
        if kind != "rate" and self.dst_rng.random() < DST_CHOSEN:
            # A DST choice (docs/time.md): the STARTS lie near gaps and repeated hours.
            spec["dst"] = {"gap": self.dst_rng.choice(GAPS), "repeat": self.dst_rng.choice(REPEATS)}
        action = rng.choice(["SKIP", "FIRE_ONCE", "CATCHUP"])
        misfire: dict[str, Any] = {
            "action": action,
            "max_lateness_seconds": rng.choice([0, 60, 300, 3600, 7 * DAY]),
        }
        if action == "CATCHUP":
            misfire["catchup_limit"] = rng.choice([1, 3, 25])
        return {
            "spec": spec,
            "target": "default",
            "flexible_window_seconds": rng.choice([0, 0, 0, 60, 300, 900]),
            "misfire": misfire,
            "overlap": rng.choice(OVERLAPS),
            "retry": {"max_attempts": rng.choice([1, 3, 5]), "backoff_base_seconds": 10},
            "payload": self.payload(rng.randint(0, 1000)),
        }

    def payload(self, n: int) -> dict[str, Any]:
        """A payload of one of PAYLOAD_SIZES bytes (none at 0), unique to its version."""
        size = self.payload_rng.choice(PAYLOAD_SIZES)
        if not size:
            return {}
        body: dict[str, Any] = {"n": n, "tag": self.payload_rng.getrandbits(48), "fill": ""}
        body["fill"] = "p" * max(0, size - payload_bytes(body))
        return body

    def create(self, tenant: str | None = None) -> None:
        tenant = tenant or self.rng.choice(self.sim.tenants)
        definition = ScheduleDefinition.model_validate(self.definition())
        plane = ControlPlane(self.sim.services("api"))
        saved = self.call("create", lambda: plane.create(tenant, definition))
        if saved is not None:
            self.schedule_ids.append(saved.schedule.schedule_id)
            self.sim.run_record.counts["created"] += 1
            if self.payload_rng.random() < WRITTEN_BEFORE:
                self._as_written_before(saved.schedule.schedule_id, definition.payload)

    def _as_written_before(self, sid: str, payload: dict[str, Any]) -> None:
        """The schedule's CURRENT item as Punctual wrote it before 2026-12-06: its payload
        nested in its definition, no mark (not through the faults: a deploy, not a call)."""
        self.sim.run_record.services.dynamodb.update_item(
            TableName=self.sim.settings.schedules_table,
            Key=to_dynamo(current_key(sid)),
            UpdateExpression="SET #d.payload = :p REMOVE #d.#mark",
            # Race: none here (the run is one thread, and nothing touched the schedule since
            # its create returned): it keeps the rewrite to the version it was made at.
            ConditionExpression="version = :v",
            ExpressionAttributeNames={"#d": "definition", "#mark": PAYLOAD_MARK},
            ExpressionAttributeValues=values(p=payload, v=1),
        )
        self.sim.run_record.counts["written_before"] += 1

    def change(self) -> None:
        """One tenant request on a schedule, sometimes raced by another on the same one."""
        if not self.schedule_ids or self.rng.random() < 0.2:
            self.create()
            return
        manual = self.rng.random() < self.sim.config.manual_share
        choice = self.rng.choice(MANUAL if manual else CHANGES)
        sid = self._missed_one() if choice == "backfill" else None
        sid = sid or self.rng.choice(self.schedule_ids)
        stored = self.sim.run_record.services.schedules.current(sid)
        if stored is None or stored.schedule.state is ScheduleState.CANCELED:
            return
        first = self._request(sid, choice)
        if self.rng.random() < self.sim.config.race:
            rival = self._request(sid, self.rng.choice(CHANGES + MANUAL))
            self.raced("request", first, rival)
        else:
            first()

    def rival(self) -> Callable[[], Any]:
        """A change or a manual run of one schedule, to be made inside another component's
        first write (the materializer's step, a worker's claim): what races them."""
        sid = self.rng.choice(self.schedule_ids) if self.schedule_ids else None
        stored = self.sim.run_record.services.schedules.current(sid) if sid else None
        if sid is None or stored is None or stored.schedule.state is ScheduleState.CANCELED:
            return lambda: None
        return self._request(sid, self.rng.choice(CHANGES + MANUAL))

    def _missed_one(self) -> str | None:
        """Mostly a schedule whose misfire policy recorded fires MISSED: what a tenant
        backfills."""
        if self.rng.random() < 0.3:
            return None
        read = self.sim.run_record.services.schedules.current
        missed = [
            sid for sid in self.schedule_ids if (stored := read(sid)) and stored.schedule.missed
        ]
        return self.rng.choice(missed) if missed else None

    def _request(self, sid: str, choice: str) -> Callable[[], Any]:
        """A request of the schedule's tenant on it, as a client would make it: the version
        it read for an update, a key for most runs now (asked twice now and then: a retry
        after a lost answer), a range of the last hours for a backfill."""
        rng = self.rng
        stored = self.sim.run_record.services.schedules.current(sid)
        assert stored is not None
        tenant, version = stored.schedule.tenant_id, stored.schedule.version
        changes = {k: v for k, v in self.definition().items() if rng.random() < 0.5}
        if choice == "rename":  # a change of nothing that runs: it must cancel nothing
            changes = {"name": f"renamed {rng.getrandbits(16)}"}
        key = None if rng.random() < 0.3 else f"k{rng.getrandbits(40)}"
        asks = 2 if rng.random() < 0.3 else 1
        now = int(self.sim.clock.now)
        until = now - rng.randint(0, 2 * HOUR)
        since = max(self.sim.start, until - rng.randint(10 * MINUTE, 12 * HOUR))
        missed = stored.schedule.missed
        if missed and rng.random() < 0.7:
            # What its misfire policy recorded MISSED, asked for again.
            episode = rng.choice(missed)
            since, until = episode.first, episode.last + 1
        dry = rng.random() < 0.2

        def request() -> None:
            plane = ControlPlane(self.sim.services("api"))
            if choice == "trigger":
                for _ in range(asks):
                    self._trigger(plane, tenant, sid, key)
            elif choice == "backfill":
                if since < until:
                    for _ in range(asks):
                        self._backfill(plane, tenant, sid, since, until, dry)
            elif choice in ("update", "rename"):
                call = lambda: plane.update(tenant, sid, if_match=version, changes=changes)  # noqa: E731
                if self.call(choice, call) is not None:
                    self.sim.run_record.counts[choice] += 1
            elif self.call(choice, lambda: getattr(plane, choice)(tenant, sid)) is not None:
                self.sim.run_record.counts[choice] += 1

        return request

    def run_now(self, tenant: str, sid: str) -> None:
        """A run now of the schedule, asked with a fresh Idempotency-Key (while one of its
        occurrences runs: what its overlap policy is for)."""
        plane = ControlPlane(self.sim.services("api"))
        self._trigger(plane, tenant, sid, f"k{self.rng.getrandbits(40)}")

    def _trigger(self, plane: ControlPlane, tenant: str, sid: str, key: str | None) -> None:
        made: Triggered | None = self.call("trigger", lambda: plane.trigger(tenant, sid, key))
        if made is not None:
            record = Trigger(sid, key, made.occurrence.occurrence_id, made.replayed)
            self.sim.run_record.triggers.append(record)
            self.sim.run_record.counts["trigger"] += 1

    def _backfill(
        self, plane: ControlPlane, tenant: str, sid: str, since: int, until: int, dry: bool
    ) -> None:
        done: Backfilled | None = self.call(
            "backfill", lambda: plane.backfill(tenant, sid, since, until, dry_run=dry)
        )
        if done is not None:
            made = tuple(o.occurrence_id for o in done.made)
            self.sim.run_record.backfills.append(Backfill(sid, since, until, made, dry))
            self.sim.run_record.counts["backfill"] += 1
            self.sim.run_record.counts["backfilled"] += 0 if dry else len(made)

    def read_ledger(self, rng: random.Random) -> None:
        """A tenant reads its ledger of the last hours and the next one, page by page (a
        small page now and then), as a client follows next_token; logged for the oracle."""
        tenant = rng.choice(self.sim.tenants)
        plane = ControlPlane(self.sim.services("api"))
        now = int(self.sim.clock.now)
        since, until = max(self.sim.start, now - rng.randint(1, 30) * HOUR), now + HOUR
        limit = rng.choice([3, 20, 100])
        items: list[tuple[int, str, str, str]] = []
        hours: list[tuple[int, int]] = []
        token = None
        while True:

            def read(token: str | None = token) -> LedgerAnswer:
                return plane.ledger(
                    tenant,
                    since=since,
                    until=until,
                    wanted=LedgerFilter(),
                    limit=limit,
                    token=token,
                )

            page: LedgerAnswer | None = self.call("ledger", read)
            if page is None:
                return  # (given up: a read changes nothing)
            items += [
                (i.scheduled_for, i.occurrence_id, i.schedule_id, _shown(i)) for i in page.items
            ]
            hours += [(h.hour, h.shards_checked) for h in page.hours]
            token = page.next_token
            if token is None:
                break
        done = LedgerRead(tenant, now, since, until, tuple(items), tuple(hours))
        self.sim.run_record.ledger_reads.append(done)
        self.sim.run_record.counts["ledger_read"] += 1

    def read_figures(self, rng: random.Random) -> None:
        """A tenant reads one of its schedules' recent figures (the hostile tenant too, of
        its own schedules, whose items it wrote malformed): through the faulty clients,
        retried as a client would; logged for the oracle."""
        hostile = self.sim.evil.schedule_ids if self.sim.evil else []
        ids = self.schedule_ids + hostile
        if not ids:
            return
        sid = rng.choice(ids)
        tenant = tenant_of_schedule(sid)
        count = rng.choice([1, 5, 100])
        if tenant is None:
            return
        clock, skew = self.sim.clock, self.sim.skew_of("api")
        plane = ControlPlane(self.sim.services("api", draw=False))
        faults = self.sim.faults
        world_draws, faults.rng = faults.rng, self.figures_faults_rng
        try:
            figures = self.call("figures", lambda: plane.recent(plane.get(tenant, sid), count))
        finally:
            faults.rng = world_draws
        if figures is not None:
            # (``at``: the instant the read's figures end, by the API's clock)
            read = FiguresRead(tenant, sid, int(clock.now + skew), count, figures)
            self.sim.run_record.figures_reads.append(read)
            self.sim.run_record.counts["figures_read"] += 1


def _shown(item: LedgerEntry | Upcoming) -> str:
    return UPCOMING if isinstance(item, Upcoming) else shown_state(item)
