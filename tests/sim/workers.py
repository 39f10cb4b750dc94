"""The tenants' workers in the simulation: the worker SDK polling each tenant's queue, with
handlers that fail, run long (heartbeating while another worker of the tenant polls beside
them, so overlap policies, take-overs and lost leases happen for real), stall past their
lease, stop when a heartbeat says the run is no longer theirs, and die mid-run.

Time is the simulation's: a long run moves the clock forward (within its minute, so the
next step never goes back in time), and what the other worker does meanwhile happens at
those instants. Everything a worker decided is logged for the oracle (tests/sim/oracle.py):
each handler run with its interval and whether it kept its lease, and each delivery's
outcome with its time.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from punctual.domain.errors import PunctualError
from punctual.domain.policies import OverlapPolicy
from punctual.integrations.queues import queue_name
from punctual_client.worker import Job, PermanentError, QueueConsumer, Worker
from punctual_client.worker.core import Delivery, Outcome, Result

if TYPE_CHECKING:
    from tests.sim.world import Simulation

LEASE_SECONDS = 30  # the simulated workers' lease: long runs outlast it
BEAT_SECONDS = 10  # a long run's heartbeat period
LONG_RUN = (15, 50)  # seconds a long run takes
WAITING_TRIES = 3  # long runs forced to make a QUEUE_ONE occurrence wait, at most
STALL_SECONDS = LEASE_SECONDS + 8  # a stalled run's silence: past its lease, whatever the skew


class WorkerKilled(BaseException):
    """A worker process killed mid-run (not an Exception: no error path of the SDK runs)."""


@dataclass
class HandlerRun:
    """One run of a handler, as the simulation saw it."""

    occurrence_id: str
    schedule_id: str
    version: int  # the message's schedule version
    attempt: int
    started: float
    available: float  # the message's available_at
    current: int  # the schedule's version when the handler started (read consistently)
    state: str  # and its state
    overlap: OverlapPolicy  # and its overlap policy
    ended: float = 0.0
    # Longer than its lease without a heartbeat: another worker may have taken the run over
    # (its overlap with that one is the lease's, not a bug).
    lapsed: bool = False
    stopped: bool = False  # a heartbeat said False: the handler stopped
    died: bool = False  # its worker was killed mid-run
    # Its worker knew its clock's offset from SQS's when it started the run (measured from
    # first receives): it holds a message until its instant by the true clock, so it must
    # never start one early, whatever the skews.
    estimated: bool = False


@dataclass(frozen=True)
class Event:
    """A worker's decision on one delivery (an Outcome's value), or "START" of a handler."""

    at: float
    schedule_id: str
    occurrence_id: str
    what: str
    detail: str = ""


@dataclass(frozen=True)
class Delivered:
    """A message a worker received: the occurrence, the schedule version it names, and its
    payload (a digest of its JSON, and its size)."""

    occurrence_id: str
    schedule_id: str
    version: int
    payload: str  # payload_digest(the message's payload)
    size: int


def payload_digest(payload: dict[str, Any]) -> str:
    """The same for the same JSON value, whatever its keys' order."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class _Logged(Worker):
    """A worker that logs each delivery's outcome the moment it is decided (a consumer's
    callback would log a batch's outcomes only once the whole batch, long runs included,
    is done)."""

    def __init__(self, log: Callable[[Delivery, Result], None], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._record = log

    def process(self, delivery: Delivery) -> Result:
        try:
            result = super().process(delivery)
        except Exception as error:
            # (The consumer answers FAILED for it, and the message comes back.)
            self._record(delivery, Result(Outcome.FAILED, f"raised {type(error).__name__}"))
            raise
        self._record(delivery, result)
        return result


class Workers:
    """Every tenant's workers: one polling loop per tenant each minute, and a second worker
    of the same tenant polling beside a long run."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.rng = random.Random(sim.rng.getrandbits(64))
        self._running = 0  # handler runs in progress (nested: the worker beside a long run)

    def work(self) -> None:
        for tenant in self.sim.every_tenant:
            consumer = self._consumer(tenant, "a")
            # The hostile tenant's own messages pile up (its garbage blocks its own runs):
            # its workers take one batch a minute, so that its mess costs the run little time.
            for _ in range(1 if tenant == self.sim.hostile else 50):
                try:
                    if self.rng.random() < self.sim.config.race / 10 and self.sim.faulty:
                        # A tenant's request commits between a claim's read and its write.
                        rival = self.sim.requests.rival()
                        if not self.sim.requests.raced("claim", consumer.poll_once, rival):
                            break
                    elif not consumer.poll_once():
                        break
                except WorkerKilled:
                    self.sim.run_record.counts["worker_killed"] += 1
                    break
                except (ClientError, BotoCoreError, PunctualError):
                    self.sim.run_record.counts["worker_poll_failed"] += 1

    def _consumer(self, tenant: str, name: str) -> QueueConsumer:
        worker = _Logged(
            self._log,
            self.sim.services(f"worker-{tenant}-{name}"),
            tenant,
            self._handler,
            lease_seconds=LEASE_SECONDS,
            rng=random.Random(self.rng.getrandbits(64)),
            hold=self._hold,
        )
        url = self.sim.sqs.get_queue_url(QueueName=queue_name("punctual", tenant, "default"))
        return QueueConsumer(worker, url["QueueUrl"], wait_seconds=0, threads=1)

    def _log(self, delivery: Delivery, result: Result) -> None:
        try:
            message = delivery.message()
        except ValueError:
            return  # (a tenant's own garbage in its queue: rejected, nothing to check)
        self.sim.run_record.events.append(
            Event(
                self.sim.clock.now,
                message.schedule_id,
                message.occurrence_id,
                result.outcome,
                result.detail,
            )
        )
        self.sim.run_record.deliveries.append(
            Delivered(
                message.occurrence_id,
                message.schedule_id,
                message.schedule_version,
                payload_digest(message.payload),
                len(json.dumps(message.payload, separators=(",", ":"))),
            )
        )
        self.sim.run_record.counts[f"worker_{result.outcome.value.lower()}"] += 1

    def _hold(self, seconds: float) -> None:
        """A worker holding a message received before its instant: the time passes (within
        the minute being run; a hold that cannot reach the instant puts the message back)."""
        self.sim.run_record.counts["worker_held"] += 1
        self.sim.advance(seconds)

    # --- the handler ----------------------------------------------------------------------

    def _handler(self, job: Job) -> None:
        sim = self.sim
        stored = sim.run_record.services.schedules.current(job.message.schedule_id)
        run = HandlerRun(
            job.occurrence_id,
            job.message.schedule_id,
            job.message.schedule_version,
            job.attempt,
            sim.clock.now,
            job.message.available_at.timestamp(),
            stored.schedule.run_version if stored else 0,
            stored.schedule.state.value if stored else "",
            stored.schedule.overlap if stored else OverlapPolicy.ALLOW,
        )
        worker = job._worker
        run.estimated = worker.skew.offset(worker.services.now()) is not None
        sim.run_record.runs.append(run)
        sim.run_record.events.append(
            Event(sim.clock.now, run.schedule_id, run.occurrence_id, "START")
        )
        self._running += 1
        try:
            self._body(job, run)
        finally:
            self._running -= 1
            run.ended = sim.clock.now

    def _body(self, job: Job, run: HandlerRun) -> None:
        sim, rng, config = self.sim, self.rng, self.sim.config
        faulty = sim.faulty
        outermost = self._running == 1
        # One-at-a-time schedules run long more often: their overlap policy is then tried.
        chance = config.long_run * (1 if run.overlap is OverlapPolicy.ALLOW else 4)
        long = rng.random() < chance if outermost and faulty else False
        if not long and outermost and faulty and self._waiting_owed(run):
            long = True
            sim.run_record.counts["waiting_owed"] += 1
        if long and not self._run_long(job, run):
            return  # told to stop
        # (Owed, as a stall is: one worker dies in every run, whatever the draws.)
        owed = not sim.run_record.counts["worker_killed"] and sim.clock.now >= sim.end - 3600
        if outermost and faulty and (rng.random() < config.worker_dies or owed):
            run.died = True
            raise WorkerKilled("worker killed mid-run")
        if faulty and rng.random() < config.handler_failure:
            if rng.random() < 0.1:
                raise PermanentError("injected permanent failure")
            raise RuntimeError("injected transient failure")

    def _waiting_owed(self, run: HandlerRun) -> bool:
        """Whether this run of a QUEUE_ONE schedule owes the run an occurrence that waits:
        none has in the run's first half (a run now is relayed at the next step, when the
        run it was asked beside has ended, so one waits only when two of a schedule's
        messages meet by chance), and the relay is up to send its run now at once."""
        sim = self.sim
        return (
            run.overlap is OverlapPolicy.QUEUE_ONE
            and not sim.run_record.counts["worker_waiting"]
            # (a few tries: a run now refused, or given up on, leaves the world as it was)
            and sim.run_record.counts["waiting_owed"] < WAITING_TRIES
            and sim.clock.now >= (sim.start + sim.end) / 2
            and sim.up("relay")
        )

    def _run_long(self, job: Job, run: HandlerRun) -> bool:
        """A run of some seconds, heartbeating (or stalled past its lease once), with the
        tenant's other worker polling beside it. False when a heartbeat said the run is no
        longer this worker's: the handler stops, as docs/worker.md asks (returning or
        raising: the SDK records nothing of this attempt either way)."""
        sim, rng = self.sim, self.rng
        duration = rng.randint(*LONG_RUN)
        # Owed: none stalled in the run's first half (the draws depend on the timing), so
        # the first long run of the second half stalls, early in its minute, and the worker
        # beside it polls: every run meets a lease lost to a take-over.
        owed = (
            not sim.run_record.counts["stalled"]
            and sim.clock.now >= (sim.start + sim.end) / 2
            and sim.clock.now + STALL_SECONDS < sim.step_end
        )
        stall = rng.random() < sim.config.stall or owed
        sim.run_record.counts["long_runs"] += 1
        sim.run_record.counts["stalled"] += stall
        elapsed, beat = 0.0, sim.clock.now
        while elapsed < duration:
            pause = STALL_SECONDS if stall and not elapsed else BEAT_SECONDS
            moved = sim.advance(pause)
            elapsed += pause
            if sim.clock.now - beat >= LEASE_SECONDS - 2 * sim.config.skew - 1:
                run.lapsed = True
            # The tenant runs it now meanwhile (sent at once): the worker beside meets it. (A
            # one-at-a-time schedule's first chunk always: what its policy is for.)
            first = elapsed == pause
            one_at_a_time = run.overlap is not OverlapPolicy.ALLOW
            if rng.random() < 0.3 or (first and one_at_a_time):
                sim.requests.run_now(job.message.tenant_id, run.schedule_id)
                if first and self._waiting_owed(run):
                    # The relay meanwhile (it runs all the time): the run now's message is
                    # in the queue when the worker beside polls, and waits there.
                    sim.mapping.poll()
            if rng.random() < 0.7 or (first and (owed or one_at_a_time)):
                self._beside(job.message.tenant_id)
            if not job.heartbeat():
                run.stopped = True
                sim.run_record.counts["told_to_stop"] += 1
                if rng.random() < 0.5:
                    raise RuntimeError("stopped: the heartbeat said the run is no longer mine")
                return False
            beat = sim.clock.now
            if not moved:
                break  # the minute is spent: the run ends here
        return True

    def _beside(self, tenant: str) -> None:
        """The tenant's second worker polls once, while the first one's handler runs."""
        try:
            self._consumer(tenant, "b").poll_once()
        except (ClientError, BotoCoreError, PunctualError):
            self.sim.run_record.counts["worker_poll_failed"] += 1
