"""A deterministic simulation of Punctual under AWS's failure modes, FoundationDB-style.

One seed decides everything: the schedules (cron in many zones across DST changes, rate,
one-shot, flexible windows up to the maximum, every misfire and overlap policy, QUEUE_ONE
included, every DST choice, one of them in a zone whose clocks change during the run), the
tenants' requests (update, pause, resume, cancel, create, run now and backfill, retried and
racing each other: tests/sim/tenants.py), the workers (failing, long
runs that heartbeat while another worker polls beside them, runs that stall past their
lease or die: tests/sim/workers.py), a hostile tenant writing whatever its IAM policy allows
(tests/sim/hostile.py), the faults (throttling, conflicts, lost responses, stale reads, SQS
send failures, messages lost after the send, killed materializers, relay invocations cut
short, stream batches the mapping gives up on, clock skew between components), the outages
(materializer, relay, workers, reconciler: minutes to a day), a change of the zone rules
mid-run (planned under IANA 2025b, then the pinned release is deployed) and a fail-over to
another region mid-run (the old one's materializer still ticking for a while, fenced off).
Time is simulated: a day runs in seconds, nothing sleeps.

The code under test is Punctual's own (the control plane, the materializer, the relay, the
re-drive, the worker SDK, the reconciler, the re-plan, the fail-over) against DynamoDB
Local through the faults layer and an SQS on the simulated clock. The drivers stand in for
AWS's glue: the 1-minute ticker (EventBridge + Step Functions), the stream's event source
mapping (retries, then the on-failure queue), SQS-fed workers, the hourly reconciler.

At the end, with the faults off and the system drained, ``oracle.check`` verifies the
contract against what is stored and what the workers logged (tests/sim/oracle.py).
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from punctual.control import ledger, plane
from punctual.dal.common import BadItems
from punctual.dal.tables import ALL_TABLES, create_tables
from punctual.domain.errors import PunctualError, Retryable
from punctual.domain.ids import schedule_key_prefix
from punctual.integrations.streams import event_record, wanted
from punctual.pipeline.failover import REWIND_SECONDS, take_over
from punctual.pipeline.materializer import Materializer
from punctual.pipeline.reconciler import Reconciler
from punctual.pipeline.redrive import StreamRedrive, Trimmed
from punctual.pipeline.relay import Relay, SendFailed
from punctual.services import Services
from punctual.settings import Settings
from punctual.skew import AnswerClock, ClockSkew, Offset
from punctual.timing import ZoneSource, use_zone_source
from punctual_client.worker import core as worker_core
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, FaultySQS
from tests.sim.hostile import Hostile
from tests.sim.sqs import SimSQS
from tests.sim.tenants import Backfill, FiguresRead, LedgerRead, Tenants, Trigger
from tests.sim.workers import Delivered, Event, HandlerRun, Workers

MINUTE = 60
HOUR = 3600
DAY = 86400
# Starts near DST changes: the US spring-forward, the EU fall-back, Lord Howe's half hour,
# and the US fall-back of 2026, after which IANA 2025b and the pinned release disagree on
# America/Vancouver (the change of rules mid-run then moves its wall times).
STARTS = (
    "2026-03-07T12:00:00Z",
    "2026-10-24T12:00:00Z",
    "2026-04-04T06:00:00Z",
    "2026-11-01T06:00:00Z",
)
OLD_RULES = ZoneSource("2025b", Path(__file__).parent.parent / "tzdata_2025b")
# DynamoDB's clock ahead of the world's true one, as its answers' Date says: a fraction of a
# second, so the components' measures of their clocks depend on the Date's truncation to
# the second (the world's time is whole seconds).
SERVER_AHEAD = 0.6
MAPPING_RETRIES = 3  # the relay's event source mapping: attempts before it discards a batch
DRAIN_SECONDS = 3 * HOUR  # after the faults stop: the reconciler covers every hour
STEP_BUDGET = 55  # seconds of its minute a step may take (long runs): the next starts at 60
HOME, OTHER = "us-east-1", "us-west-2"
LEDGER_READS_PER_HOUR = 6  # tenants reading their ledger (GET /v1/occurrences)
FIGURES_READS_PER_HOUR = 12  # tenants reading a schedule's recent figures (GET /v1/schedules/{id})
ZOMBIE_SECONDS = 10 * MINUTE  # the failed region's materializer ticks on this long
HOSTILE = "evil"
TAKE_OVER_TRIES = 30


class Killed(BaseException):
    """A process killed mid-run (not an Exception: no error path of ours runs)."""


@dataclass
class SimConfig:
    seed: int = 1
    days: float = 1.0
    schedules: int = 60
    tenants: int = 3
    shards: int = 4
    lookahead: int = 420
    faults: FaultPlan = field(
        default_factory=lambda: FaultPlan(
            throttle=0.01,
            conflict=0.01,
            replayed=0.01,
            lost_response=0.005,
            stale=0.1,
            stale_seconds=5,
            index_lag=0.01,
            index_lag_seconds=150,
            send_failure=0.02,
            send_timeout=0.005,
            send_error=0.005,
        )
    )
    kill: float = 0.02  # a materializer run killed at one of its crash points
    relay_cut: float = 0.03  # a relay invocation cut short after some sends
    gives_up: float = 0.3  # a failed stream batch the mapping discards (retries exhausted)
    lost_message: float = 0.002  # per message per step: a message lost after the send
    handler_failure: float = 0.05  # transient; a tenth of these permanent
    changes_per_hour: float = 6.0
    manual_share: float = 0.3  # of the requests on a schedule: run now or backfill
    race: float = 0.15  # a request raced by another on the same schedule
    long_run: float = 0.1  # a handler that runs up to 50 s, heartbeating
    stall: float = 0.3  # of the long runs: silent past the lease once
    worker_dies: float = 0.01  # a worker killed mid-run
    hostile_per_hour: float = 6.0  # writes of the hostile tenant's worker (0: no such tenant)
    rules_change: bool = True  # planned under IANA 2025b, the pinned release deployed mid-run
    failover: bool = True  # another region takes every shard over mid-run
    # The relay's mappings made anew mid-run (the stack deployed again over its tables): the
    # new one reads the stream from its oldest record (punctual.pipeline.relay, replay)
    remap: bool = True
    outages: int = 3  # per component over the run
    skew: int = 3  # seconds, each way, between components
    start: str | None = None  # one of STARTS (None: the seed draws it)


@dataclass
class Clock:
    now: float

    def __call__(self) -> float:
        return self.now


@dataclass
class Run:
    """What happened, for the oracle and the figures."""

    start: int
    end: int  # the faults stop here; the drain runs to end + DRAIN_SECONDS
    settings: Settings
    services: Services  # fault-free, true clock: the oracle's view
    sqs: SimSQS
    runs: list[HandlerRun] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    deliveries: list[Delivered] = field(default_factory=list)  # every message workers received
    triggers: list[Trigger] = field(default_factory=list)
    backfills: list[Backfill] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)
    skew: int = 0  # the largest clock skew injected between components, in seconds
    hostile: str | None = None  # the hostile tenant, if any
    # The hostile tenant's stream records that failed their relay batch by themselves (not a
    # send failure or a throttled read): must stay empty.
    hostile_failures: list[str] = field(default_factory=list)
    bad_items: BadItems = field(default_factory=BadItems)  # every component's count
    rules_changed_at: int | None = None  # when the pinned zone rules replaced 2025b
    failed_over_at: int | None = None
    rewind: int = 0  # how far back the fail-over planned again
    remapped_at: int | None = None  # when the relay's mappings were made anew
    other: Settings | None = None  # the region that takes over (its own ledger table)
    ledger_reads: list[LedgerRead] = field(default_factory=list)  # what tenants' reads listed
    figures_reads: list[FiguresRead] = field(default_factory=list)  # schedules' figures read
    skews: dict[str, int] = field(default_factory=dict)  # each component's clock skew
    server_ahead: float = 0.0  # DynamoDB's clock ahead of the true one (its answers' Date)
    # Each component's measure of its clock against DynamoDB's answers, and what it said at
    # the end of each step it ran in: (component, its estimate then).
    offsets: dict[str, ClockSkew] = field(default_factory=dict)
    measured: list[tuple[str, Offset]] = field(default_factory=list)

    @property
    def backfilled_ids(self) -> set[str]:
        """Every occurrence a backfill made (a missed fire among them, by request)."""
        return {made for b in self.backfills if not b.dry_run for made in b.made}


class _Seeded:
    """The one source of randomness for ids and tokens, so a seed replays exactly."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def token_urlsafe(self, size: int = 16) -> str:
        return "".join(
            self._rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size)
        )

    def token_bytes(self, size: int = 8) -> bytes:
        return bytes(self._rng.getrandbits(8) for _ in range(size))

    def schedule_id(self, tenant_id: str) -> str:
        return schedule_key_prefix(tenant_id) + self.token_urlsafe(24)


@contextmanager
def seeded_ids(rng: random.Random) -> Iterator[None]:
    """Schedule ids, lease tokens, manual tags and request tokens from the seed, for the
    run's length; and the ledger's live read one schedule at a time, as every component
    here runs (threads would draw the faults in another order each run)."""
    from punctual.domain import ids

    seeded = _Seeded(rng)
    patches = [
        (plane, "new_schedule_id", seeded.schedule_id),
        (worker_core, "secrets", seeded),
        (ids, "secrets", seeded),
        (uuid, "uuid4", lambda: uuid.UUID(int=rng.getrandbits(128))),
        (ledger, "LIVE_READERS", 1),
    ]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


class Simulation:
    def __init__(self, config: SimConfig, dynamodb: Any) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.start = _epoch(config.start or self.rng.choice(STARTS))
        self.end = self.start + int(config.days * DAY)
        self.clock = Clock(float(self.start))
        self.step_end = float(self.start)
        prefix = f"sim{config.seed}-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:8]}"
        self.settings = Settings(
            # DynamoDB Local runs TTL on its own (real) clock: occurrences of simulated months
            # ago would expire mid-run. The longest retention keeps them all.
            retention_days=3650,
            shard_count=config.shards,
            lookahead_seconds=config.lookahead,
            tick_seconds=60,
            region=HOME,
            operator_principals=frozenset({"arn:aws:iam::000000000000:user/operator"}),
        ).model_copy(update={spec.setting: f"{prefix}-{spec.setting}" for spec in ALL_TABLES})
        # The region that takes over: the same (global) tables, a leases table and a
        # ledger table of its own (regional ones, docs/multi-region.md).
        self.other = self.settings.model_copy(
            update={
                "region": OTHER,
                "leases_table": f"{prefix}-{OTHER}-leases_table",
                "ledger_table": f"{prefix}-{OTHER}-ledger_table",
            }
        )
        self.region = self.settings  # where the system runs now
        self.real = dynamodb
        self.faults = Faults(
            config.faults,
            self.clock,
            random.Random(self.rng.getrandbits(64)),
            server_ahead=SERVER_AHEAD,
        )
        self.sqs = SimSQS(self.clock)
        self.dynamodb = FaultyDynamoDB(dynamodb, self.faults)
        self.faulty_sqs = FaultySQS(self.sqs, self.faults)
        self.tenants = [f"t{i}" for i in range(config.tenants)]
        self.hostile = HOSTILE if config.hostile_per_hour > 0 else None
        self.run_record = Run(
            self.start,
            self.end,
            self.settings,
            Services(dynamodb, self.sqs, self.settings, self.clock),
            self.sqs,
            skew=config.skew,
            hostile=self.hostile,
            other=self.other,
        )
        # (Its own generator: the run's draws, and so every earlier seed's world, unchanged.)
        self.ledger_rng = random.Random(config.seed * 7919 + 11)
        self.figures_rng = random.Random(config.seed * 7937 + 13)
        self._skews = self.run_record.skews
        self.run_record.server_ahead = SERVER_AHEAD
        self.outages = self._outages()
        span = self.end - self.start
        self.rules_change_at = (
            self.start + int(span * self.rng.uniform(0.4, 0.7)) if config.rules_change else None
        )
        self.failover_at = (
            self.start + int(span * self.rng.uniform(0.3, 0.8)) if config.failover else None
        )
        self.second_take_over_at: int | None = None
        # (Its own generator: the draws above, and so every earlier seed's run, unchanged.)
        self.remap_at = (
            self.start + int(span * random.Random(config.seed * 7919).uniform(0.3, 0.9))
            if config.remap
            else None
        )
        # When the mapping first read each stream record (by sequence number): the record's
        # creation time as the relay sees it. DynamoDB Local stamps records with its own
        # (real) clock; a record is read in the step it was written unless the relay is
        # down, and then later, which makes a replay look newer: sent, never skipped wrongly.
        self.first_read: dict[str, int] = {}
        self.mapping = _Mapping(self)
        self.redrive_queue: list[dict[str, Any]] = []
        self.requests = Tenants(self)
        self.workers = Workers(self)
        self.evil = Hostile(self, self.hostile) if self.hostile else None

    @property
    def faulty(self) -> bool:
        """Before the drain: faults, changes, races and failing handlers happen."""
        return self.clock.now < self.end

    @property
    def every_tenant(self) -> list[str]:
        return self.tenants + ([self.hostile] if self.hostile else [])

    # --- wiring ---------------------------------------------------------------------------

    def services(
        self, component: str, settings: Settings | None = None, *, draw: bool = True
    ) -> Services:
        """What one component runs with: the faulty clients, the region it runs in, its own
        clock's skew, and the run's count of bad items. ``draw=False``: the skew it already
        has (0 if none), drawing nothing from the run's generator (a reader added later
        leaves the world's draws as they were)."""
        skew = (
            self._skews.setdefault(component, self.rng.randint(-self.config.skew, self.config.skew))
            if draw
            else self.skew_of(component)
        )
        now = lambda: self.clock.now + skew  # noqa: E731
        return Services(
            self.dynamodb,
            self.faulty_sqs,
            settings or self.region,
            now,
            sleep=lambda _: None,  # (simulated time: a back-off's pause takes none)
            bad_items=self.run_record.bad_items,
            # Its measure of its clock against DynamoDB's answers (dated by the true clock:
            # tests/faults.py), kept across the run: the oracle holds it to the skew.
            answers=AnswerClock(now, self._offset(component)),
        )

    def _offset(self, component: str) -> ClockSkew:
        """The component's measure of its clock against DynamoDB's, kept across the run
        once its skew is drawn (one taken before would be of another clock)."""
        if component not in self._skews:
            return self._skew()
        return self.run_record.offsets.setdefault(component, self._skew())

    def _skew(self) -> ClockSkew:
        """A component's measure of its clock's offset, with the true clock for its
        monotonic one (a component's clock moves with it: no step)."""
        return ClockSkew(monotonic=lambda: self.clock.now)

    def skew_of(self, component: str) -> int:
        """The clock skew ``component`` runs with (0 before its first services())."""
        return self._skews.get(component, 0)

    def advance(self, seconds: float) -> bool:
        """Move the clock on within the current minute (a long handler run); False once the
        minute is spent."""
        before = self.clock.now
        self.clock.now = min(self.clock.now + seconds, self.step_end)
        return self.clock.now > before

    def _outages(self) -> dict[str, list[tuple[int, int]]]:
        spans: dict[str, list[tuple[int, int]]] = {}
        for component in ("materializer", "relay", "workers", "reconciler"):
            spans[component] = []
            for _ in range(self.config.outages):
                length = int(self.rng.choice([5 * MINUTE, 30 * MINUTE, 2 * HOUR, 8 * HOUR, DAY]))
                length = min(length, max(MINUTE, (self.end - self.start) // 3))
                begin = self.rng.randint(self.start, max(self.start, self.end - length))
                spans[component].append((begin, begin + length))
            spans[component] = _at_most_a_day(spans[component])
        return spans

    def up(self, component: str) -> bool:
        now = self.clock.now
        return not any(a <= now < b for a, b in self.outages[component])

    # --- the run --------------------------------------------------------------------------

    def run(self) -> Run:
        with seeded_ids(self.rng):
            use_zone_source(OLD_RULES if self.rules_change_at is not None else None)
            try:
                self._run()
            finally:
                use_zone_source(None)
        self.run_record.injected = self.faults.injected
        return self.run_record

    def _run(self) -> None:
        self.faults.enabled = False
        create_tables(self.real, self.settings)
        create_tables(self.real, self.other)
        self.requests.bootstrap()
        if self.evil is not None:
            for _ in range(max(1, self.config.schedules // 10)):
                self.requests.create(self.evil.tenant)
            self.evil.schedule_ids = list(self.requests.schedule_ids)
            self.requests.schedule_ids.clear()
        self.faults.enabled = True
        for _ in range(self.config.schedules):
            self.requests.create()
        now = self.start
        while now < self.end + DRAIN_SECONDS:
            if now >= self.end:
                self.faults.enabled = False  # the drain: healthy, no changes
            self.clock.now = float(now)
            self.step_end = float(now + STEP_BUDGET)
            self._step(now)
            now += MINUTE

    def _step(self, now: int) -> None:
        draining = now >= self.end
        if self.rules_change_at is not None and now >= self.rules_change_at:
            self._change_rules(now)
        if self.failover_at is not None and now >= self.failover_at:
            self._fail_over(now)
        elif self.second_take_over_at is not None and now >= self.second_take_over_at:
            # A minute later in any case (docs/multi-region.md): the shard index it lists
            # from is eventually consistent.
            self.second_take_over_at = None
            self._take_over(self.run_record.rewind)
        if draining or self.up("materializer"):
            self._tick(now, self.region)
        failed = self.run_record.failed_over_at
        if failed is not None and now < failed + ZOMBIE_SECONDS:
            self._tick(now, self.settings)  # the failed region's: fenced off by generation
        if self.remap_at is not None and now >= self.remap_at:
            self._remap(now)
        if draining or self.up("relay"):
            self.mapping.poll()
            self._redrive()
        if draining or self.up("workers"):
            self.workers.work()
        if not draining:
            self._lose_messages()
            if self.rng.random() < self.config.changes_per_hour / 60:
                self.requests.change()
            if self.ledger_rng.random() < LEDGER_READS_PER_HOUR / 60:
                self.requests.read_ledger(self.ledger_rng)
            if self.figures_rng.random() < FIGURES_READS_PER_HOUR / 60:
                self.requests.read_figures(self.figures_rng)
            if self.evil is not None:
                self.evil.act()
        if now % HOUR == 5 * MINUTE and (draining or self.up("reconciler")):
            self._reconcile(now)
        self._measured()

    def _measured(self) -> None:
        """What each component's measure of its clock says at the step's end (by its own
        clock), for the oracle to hold to the skew it runs with."""
        for component, skew in self.run_record.offsets.items():
            found = skew.offset(self.clock.now + self._skews[component])
            if found is not None:
                self.run_record.measured.append((component, found))

    def _remap(self, now: int) -> None:
        """The stack is deployed again: the relay's mappings are made anew (what the old one
        held, read but not yet sent, is dropped with it) and read the stream from its
        oldest record; the relay is told when they were made (Settings.relay_started_at)."""
        self.remap_at = None
        self.run_record.remapped_at = now
        self.mapping = _Mapping(self, started_at=now)

    def _change_rules(self, now: int) -> None:
        """The pinned tzdata is deployed: plan with its rules from now on, and run the
        reconciler at once (as a deploy does), which re-plans every stale schedule."""
        self.rules_change_at = None
        use_zone_source(None)
        self.run_record.rules_changed_at = now
        if self.up("reconciler"):
            self._reconcile(now)

    def _fail_over(self, now: int) -> None:
        """The home region fails: the other takes every shard over (run again for a shard
        whose schedules kept changing under it), and runs the system from now on."""
        self.failover_at = None
        self.run_record.failed_over_at = now
        self.region = self.other
        # The operator rewinds to when the failed region stopped materializing, if it had
        # (docs/multi-region.md): what it never planned before that, no region plans.
        down = [a for a, b in self.outages["materializer"] if a <= now < b]
        rewind = max(REWIND_SECONDS, now - min(down, default=now) + MINUTE)
        self.run_record.rewind = rewind
        self._take_over(rewind)
        self.second_take_over_at = now + MINUTE

    def _take_over(self, rewind: int) -> None:
        """``python -m punctual.pipeline.failover`` for every shard, run again while it lists
        schedules that changed under it or fails (throttled), as its operator does."""
        services = self.services("failover")
        for shard in range(self.settings.shard_count):
            for _ in range(TAKE_OVER_TRIES):
                try:
                    if not take_over(services, shard, HOME, rewind=rewind).conflicts:
                        break
                except (ClientError, BotoCoreError, PunctualError):
                    pass
                self.run_record.counts["failover_retried"] += 1

    # --- the glue AWS provides ------------------------------------------------------------

    def _tick(self, now: int, settings: Settings) -> None:
        """EventBridge + the Step Functions Map: one materializer per shard; a run may be
        killed at any crash point (its lease then runs out on its own)."""
        services = self.services(f"materializer-{settings.region}", settings)
        for shard in range(settings.shard_count):
            point = (
                self.rng.choice(
                    ["before_commit", "after_commit", "before_watermark", "before_hand_over"]
                )
                if self.rng.random() < self.config.kill and now < self.end
                else None
            )

            def crash(at: str, point: str | None = point) -> None:
                if at == point:
                    raise Killed(at)

            holder = f"m{now}-{shard}-{settings.region}"
            step = partial(Materializer(services, holder, crash=crash).run_shard, now, shard)
            try:
                if self.rng.random() < self.config.race / 10 and now < self.end:
                    # A tenant's request commits between the step's reads and its commit.
                    self.requests.raced("tick", step, self.requests.rival())
                else:
                    step()
            except Killed:
                self.run_record.counts["materializer_killed"] += 1
            except (ClientError, BotoCoreError, PunctualError):
                # Step Functions retries next tick.
                self.run_record.counts["materializer_failed"] += 1

    def _redrive(self) -> None:
        redrive = StreamRedrive(self.mapping.streams, self._relay("redrive"))
        kept = []
        for failure in self.redrive_queue:
            try:
                self.run_record.counts["redriven_batches"] += 1
                redrive.redrive(failure)
            except Trimmed:
                self.run_record.counts["redrive_trimmed"] += 1
            except Exception:
                kept.append(failure)  # the queue's message comes back
        self.redrive_queue = kept

    def _relay(self, component: str) -> Relay:
        return Relay(self.services(component), workers=1, sleep=lambda _: None)

    def _lose_messages(self) -> None:
        for url in self.sqs.queues():
            for message in self.sqs.all_messages(url):
                if self.rng.random() < self.config.lost_message:
                    self.sqs.lose(url, message.message_id)
                    self.faults.injected["message_lost"] += 1

    def _reconcile(self, now: int) -> None:
        """The hourly run, shard group by shard group (here: shard by shard)."""
        services = self.services("reconciler")
        reconciler = Reconciler(services, workers=1, relay=self._relay("reconciler"))
        for shard in range(self.settings.shard_count):
            try:
                results = reconciler.catch_up([shard], now)
            except (ClientError, BotoCoreError, PunctualError):
                self.run_record.counts["reconciler_failed"] += 1
                continue
            for result in results:
                report = result.report
                self.run_record.counts["reconcile_missing"] += report.missing
                self.run_record.counts["reconcile_fired"] += report.repaired_fired
                self.run_record.counts["reconcile_recorded_missed"] += report.repaired_missed
                self.run_record.counts["reconcile_redriven"] += report.redriven
                self.run_record.counts["reconcile_cursors_moved"] += report.cursors_moved
                self.run_record.counts["reconcile_replanned"] += report.replanned


def _at_most_a_day(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping outages of one component joined, each cut to a day: the contract covers
    outages of up to a day (the reconciler's catch-up horizon of two days re-checks an hour
    after one of them and one of its own), not a component down for days because two
    draws overlapped."""
    joined: list[tuple[int, int]] = []
    for begin, end in sorted(spans):
        if joined and begin <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(end, joined[-1][1]))
        else:
            joined.append((begin, end))
    return [(begin, min(end, begin + DAY)) for begin, end in joined]


class _Mapping:
    """The relay's event source mapping over the occurrences stream: filtered batches, the
    relay's batch item failures retried from the first failed record, an invocation cut
    short retried whole, and a batch that keeps failing discarded to the on-failure queue."""

    BATCH = 100

    def __init__(self, sim: Simulation, started_at: int | None = None) -> None:
        import boto3

        self.sim = sim
        self.started_at = started_at
        endpoint = sim.real.meta.endpoint_url
        self.streams = boto3.client(
            "dynamodbstreams",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        self.arn: str | None = None
        self.shards: list[str] = []
        self.polls = 0
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.iterators: dict[str, str | None] = {}
        self.read_up_to: dict[str, str] = {}  # shard -> the sequence number of its last record
        self.attempts: dict[str, int] = {}

    def poll(self) -> None:
        self._read()
        for shard, records in self.pending.items():
            while records:
                batch = records[: self.BATCH]
                done = self._deliver(batch)
                if done == len(batch):
                    del records[: len(batch)]
                    self.attempts[shard] = 0
                    continue
                del records[:done]
                self.attempts[shard] = self.attempts.get(shard, 0) + 1
                exhausted = self.sim.rng.random() < self.sim.config.gives_up
                if self.attempts[shard] > MAPPING_RETRIES or exhausted:
                    self._discard(shard, records[: self.BATCH])
                    del records[: self.BATCH]
                    self.attempts[shard] = 0
                    continue
                break  # retried at the next poll

    def _read(self) -> None:
        if self.arn is None:
            self.arn = self.sim.real.describe_table(TableName=self.sim.settings.occurrences_table)[
                "Table"
            ]["LatestStreamArn"]
        arn = self.arn
        if self.polls % 10 == 0:  # new shards are rare: look for them now and then
            description = self.streams.describe_stream(StreamArn=arn)["StreamDescription"]
            self.shards = [s["ShardId"] for s in description["Shards"]]
        self.polls += 1
        for shard_id in self.shards:
            if shard_id not in self.iterators:
                self.iterators[shard_id] = self._iterator(arn, shard_id)
                self.pending[shard_id] = []
            iterator = self.iterators[shard_id]
            while iterator:
                try:
                    page = self.streams.get_records(ShardIterator=iterator, Limit=1000)
                except ClientError as error:
                    if error.response["Error"]["Code"] != "ExpiredIteratorException":
                        raise
                    # An iterator expires 15 minutes (wall clock) after it was issued, and
                    # on a busy machine the next poll can come later: go on after the last
                    # record read, as Lambda's mapping does.
                    iterator = self._iterator(arn, shard_id)
                    continue
                got = page.get("Records", [])
                self.pending[shard_id] += [
                    self._stamped(event_record(r, arn)) for r in got if wanted(r)
                ]
                if got:
                    self.read_up_to[shard_id] = got[-1]["dynamodb"]["SequenceNumber"]
                iterator = page.get("NextShardIterator")
                if not got:
                    break
            self.iterators[shard_id] = iterator

    def _stamped(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with its creation time on the simulated clock (Simulation.first_read)."""
        seen = self.sim.first_read.setdefault(
            record["dynamodb"]["SequenceNumber"], int(self.sim.clock.now)
        )
        record["dynamodb"]["ApproximateCreationDateTime"] = seen
        return record

    def _iterator(self, arn: str, shard_id: str) -> str:
        """An iterator after the shard's last record read (from its start if none was)."""
        after = self.read_up_to.get(shard_id)
        where: dict[str, str] = (
            {"ShardIteratorType": "TRIM_HORIZON"}
            if after is None
            else {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": after}
        )
        answer = self.streams.get_shard_iterator(StreamArn=arn, ShardId=shard_id, **where)
        return str(answer["ShardIterator"])

    def _deliver(self, batch: list[dict[str, Any]]) -> int:
        """Records of the batch delivered before the first failure."""
        sim = self.sim
        drawn = sim.rng.random() < sim.config.relay_cut
        # Owed: none drawn in the run's first half (the stream's timing varies the batches,
        # so the draws do too): the first batch of the second half is cut, so that every
        # run exercises the cut whatever the timing (same draws: the run is unchanged).
        owed = (
            sim.config.relay_cut > 0
            and not sim.faults.injected["relay_cut"]
            and sim.clock.now >= (sim.start + sim.end) / 2
        )
        cut = (drawn or owed) and sim.clock.now < sim.end
        sends = itertools.count()

        def crash(point: str) -> None:
            if cut and point == "after_send" and next(sends) >= 0:
                raise Killed(point)

        relay = Relay(self.sim.services("relay"), workers=1, crash=crash, sleep=lambda _: None)
        try:
            report = relay.relay(batch, started_at=self.started_at)
        except Killed:
            self.sim.faults.injected["relay_cut"] += 1
            return 0  # the invocation timed out: the whole batch comes again
        except (ClientError, BotoCoreError, PunctualError):  # the invocation failed: all again
            return 0
        if report.before_start:
            self.sim.faults.injected["replay_skipped"] += report.before_start
        failed = {int(k) for k in report.failures}
        hostile = self.sim.hostile
        for record in batch:
            error = report.failures.get(record["dynamodb"]["SequenceNumber"])
            if hostile and error is not None and not isinstance(error, SendFailed | Retryable):
                # Not a send the faults failed, nor a throttled read: the record itself failed
                # the batch. The hostile tenant's item must never do that.
                owner = str(record["dynamodb"].get("Keys", {}).get("schedule_id", ""))
                if owner.startswith(schedule_key_prefix(hostile)):
                    self.sim.run_record.hostile_failures.append(f"{owner}: {error!r}")
        if not failed:
            return len(batch)
        first = min(failed)
        return sum(1 for r in batch if int(r["dynamodb"]["SequenceNumber"]) < first)

    def _discard(self, shard: str, batch: list[dict[str, Any]]) -> None:
        self.sim.faults.injected["mapping_gave_up"] += 1
        assert self.arn is not None
        self.sim.redrive_queue.append(
            {
                "requestContext": {"condition": "RetryAttemptsExhausted"},
                "DDBStreamBatchInfo": {
                    "shardId": shard,
                    "startSequenceNumber": batch[0]["dynamodb"]["SequenceNumber"],
                    "endSequenceNumber": batch[-1]["dynamodb"]["SequenceNumber"],
                    "streamArn": self.arn,
                },
            }
        )
