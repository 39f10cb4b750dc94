"""The relay: occurrence INSERTs from the stream become messages in the tenant's queue.

At least once: a record counts as done only after its message was accepted by
SQS; anything else is reported as a batch item failure and comes back. The send
is not written back: the occurrence stays SCHEDULED until a worker claims it
(one write unit per occurrence saved, docs/decisions.md 2026-11-30), so a retried
batch sends the same occurrence id again, which the worker dedupes.

The relay reads nothing before sending: every occurrence inserted SCHEDULED is sent,
even if a change canceled it since (the worker drops a canceled occurrence's message
before the handler runs). A read could only save such rare messages, and an eventually
consistent one that misses a fresh item would drop the occurrence for good.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from punctual.backoff import Backoff, Sleep
from punctual.dal.occurrences import StoredOccurrence, inserted_occurrence
from punctual.domain.errors import Retryable
from punctual.domain.ids import tenant_of_schedule
from punctual.domain.message import MESSAGE_VERSION, message_body
from punctual.domain.occurrence import Lane, Occurrence, OccurrenceState
from punctual.observability import logger
from punctual.services import Services

MAX_DELAY = 900  # SQS holds a message back at most 15 minutes
# A batch's entries that failed transiently are sent again within one invocation this often.
SEND = Backoff(tries=3, base=0.1, cap=0.4)
QUEUE_CACHE_SIZE = 10_000
QUEUE_CACHE_SECONDS = 300
STRICT_SLO_SECONDS = 5  # strict lag above this is late (docs/operations.md)
MAX_BODY_BYTES = 256 * 1024  # SQS's largest message (its attributes count too: ours are small)

CrashHook = Callable[[str], None]


class DelayTooLong(Exception):
    """available_at is more than 900 s away: a planning bug or a forged item; never sent
    early."""


class SendFailed(Exception):
    """SQS did not accept the message after retries."""


class Refused(SendFailed):
    """SQS refused the message as the sender's fault: the same message fails every time."""


def delay_seconds(available_at: int, now: float, *, early: bool = False) -> int:
    """Seconds SQS must hold the message so that it is receivable at ``available_at``:
    rounded up, up to a second late and never early; ``early`` (a target whose consumers
    hold a message until its instant, Target.early_delivery), rounded down: up to a second
    early (less than EARLY_DELIVERY_SECONDS), never late."""
    ahead = available_at - now
    delay = max(0, math.floor(ahead) if early else math.ceil(ahead))
    if delay > MAX_DELAY:
        raise DelayTooLong(f"available_at is {delay} s away; SQS delays at most {MAX_DELAY} s")
    return delay


@dataclass
class _Outbound:
    record_id: str
    occurrence: Occurrence
    payload: dict[str, Any]
    strict: bool
    queue_url: str = ""
    delay: int = 0
    body: str = ""


@dataclass
class RelayReport:
    failures: dict[str, Exception] = field(default_factory=dict)  # record id -> why
    sent: int = 0
    sent_records: list[str] = field(default_factory=list)  # their record ids
    dead: int = 0  # unknown target
    undeliverable: int = 0  # DEAD: SQS refuses its message (the sender's fault, too large)
    refused: int = 0  # an item naming a tenant its key does not (forged): never sent
    malformed: int = 0  # an inserted item that is not an occurrence Punctual wrote: skipped
    # Due more than SQS's 900 s away: not sent now (a forged or mis-planned available_at);
    # the reconciler re-sends it once it is overdue (punctual.pipeline.redrive), never early.
    too_early: int = 0
    # Inserted and due before the mappings were made (Settings.relay_started_at): a new
    # mapping's replay of the stream, not sent again (the reconciler re-sends what no
    # worker took).
    before_start: int = 0
    lags: list[tuple[bool, float]] = field(default_factory=list)  # (strict, seconds)
    # Catch-up lane: receivable minus its (paced) available_at, seconds.
    catchup_lags: list[float] = field(default_factory=list)

    @property
    def late_strict(self) -> int:
        """Strict occurrences made receivable later than the SLO allows."""
        return sum(1 for strict, lag in self.lags if strict and lag > STRICT_SLO_SECONDS)


def outbound(record_id: str, stored: StoredOccurrence) -> _Outbound:
    """A stored occurrence (with its payload) as something to send."""
    occurrence = stored.occurrence
    return _Outbound(
        record_id=record_id,
        occurrence=occurrence,
        payload=stored.payload,
        # Receivable at its scheduled instant: strict (or a late one due now) goes first.
        strict=occurrence.available_at == occurrence.scheduled_for,
    )


@dataclass(frozen=True, slots=True)
class Route:
    """Where a target's messages go, and whether they may arrive early (Target)."""

    queue_url: str
    early: bool = False


class QueueDirectory:
    """(tenant, target) -> queue URL, bounded in size and age; None for an unknown target.

    Only found targets are cached: a miss is read again, strongly consistent, before the
    target counts as unknown (a target created a moment ago may not show in an eventually
    consistent read, and "unknown" makes the occurrence DEAD)."""

    def __init__(self, services: Services, size: int = QUEUE_CACHE_SIZE) -> None:
        self._s = services
        self._size = size
        self._entries: OrderedDict[tuple[str, str], tuple[float, Route]] = OrderedDict()
        self._lock = threading.Lock()

    def url(self, tenant_id: str, target: str) -> str | None:
        route = self.route(tenant_id, target)
        return None if route is None else route.queue_url

    def route(self, tenant_id: str, target: str) -> Route | None:
        """The target's queue and whether it takes messages early (cached as the URL is: a
        change of its early delivery applies within QUEUE_CACHE_SECONDS)."""
        key = (tenant_id, target)
        now = time.monotonic()
        with self._lock:
            found = self._entries.get(key)
            if found and now - found[0] < QUEUE_CACHE_SECONDS:
                self._entries.move_to_end(key)
                return found[1]
        resolved = self._s.tenants.get_target(tenant_id, target) or self._s.tenants.get_target(
            tenant_id, target, consistent=True
        )
        if resolved is None:
            return None
        route = Route(resolved.queue_url, resolved.early_delivery)
        with self._lock:
            self._entries[key] = (now, route)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return route


def _replayed(record: dict[str, Any], found: _Outbound, started_at: int) -> bool:
    """Inserted and due before ``started_at`` (Relay.relay). A record without its creation
    time (not one a mapping hands over) is not taken for a replay."""
    created = record.get("dynamodb", {}).get("ApproximateCreationDateTime")
    if not isinstance(created, int | float):
        return False
    return created < started_at and found.occurrence.available_at < started_at


class Relay:
    def __init__(
        self,
        services: Services,
        queues: QueueDirectory | None = None,
        *,
        crash: CrashHook | None = None,
        workers: int = 8,
        sleep: Sleep | None = None,
    ) -> None:
        self._s = services
        self.queues = queues or QueueDirectory(services)
        self._crash = crash or (lambda point: None)
        self.workers = workers
        self._sleep = sleep or services.sleep

    def relay(
        self, records: Iterable[dict[str, Any]], *, started_at: int | None = None
    ) -> RelayReport:
        """Send the occurrences the records inserted. A record that is not one (another
        event, a tenant's bad data) is skipped, never a failure of the batch: one tenant's
        item must not hold back the stream shard that other tenants' fires share.

        ``started_at`` (a mapping's records only; Settings.relay_started_at): a record
        inserted before it, of an occurrence due before it, is a new mapping's replay of
        the stream (it starts at the oldest record, up to a day back): counted, not sent.
        The mappings before sent it, or were gone or behind, and then the reconciler
        re-sends it as any message lost: up to a day of fires is not sent again at once.
        One due later is sent (a duplicate of the old mapping's message at worst, which
        the worker's claim absorbs), as is anything inserted later, a late fire included."""
        bad = self._s.bad_items
        before = bad.count
        parsed, replayed = [], 0
        for record in records:
            found = self._parse(record)
            if found is None:
                continue
            if started_at is not None and _replayed(record, found, started_at):
                replayed += 1
                continue
            parsed.append(found)
        report = self.send(parsed)
        report.malformed = bad.count - before
        report.before_start = replayed
        return report

    def send(self, outbound: list[_Outbound]) -> RelayReport:
        """Send occurrences (from stream records, or re-sent: the reconciler's re-drive,
        the API's prompt send) to their queues."""
        report = RelayReport()
        by_queue: dict[str, list[_Outbound]] = {}
        now = self._s.now()
        for item in outbound:
            owner = tenant_of_schedule(item.occurrence.schedule_id)
            if owner != item.occurrence.tenant_id or owner is None:
                # Not an occurrence Punctual wrote: a tenant's worker may write items under
                # its own schedules' keys (IAM allows no other), and one naming another
                # tenant would send into that tenant's queue, from the stream or re-sent
                # once overdue. Dropped and counted, on every path that sends.
                logger.warning(
                    "refused an occurrence whose tenant its key does not name",
                    extra={"occurrence_id": item.occurrence.occurrence_id, "tenant": owner},
                )
                report.refused += 1
                continue
            try:
                route = self.queues.route(item.occurrence.tenant_id, item.occurrence.target)
            except Retryable as error:
                # DynamoDB throttled (or did not answer) the target's read, its SDK retries
                # spent: this record comes back (a batch item failure), the rest of the batch
                # goes on; a raise would fail every record of the batch.
                report.failures[item.record_id] = error
                continue
            if route is None:
                why = "the target does not exist (deleted or never created)"
                report.dead += self._dead(item, why, report)
                continue
            try:
                item.delay = delay_seconds(item.occurrence.available_at, now, early=route.early)
            except DelayTooLong as error:
                # Not a failure: a retried batch would meet it again and again, holding back
                # every record after it on its stream shard (other tenants' too).
                logger.error(
                    "an occurrence due more than 900 s ahead was not sent; the reconciler "
                    "re-sends it once overdue",
                    extra={"occurrence_id": item.occurrence.occurrence_id, "error": str(error)},
                )
                report.too_early += 1
                continue
            item.body = message_body(item.occurrence, item.payload)
            if len(item.body.encode()) > MAX_BODY_BYTES:
                # Not a payload Punctual stores (32 KiB at most): a forged item. SQS would
                # refuse its batch whole, every time.
                why = f"its message is over SQS's {MAX_BODY_BYTES} bytes"
                report.undeliverable += self._dead(item, why, report)
                continue
            item.queue_url = route.queue_url
            by_queue.setdefault(route.queue_url, []).append(item)
        # Fairness: every queue is sent concurrently, so one tenant's top-of-hour batch does
        # not hold back another tenant's occurrences; within a queue strict goes first.
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(by_queue)))) as pool:
            for outcome in pool.map(self._send_queue, by_queue.values()):
                self._merge(outcome, report)
        return report

    # --- parsing and filtering ----------------------------------------------------------

    def _parse(self, record: dict[str, Any]) -> _Outbound | None:
        inserted = inserted_occurrence(record, self._s.bad_items)
        if inserted is None:
            return None
        if inserted.occurrence.state is not OccurrenceState.SCHEDULED:
            return None  # inserted final (MISSED by a repair): nothing to deliver
        return outbound(str(record["dynamodb"]["SequenceNumber"]), inserted)

    # --- sending ------------------------------------------------------------------------

    def _send_queue(self, items: list[_Outbound]) -> RelayReport:
        report = RelayReport()
        ordered = sorted(items, key=lambda o: (not o.strict, o.occurrence.available_at))
        for start in range(0, len(ordered), 10):
            chunk = ordered[start : start + 10]
            try:
                sent, failed = self._send_batch(chunk)
            except (ClientError, BotoCoreError) as problem:
                # Throttled, or no answer (the messages may have gone in): these records come
                # back and are sent again; the other queues and chunks go on.
                sent, failed = [], [(item, SendFailed(str(problem))) for item in chunk]
            for item, error in failed:
                if isinstance(error, Refused):
                    # SQS will refuse it again, every time: it can never be sent (DEAD, with
                    # SQS's reason), and its record must not hold the batch back.
                    why = f"SQS refused the message: {error}"
                    report.undeliverable += self._dead(item, why, report)
                else:
                    report.failures[item.record_id] = error
            sent_at = self._s.now()
            self._crash("after_send")
            for item in sent:
                report.sent += 1
                report.sent_records.append(item.record_id)
                receivable, occurrence = sent_at + item.delay, item.occurrence
                if occurrence.lane is Lane.CATCHUP:
                    # Hours past its fire by design: its lag is behind its paced time.
                    report.catchup_lags.append(receivable - occurrence.available_at)
                else:
                    report.lags.append((item.strict, receivable - occurrence.scheduled_for))
        return report

    def _send_batch(
        self, chunk: list[_Outbound]
    ) -> tuple[list[_Outbound], list[tuple[_Outbound, Exception]]]:
        pending = {str(i): item for i, item in enumerate(chunk)}
        sent: list[_Outbound] = []
        refused: dict[str, _Outbound] = {}  # the sender's fault: the same entry fails again
        last_error: dict[str, str] = {}
        for _ in SEND.attempts(self._sleep):
            if not pending:
                break
            answer = self._s.sqs.send_message_batch(
                QueueUrl=chunk[0].queue_url,
                Entries=[self._entry(key, item) for key, item in pending.items()],
            )
            for ok in answer.get("Successful", []):
                sent.append(pending.pop(ok["Id"]))
            for bad in answer.get("Failed", []):
                said = (bad.get("Code"), bad.get("Message"))  # SQS may leave out either
                last_error[bad["Id"]] = ": ".join(part for part in said if part)
                if bad.get("SenderFault"):
                    refused[bad["Id"]] = pending.pop(bad["Id"])
        failed: list[tuple[_Outbound, Exception]] = [
            (item, Refused(last_error.get(key, "refused"))) for key, item in refused.items()
        ]
        failed += [(i, SendFailed(last_error.get(k, "not accepted"))) for k, i in pending.items()]
        return sent, failed

    @staticmethod
    def _entry(key: str, item: _Outbound) -> dict[str, Any]:
        occurrence = item.occurrence
        return {
            "Id": key,
            "MessageBody": item.body,
            "DelaySeconds": item.delay,
            "MessageAttributes": {
                name: {"DataType": "String", "StringValue": value}
                for name, value in (
                    ("occurrence_id", occurrence.occurrence_id),
                    ("schedule_id", occurrence.schedule_id),
                    ("tenant_id", occurrence.tenant_id),
                    ("message_version", str(MESSAGE_VERSION)),
                )
            },
        }

    def _dead(self, item: _Outbound, reason: str, report: RelayReport) -> bool:
        """SCHEDULED -> DEAD (it can never be sent); a no-op if it has moved on meanwhile
        (a cancel got there first: CANCELED stays CANCELED). Its record is then done: never
        retried, so it holds back nothing after it. False when DynamoDB throttled the write
        (its SDK retries spent): the record is a failure of its own, made DEAD on its retry."""
        try:
            self._s.occurrences.settle_scheduled(
                item.occurrence.occurrence_id, OccurrenceState.DEAD, reason
            )
        except Retryable as error:
            report.failures[item.record_id] = error
            return False
        return True

    @staticmethod
    def _merge(part: RelayReport, into: RelayReport) -> None:
        into.failures.update(part.failures)
        into.sent += part.sent
        into.sent_records += part.sent_records
        into.undeliverable += part.undeliverable
        into.lags += part.lags
        into.catchup_lags += part.catchup_lags
