"""A deterministic simulation of Punctual under AWS's failure modes, FoundationDB-style.

One seed decides everything: the schedules (cron in many zones across DST changes, rate,
one-shot, flexible windows up to the maximum, every misfire and overlap policy), the
tenants' changes (update, pause, resume, cancel, create), the faults (throttling, conflicts,
lost responses, stale reads, SQS send failures, messages lost after the send, killed
materializers, relay invocations cut short, stream batches the mapping gives up on, clock
skew between components) and the outages (materializer, relay, workers, reconciler: minutes
to a day). Time is simulated: a day runs in seconds, nothing sleeps.

The code under test is Punctual's own (the control plane, the materializer, the relay, the
re-drive, the worker SDK, the reconciler) against DynamoDB Local through the faults layer
and an SQS on the simulated clock. The drivers stand in for AWS's glue: the 1-minute ticker
(EventBridge + Step Functions), the stream's event source mapping (retries, then the
on-failure queue), SQS-fed workers, the hourly reconciler.

At the end, with the faults off and the system drained, ``oracle.check`` verifies the
contract against what is stored (tests/sim/oracle.py).
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from punctual import scheduling
from punctual.dal.tables import ALL_TABLES, create_tables
from punctual.errors import PunctualError
from punctual.ids import schedule_key_prefix
from punctual.integrations.queues import queue_name
from punctual.integrations.streams import event_record, wanted
from punctual.materializer import Materializer
from punctual.models import ScheduleDefinition, ScheduleState
from punctual.reconciler import Reconciler
from punctual.redrive import StreamRedrive, Trimmed
from punctual.relay import Relay
from punctual.scheduling import ControlPlane
from punctual.services import Services
from punctual.settings import Settings
from punctual.tenancy import Quotas
from punctual.timing import get_zone
from punctual_client.worker import Job, PermanentError, QueueConsumer, Worker
from punctual_client.worker import core as worker_core
from tests.faults import FaultPlan, Faults, FaultyDynamoDB, FaultySQS
from tests.sim.sqs import SimSQS

MINUTE = 60
HOUR = 3600
DAY = 86400
# Starts near DST changes: the US spring-forward, the EU fall-back, Lord Howe's half hour.
STARTS = ("2026-03-07T12:00:00Z", "2026-10-24T12:00:00Z", "2026-04-04T06:00:00Z")
ZONES = (
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "America/Sao_Paulo",
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
# Frequent ones, drawn rarely: they dominate the cost of a run.
FREQUENT = ("* * * * *", "*/5 * * * *", "rate(7 minutes)")
MAPPING_RETRIES = 3  # the relay's event source mapping: attempts before it discards a batch
DRAIN_SECONDS = 3 * HOUR  # after the faults stop: the reconciler covers every hour


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
        )
    )
    kill: float = 0.02  # a materializer run killed at one of its crash points
    relay_cut: float = 0.03  # a relay invocation cut short after some sends
    gives_up: float = 0.3  # a failed stream batch the mapping discards (retries exhausted)
    lost_message: float = 0.002  # per message per step: a message lost after the send
    handler_failure: float = 0.05  # transient; a tenth of these permanent
    changes_per_hour: float = 6.0
    outages: int = 3  # per component over the run
    skew: int = 3  # seconds, each way, between components


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
    handler_runs: list[tuple[str, int, float, float, int, str]] = field(default_factory=list)
    # (occurrence id, its version, when it ran, its available_at, and the schedule's version
    # and state at that moment, read consistently: what the run must agree with)
    counts: Counter[str] = field(default_factory=Counter)
    injected: Counter[str] = field(default_factory=Counter)
    skew: int = 0  # the largest clock skew injected between components, in seconds


class _Seeded:
    """The one source of randomness for ids and tokens, so a seed replays exactly."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def token_urlsafe(self, size: int = 16) -> str:
        return "".join(
            self._rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(size)
        )

    def schedule_id(self, tenant_id: str) -> str:
        return schedule_key_prefix(tenant_id) + self.token_urlsafe(24)


@contextmanager
def seeded_ids(rng: random.Random) -> Iterator[None]:
    """Schedule ids, lease tokens and request tokens from the seed, for the run's length."""
    seeded = _Seeded(rng)
    patches = [
        (scheduling, "new_schedule_id", seeded.schedule_id),
        (worker_core, "secrets", seeded),
        (uuid, "uuid4", lambda: uuid.UUID(int=rng.getrandbits(128))),
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
        self.start = _epoch(self.rng.choice(STARTS))
        self.end = self.start + int(config.days * DAY)
        self.clock = Clock(float(self.start))
        prefix = f"sim{config.seed}-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:8]}"
        self.settings = Settings(
            # DynamoDB Local runs TTL on its own (real) clock: occurrences of simulated months
            # ago would expire mid-run. The longest retention keeps them all.
            retention_days=3650,
            shard_count=config.shards,
            lookahead_seconds=config.lookahead,
            tick_seconds=60,
            operator_principals=frozenset({"arn:aws:iam::000000000000:user/operator"}),
        ).model_copy(update={spec.setting: f"{prefix}-{spec.setting}" for spec in ALL_TABLES})
        self.real = dynamodb
        self.faults = Faults(config.faults, self.clock, random.Random(self.rng.getrandbits(64)))
        self.sqs = SimSQS(self.clock)
        self.dynamodb = FaultyDynamoDB(dynamodb, self.faults)
        self.faulty_sqs = FaultySQS(self.sqs, self.faults)
        self.tenants = [f"t{i}" for i in range(config.tenants)]
        self.schedule_ids: list[str] = []
        self.run_record = Run(
            self.start,
            self.end,
            self.settings,
            Services(dynamodb, self.sqs, self.settings, self.clock),
            self.sqs,
            skew=config.skew,
        )
        self._skews: dict[str, int] = {}
        self.outages = self._outages()
        self.mapping = _Mapping(self)
        self.redrive_queue: list[dict[str, Any]] = []

    # --- wiring ---------------------------------------------------------------------------

    def services(self, component: str) -> Services:
        """What one component runs with: the faulty clients, and its own clock's skew."""
        skew = self._skews.setdefault(
            component, self.rng.randint(-self.config.skew, self.config.skew)
        )
        return Services(
            self.dynamodb, self.faulty_sqs, self.settings, lambda: self.clock.now + skew
        )

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
            self.faults.enabled = False
            create_tables(self.real, self.settings)
            self._bootstrap()
            self.faults.enabled = True
            for _ in range(self.config.schedules):
                self._create()
            now = self.start
            while now < self.end + DRAIN_SECONDS:
                if now >= self.end:
                    self.faults.enabled = False  # the drain: healthy, no changes
                self.clock.now = float(now)
                self._step(now)
                now += MINUTE
        self.run_record.injected = self.faults.injected
        return self.run_record

    def _step(self, now: int) -> None:
        draining = now >= self.end
        if draining or self.up("materializer"):
            self._tick(now)
        if draining or self.up("relay"):
            self.mapping.poll()
            self._redrive()
        if draining or self.up("workers"):
            self._work()
        if not draining:
            self._lose_messages()
            if self.rng.random() < self.config.changes_per_hour / 60:
                self._change()
        if now % HOUR == 5 * MINUTE and (draining or self.up("reconciler")):
            self._reconcile(now)

    def _bootstrap(self) -> None:
        plane = ControlPlane(self.services("api"))
        for tenant in self.tenants:
            plane.create_tenant(
                tenant,
                Quotas(
                    max_schedules=self.config.schedules,
                    max_strict_fires_per_minute=self.config.schedules,
                    catchup_per_minute=self.rng.choice([6, 60, 600]),
                ),
            )
            plane.create_target(tenant, "default")

    # --- tenants' calls -------------------------------------------------------------------

    def _call(self, name: str, call: Callable[[], Any]) -> Any:
        """A client call with the SDK-style retries a tenant's client makes."""
        for _ in range(4):
            try:
                return call()
            except PunctualError as error:
                if error.callers_fault:
                    self.run_record.counts[f"api_{name}_refused"] += 1
                    return None
            except (ClientError, BotoCoreError):
                pass
        self.run_record.counts[f"api_{name}_gave_up"] += 1
        return None

    def _definition(self) -> dict[str, Any]:
        rng = self.rng
        kind = rng.choice(["cron", "cron", "cron", "rate", "at"])
        zone = rng.choice(ZONES)
        if kind == "cron":
            spec: dict[str, Any] = {
                "kind": "cron",
                "expression": rng.choice(CRONS),
                "timezone": zone,
            }
        elif kind == "rate":
            spec = {"kind": "rate", "expression": rng.choice(RATES)}
        else:
            at = int(self.clock.now) + rng.randint(0, max(60, self.end - int(self.clock.now)))
            local = datetime.fromtimestamp(at, UTC).astimezone(get_zone(zone)).replace(tzinfo=None)
            spec = {"kind": "at", "at": local.isoformat(timespec="seconds"), "timezone": zone}
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
            "overlap": rng.choice(["ALLOW", "ALLOW", "SKIP_IF_RUNNING"]),
            "retry": {"max_attempts": rng.choice([1, 3, 5]), "backoff_base_seconds": 10},
            "payload": {"n": rng.randint(0, 1000)},
        }

    def _create(self) -> None:
        tenant = self.rng.choice(self.tenants)
        definition = ScheduleDefinition.model_validate(self._definition())
        plane = ControlPlane(self.services("api"))
        saved = self._call("create", lambda: plane.create(tenant, definition))
        if saved is not None:
            self.schedule_ids.append(saved.schedule.schedule_id)
            self.run_record.counts["created"] += 1

    def _change(self) -> None:
        if not self.schedule_ids or self.rng.random() < 0.2:
            self._create()
            return
        sid = self.rng.choice(self.schedule_ids)
        plane = ControlPlane(self.services("api"))
        stored = self.run_record.services.schedules.current(sid)
        if stored is None:
            return
        tenant, version, state = (
            stored.schedule.tenant_id,
            stored.schedule.version,
            stored.schedule.state,
        )
        if state is ScheduleState.CANCELED:
            return
        choice = self.rng.choice(["update", "pause", "resume", "cancel"])
        changes = {k: v for k, v in self._definition().items() if self.rng.random() < 0.5}

        def call() -> Any:
            if choice == "update":
                return plane.update(tenant, sid, if_match=version, changes=changes)
            return getattr(plane, choice)(tenant, sid)

        if self._call(choice, call) is not None:
            self.run_record.counts[choice] += 1

    # --- the glue AWS provides ------------------------------------------------------------

    def _tick(self, now: int) -> None:
        """EventBridge + the Step Functions Map: one materializer per shard; a run may be
        killed at any crash point (its lease then runs out on its own)."""
        services = self.services("materializer")
        for shard in range(self.settings.shard_count):
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

            holder = f"m{now}-{shard}"
            try:
                Materializer(services, holder, crash=crash).run_shard(now, shard)
            except Killed:
                self.run_record.counts["materializer_killed"] += 1
            except (ClientError, BotoCoreError, PunctualError):
                self.run_record.counts["materializer_failed"] += (
                    1  # Step Functions retries next tick
                )

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

    def _work(self) -> None:
        for tenant in self.tenants:
            worker = Worker(
                self.services(f"worker-{tenant}"),
                tenant,
                self._handler,
                rng=random.Random(self.rng.getrandbits(64)),
            )
            url = self.sqs.get_queue_url(QueueName=queue_name("punctual", tenant, "default"))[
                "QueueUrl"
            ]
            consumer = QueueConsumer(worker, url, wait_seconds=0, threads=1)
            for _ in range(50):
                try:
                    if not consumer.poll_once():
                        break
                except (ClientError, BotoCoreError, PunctualError):
                    self.run_record.counts["worker_poll_failed"] += 1

    def _handler(self, job: Job) -> None:
        stored = self.run_record.services.schedules.current(job.message.schedule_id)
        self.run_record.handler_runs.append(
            (
                job.occurrence_id,
                job.message.schedule_version,
                self.clock.now,
                job.message.available_at.timestamp(),
                stored.schedule.version if stored else 0,
                stored.schedule.state.value if stored else "",
            )
        )
        if self.clock.now < self.end and self.rng.random() < self.config.handler_failure:
            if self.rng.random() < 0.1:
                raise PermanentError("injected permanent failure")
            raise RuntimeError("injected transient failure")

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

    def __init__(self, sim: Simulation) -> None:
        import boto3

        self.sim = sim
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
                self.iterators[shard_id] = self.streams.get_shard_iterator(
                    StreamArn=arn, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
                self.pending[shard_id] = []
            iterator = self.iterators[shard_id]
            while iterator:
                page = self.streams.get_records(ShardIterator=iterator, Limit=1000)
                records = [event_record(r, arn) for r in page.get("Records", []) if wanted(r)]
                self.pending[shard_id] += records
                iterator = page.get("NextShardIterator")
                if not page.get("Records"):
                    break
            self.iterators[shard_id] = iterator

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
            report = relay.relay(batch)
        except Killed:
            self.sim.faults.injected["relay_cut"] += 1
            return 0  # the invocation timed out: the whole batch comes again
        except (ClientError, BotoCoreError):
            return 0
        failed = {int(k) for k in report.failures}
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
