"""The worker side of an occurrence: claim, heartbeat and completion, fenced by a lease token.

Two kinds of slot items limit what runs at once, both leased with the same token as the
occurrence so that a crashed worker's slots free themselves when its lease expires. Both
live in the tenants table under the tenant's own run partition ``R#<tenant>``, apart from
the tenant's record (``T#<tenant>``: quotas and usage), so a worker's role can write slots
and nothing else of the tenants table (docs/security.md):
- the schedule's run slot (sk ``SLOT#<schedule_id>``) for SKIP_IF_RUNNING and QUEUE_ONE
  schedules;
- the tenant's concurrency slots (sk ``RUN#00000`` .. ``RUN#<limit-1>``).
A QUEUE_ONE schedule has a third, its wait slot (sk ``WAIT#<schedule_id>``): the one
occurrence waiting for the run slot holds it, with an expiry of its own (a waiting
occurrence holds no run lease), until its claim takes the run slot and empties it.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from punctual.dal.common import (
    UNPARSABLE,
    BadItems,
    ConditionFailed,
    Item,
    Label,
    Transactions,
    batch_get,
    batch_get_all,
    dynamo,
    from_dynamo,
    to_dynamo,
    values,
)
from punctual.dal.tables import current_key, occurrence_key
from punctual.domain.errors import Retryable
from punctual.domain.occurrence import AttemptOutcome, OccurrenceState
from punctual.domain.policies import OverlapPolicy, RetryPolicy
from punctual.domain.schedule import ScheduleState
from punctual.settings import Settings

# The run protocol this module speaks: which items a claim, a heartbeat and a completion
# read and write, under which conditions. Workers of one tenant must all speak the one the
# tables hold; a change is a new version, and a new punctual-core release (docs/worker.md,
# *Versions*). 1: each attempt an item of its own; 2 (2026-12-03): attempts on the
# occurrence item.
RUN_PROTOCOL_VERSION = 2

# The wait slot is free, its wait expired (the waiter gave up or died), or it is ours.
WAIT_FREE_OR_MINE = (
    "attribute_not_exists(occurrence_id) OR expires_at <= :now OR occurrence_id = :occ"
)


def run_partition(tenant_id: str) -> str:
    """The tenant's slots: the only partition of the tenants table its workers write."""
    return f"R#{tenant_id}"


def concurrency_sk(slot: int) -> str:
    return f"RUN#{slot:05d}"


def run_slot_sk(schedule_id: str) -> str:
    return f"SLOT#{schedule_id}"


def wait_slot_sk(schedule_id: str) -> str:
    return f"WAIT#{schedule_id}"


@dataclass(frozen=True, slots=True)
class RunLease:
    """What a claim took: the token fences every later write of this attempt."""

    occurrence_id: str
    tenant_id: str
    schedule_id: str
    attempt_no: int
    token: str
    expires_at: int
    concurrency_slot: int
    overlap: bool  # takes the schedule's run slot
    # A new QUEUE_ONE occurrence's claim: no other may be waiting, and it frees the wait slot
    # (not a take-over's or a retry's: that occurrence's run goes on, ahead of any waiting).
    queue_one: bool = False
    # Where the claim put this attempt in the occurrence's ``attempts`` list (attempt_no - 1,
    # unless the occurrence began under the old layout, with attempt items of its own).
    attempt_index: int = 0


@dataclass(frozen=True, slots=True)
class Seen:
    """The occurrence as the worker read it before claiming: the claim is conditional on it."""

    state: OccurrenceState
    attempt_count: int
    lease_token: str | None
    attempts: tuple[Item, ...] = ()  # the occurrence's attempt history, oldest first


@dataclass(frozen=True, slots=True)
class StoredRun:
    """An occurrence as a worker decides on it before a claim."""

    tenant_id: str
    schedule_version: int
    state: OccurrenceState
    attempt_count: int
    lease_token: str | None
    lease_expires_at: int  # 0: no lease
    retry_at: int  # 0: not backing off
    available_at: int
    reason: str
    dlq_pending: bool  # DEAD, and its DLQ copy not sent yet
    attempts: tuple[Item, ...] = ()

    @property
    def seen(self) -> Seen:
        return Seen(self.state, self.attempt_count, self.lease_token, self.attempts)


@dataclass(frozen=True, slots=True)
class ScheduleForRun:
    """What of a schedule's CURRENT item a claim decides on (not its payload)."""

    run_version: int  # the version its fires carry (Schedule.run_version)
    state: ScheduleState
    retry: RetryPolicy
    overlap: OverlapPolicy


def _abandoned(seen: Seen) -> bool:
    """Whether the last entry of the history is the attempt whose expired lease we read
    (RUNNING): a run that a worker of the old SDK started has no entry (its attempt item
    is apart), and the last entry is then an earlier attempt, ended already."""
    return (
        seen.state is OccurrenceState.RUNNING
        and bool(seen.attempts)
        and int(seen.attempts[-1].get("attempt_no", 0)) == seen.attempt_count
    )


def _finished_by(
    item: Item | None, lease: RunLease, state: OccurrenceState, outcome: AttemptOutcome, now: int
) -> bool:
    """Whether the completion this lease asked for is what the refused write found: a call
    that succeeded but whose answer was lost is sent again by the SDK and meets its own
    write (no newer attempt, ours closed with this outcome at this time)."""
    if not item or item.get("state") != state.value or "lease_token" in item:
        return False
    try:
        if int(item.get("attempt_count", 0)) != lease.attempt_no:
            return False
        history = item.get("attempts") or []
        if len(history) <= lease.attempt_index:
            return False
        mine = history[lease.attempt_index]
        return mine.get("outcome") == outcome.value and int(mine.get("finished_at", -1)) == now
    except UNPARSABLE:
        return False  # not what this SDK wrote: not our own completion


def _held(slot: Item, now: int) -> bool:
    """Whether a slot item holds a live lease; one that is not what the SDK writes (the
    tenant's workers may write its slots) counts as held: the claim's condition decides."""
    try:
        return int(slot.get("expires_at", 0)) > now
    except UNPARSABLE:
        return True


def _stored_run(item: Item) -> StoredRun:
    return StoredRun(
        tenant_id=str(item["tenant_id"]),
        schedule_version=int(item["schedule_version"]),
        state=OccurrenceState(item["state"]),
        attempt_count=int(item.get("attempt_count", 0)),
        lease_token=item.get("lease_token"),
        lease_expires_at=int(item.get("lease_expires_at") or 0),
        retry_at=int(item.get("retry_at") or 0),
        available_at=int(item["available_at"]),
        reason=str(item.get("reason", "")),
        dlq_pending=bool(item.get("dlq_pending")),
        attempts=tuple(item.get("attempts") or ()),
    )


def _schedule_for_run(item: Item) -> ScheduleForRun:
    definition = item.get("definition", {})
    return ScheduleForRun(
        run_version=int(definition.get("runs_as", item["version"])),
        state=ScheduleState(item["state"]),
        retry=RetryPolicy.model_validate(definition.get("retry", {})),
        overlap=OverlapPolicy(definition.get("overlap", OverlapPolicy.ALLOW.value)),
    )


class RunStore:
    def __init__(self, client: Any, settings: Settings, bad: BadItems | None = None) -> None:
        self._client = dynamo(client)
        self._bad = bad or BadItems()
        self._occurrences = settings.occurrences_table
        self._schedules = settings.schedules_table
        self._tenants = settings.tenants_table

    @staticmethod
    def _occurrence_key(occurrence_id: str) -> dict[str, Any]:
        return to_dynamo(occurrence_key(occurrence_id))

    @staticmethod
    def _run_slot_key(tenant_id: str, schedule_id: str) -> dict[str, Any]:
        return to_dynamo({"pk": run_partition(tenant_id), "sk": run_slot_sk(schedule_id)})

    @staticmethod
    def _wait_slot_key(tenant_id: str, schedule_id: str) -> dict[str, Any]:
        return to_dynamo({"pk": run_partition(tenant_id), "sk": wait_slot_sk(schedule_id)})

    @staticmethod
    def _concurrency_key(tenant_id: str, slot: int) -> dict[str, Any]:
        return to_dynamo({"pk": run_partition(tenant_id), "sk": concurrency_sk(slot)})

    # --- reads --------------------------------------------------------------------------

    def read(
        self, occurrence_id: str, schedule_id: str
    ) -> tuple[StoredRun | None, ScheduleForRun | None]:
        """The occurrence and its schedule's current item, strongly consistent (the claim is
        conditional on what it read: a stale read only costs a refused claim, but a read
        that missed a cancel or a newer version would run what must not run), one call."""
        request: dict[str, Any] = {
            self._occurrences: {"Keys": [self._occurrence_key(occurrence_id)]},
            self._schedules: {
                "Keys": [to_dynamo(current_key(schedule_id))],
                # Only what the claim decides on: not the payload (up to 32 KiB of reads).
                "ProjectionExpression": (
                    "schedule_id, version, #s, #d.retry, #d.overlap, #d.runs_as"
                ),
                "ExpressionAttributeNames": {"#s": "state", "#d": "definition"},
            },
        }
        for part in request.values():
            part["ConsistentRead"] = True
        found: dict[str, Item] = {}
        for answer in batch_get_all(self._client, request):
            for table, items in answer["Responses"].items():
                for raw in items:
                    found[table] = from_dynamo(raw)
        occurrence, schedule = found.get(self._occurrences), found.get(self._schedules)
        return (
            self._run_of(occurrence) if occurrence else None,
            _schedule_for_run(schedule) if schedule else None,
        )

    def _run_of(self, item: Item) -> StoredRun | None:
        """The occurrence as a claim decides on it; None (as if absent: the message is then
        rejected) for an item that is not one Punctual wrote (the tenant's bad data)."""
        try:
            return _stored_run(item)
        except UNPARSABLE as error:
            self._bad.skip(self._occurrences, item, error)
            return None

    def schedule_version(
        self, schedule_id: str, *, consistent: bool = False
    ) -> tuple[int, str] | None:
        """(run version, state) of the schedule: the version its fires belong to
        (``Schedule.run_version``). Eventually consistent for the cooperative-cancel
        check (a hint, read again every few seconds); ``consistent`` for the check after a
        claim, which must see a change committed a moment before. Retryable when DynamoDB
        is busy."""
        found = self._client.get_item(
            TableName=self._schedules,
            Key=to_dynamo(current_key(schedule_id)),
            ProjectionExpression="version, #d.runs_as, #s",
            ExpressionAttributeNames={"#s": "state", "#d": "definition"},
            ConsistentRead=consistent,
        ).get("Item")
        if not found:
            return None
        item = from_dynamo(found)
        runs_as = item.get("definition", {}).get("runs_as", item["version"])
        return int(runs_as), str(item["state"])

    def busy_slots(self, tenant_id: str, candidates: list[int], now: int) -> set[int]:
        """Which of ``candidates`` hold a live lease (eventually consistent: a hint only; the
        claim's condition decides)."""
        keys = [{"pk": run_partition(tenant_id), "sk": concurrency_sk(slot)} for slot in candidates]
        found = batch_get(self._client, self._tenants, keys, consistent=False)
        return {int(str(item["sk"]).removeprefix("RUN#")) for item in found if _held(item, now)}

    # --- claim --------------------------------------------------------------------------

    def claim(self, lease: RunLease, *, seen: Seen, now: int, queued_at: int) -> None:
        """One transaction: RUNNING with a new lease and the attempt added to its history
        (a taken-over attempt marked LOST), and the slots.

        No check of the schedule: the worker reads its version again, strongly consistent,
        once this commits, and withdraws the claim if it changed (docs/worker.md, *What a
        claim checks*). Raises ConditionFailed naming the action whose condition failed."""
        occurrence_conditions = [
            "tenant_id = :tenant",
            "#state = :seen",
            "attempt_count = :count",
        ]
        if seen.state is OccurrenceState.RUNNING:
            # Race: two workers taking over the same expired lease; only the one that read
            # this token (and sees it expired) may replace it.
            occurrence_conditions += ["lease_token = :old_token", "lease_expires_at <= :now"]
        history = [dict(a) for a in seen.attempts]
        if _abandoned(seen):
            history[-1] |= {"outcome": AttemptOutcome.LOST.value}
        history.append(
            {
                "attempt_no": lease.attempt_no,
                "started_at": now,
                "lease_expires_at": lease.expires_at,
                "outcome": AttemptOutcome.RUNNING.value,
            }
        )
        names = {"#state": "state"}
        actions: list[tuple[Label, dict[str, Any]]] = [
            (
                Label.OCCURRENCE,
                {
                    "Update": {
                        "TableName": self._occurrences,
                        "Key": self._occurrence_key(lease.occurrence_id),
                        # The history is written whole: every write of it (a claim, a
                        # completion, a refusal) moves the state, the attempt count or the
                        # token, so the conditions below also say it is the one we read.
                        "UpdateExpression": (
                            "SET #state = :running, lease_token = :token, "
                            "lease_expires_at = :expires, attempt_count = :attempt, "
                            "enqueued_at = if_not_exists(enqueued_at, :queued), "
                            "attempts = :history"
                        ),
                        # Race: another worker claimed (or a cancel or completion landed)
                        # between our read and this write; the state and the attempt count
                        # we read must still hold, so at most one claim per attempt wins.
                        "ConditionExpression": " AND ".join(occurrence_conditions),
                        "ExpressionAttributeNames": names,
                        "ExpressionAttributeValues": values(
                            tenant=lease.tenant_id,
                            seen=seen.state.value,
                            count=seen.attempt_count,
                            running=OccurrenceState.RUNNING.value,
                            token=lease.token,
                            expires=lease.expires_at,
                            attempt=lease.attempt_no,
                            queued=queued_at,
                            history=history,
                            **(
                                {"old_token": seen.lease_token, "now": now}
                                if seen.state is OccurrenceState.RUNNING
                                else {}
                            ),
                        ),
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                },
            ),
            (
                Label.CONCURRENCY_SLOT,
                self._take_slot(
                    self._tenants,
                    self._concurrency_key(lease.tenant_id, lease.concurrency_slot),
                    lease,
                    now,
                ),
            ),
        ]
        if lease.overlap:
            actions.append(
                (
                    Label.RUN_SLOT,
                    self._take_slot(
                        self._tenants,
                        self._run_slot_key(lease.tenant_id, lease.schedule_id),
                        lease,
                        now,
                    ),
                )
            )
        if lease.queue_one:
            actions.append(
                (
                    Label.WAIT_SLOT,
                    {
                        # (an Update that empties it, not a Delete: a worker's role may
                        # update its slots and nothing more, docs/security.md)
                        "Update": {
                            "TableName": self._tenants,
                            "Key": self._wait_slot_key(lease.tenant_id, lease.schedule_id),
                            "UpdateExpression": "REMOVE occurrence_id, expires_at",
                            # Race: an occurrence that arrives while another waits for the
                            # run slot must not run before it. Free (or expired), or this
                            # occurrence's own wait, which the claim ends.
                            "ConditionExpression": WAIT_FREE_OR_MINE,
                            "ExpressionAttributeValues": values(now=now, occ=lease.occurrence_id),
                            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                        }
                    },
                )
            )
        Transactions(self._client).commit(actions)

    def wait(
        self, tenant_id: str, schedule_id: str, occurrence_id: str, *, until: int, now: int
    ) -> str | None:
        """Hold the schedule's wait slot until ``until`` (QUEUE_ONE); None when held (taken
        or renewed), else the occurrence that waits already."""
        try:
            self._client.update_item(
                TableName=self._tenants,
                Key=self._wait_slot_key(tenant_id, schedule_id),
                UpdateExpression="SET occurrence_id = :occ, expires_at = :until",
                # Race: two occurrences that find the run slot held both try to wait;
                # one does. Free, expired (its holder gave up or died), or already ours.
                ConditionExpression=WAIT_FREE_OR_MINE,
                ExpressionAttributeValues=values(occ=occurrence_id, until=until, now=now),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailed as refused:
            return str((refused.old_item or {}).get("occurrence_id", "another occurrence"))
        return None

    def stop_waiting(self, tenant_id: str, schedule_id: str, occurrence_id: str) -> None:
        """Free the wait slot if this occurrence holds it (it will not run: stale, done);
        best effort, since the slot expires anyway."""
        with suppress(ConditionFailed, Retryable):
            self._client.update_item(
                TableName=self._tenants,
                Key=self._wait_slot_key(tenant_id, schedule_id),
                UpdateExpression="REMOVE occurrence_id, expires_at",
                # Race: the slot passed to another occurrence after ours expired.
                ConditionExpression="occurrence_id = :occ",
                ExpressionAttributeValues=values(occ=occurrence_id),
            )

    @staticmethod
    def _take_slot(table: str, key: dict[str, Any], lease: RunLease, now: int) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": table,
                "Key": key,
                "UpdateExpression": (
                    "SET lease_token = :token, expires_at = :expires, occurrence_id = :occ"
                ),
                # Race: two claims for one slot. It is free, or its holder's lease expired
                # (a crashed worker), or it is this occurrence's own (a takeover).
                "ConditionExpression": (
                    "attribute_not_exists(lease_token) OR expires_at <= :now"
                    " OR occurrence_id = :occ"
                ),
                "ExpressionAttributeValues": values(
                    token=lease.token,
                    expires=lease.expires_at,
                    occ=lease.occurrence_id,
                    now=now,
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    # --- refusals (no lease held) ----------------------------------------------------

    def refuse(
        self,
        occurrence_id: str,
        *,
        seen: Seen,
        state: OccurrenceState,
        reason: str,
        now: int,
    ) -> bool:
        """Move from the state we read to a final ``state`` without running; False if the
        occurrence moved meanwhile (then the caller reads it again). An abandoned run's
        attempt (RUNNING, lease expired) is marked LOST in the same transaction. A DEAD
        occurrence is flagged ``dlq_pending`` until its message is in the DLQ."""
        conditions = ["#state = :seen"]
        extra: dict[str, Any] = {}
        if seen.state is OccurrenceState.RUNNING:
            # Race: a worker holding a live lease must not be overruled; only an expired
            # lease with the token we read may be ended.
            conditions += ["lease_token = :old_token", "lease_expires_at <= :now"]
            extra = {"old_token": seen.lease_token}
        expression = "SET #state = :to, reason = :why, finished_at = :now"
        if state is OccurrenceState.DEAD:
            expression += ", dlq_pending = :true"
            extra["true"] = True
        if _abandoned(seen):
            # The abandoned run's attempt is LOST (the conditions say it is the last one).
            expression += f", attempts[{len(seen.attempts) - 1}].outcome = :lost"
            extra["lost"] = AttemptOutcome.LOST.value
        actions: list[tuple[Label, dict[str, Any]]] = [
            (
                Label.OCCURRENCE,
                {
                    "Update": {
                        "TableName": self._occurrences,
                        "Key": self._occurrence_key(occurrence_id),
                        "UpdateExpression": expression,
                        "ConditionExpression": " AND ".join(conditions),
                        "ExpressionAttributeNames": {"#state": "state"},
                        "ExpressionAttributeValues": values(
                            seen=seen.state.value, to=state.value, why=reason, now=now, **extra
                        ),
                    }
                },
            )
        ]
        try:
            Transactions(self._client).commit(actions)
        except (ConditionFailed, Retryable):
            return False
        return True

    def dlq_sent(self, occurrence_id: str) -> None:
        """The DEAD occurrence's message is in the DLQ: clear the flag (if it is still set)."""
        with suppress(ConditionFailed):
            self._client.update_item(
                TableName=self._occurrences,
                Key=self._occurrence_key(occurrence_id),
                UpdateExpression="REMOVE dlq_pending",
                # Race: the flag cleared already (a redelivery copied it too) or the item gone
                # (its retention ended): an update without a condition would make an item.
                ConditionExpression="attribute_exists(dlq_pending)",
            )

    # --- while running ------------------------------------------------------------------

    def extend(self, lease: RunLease, expires_at: int) -> None:
        """Heartbeat: the occurrence's lease and both slots move together, or not at all."""
        held = [
            (Label.OCCURRENCE, self._occurrences, self._occurrence_key(lease.occurrence_id)),
            (
                Label.CONCURRENCY_SLOT,
                self._tenants,
                self._concurrency_key(lease.tenant_id, lease.concurrency_slot),
            ),
        ]
        if lease.overlap:
            held.append(
                (
                    Label.RUN_SLOT,
                    self._tenants,
                    self._run_slot_key(lease.tenant_id, lease.schedule_id),
                )
            )
        Transactions(self._client).commit(
            [
                (
                    label,
                    self._fenced(key, table, lease, expires_at, running=label == Label.OCCURRENCE),
                )
                for label, table, key in held
            ],
        )

    @staticmethod
    def _fenced(
        key: dict[str, Any], table: str, lease: RunLease, expires_at: int, *, running: bool
    ) -> dict[str, Any]:
        """Move a held item's expiry: the occurrence's lease (``running``) or a slot's."""
        # Race: our lease expired and another worker took the item over (new token); a
        # stale worker must not extend the new holder's lease. The occurrence must also be
        # RUNNING still: a refusal of an expired run (CANCELED, DEAD, SKIPPED_OVERLAP)
        # keeps the token, and the run is no longer ours to extend.
        update: dict[str, Any] = {
            "TableName": table,
            "Key": key,
            "UpdateExpression": f"SET {'lease_' if running else ''}expires_at = :expires",
            "ConditionExpression": "lease_token = :token",
            "ExpressionAttributeValues": values(token=lease.token, expires=expires_at),
        }
        if running:
            update["ConditionExpression"] += " AND #state = :running"
            update["ExpressionAttributeNames"] = {"#state": "state"}
            update["ExpressionAttributeValues"] |= values(running=OccurrenceState.RUNNING.value)
        return {"Update": update}

    def finish(
        self,
        lease: RunLease,
        *,
        state: OccurrenceState,
        outcome: AttemptOutcome,
        now: int,
        error: str | None = None,
        retry_at: int | None = None,
    ) -> None:
        """RUNNING -> SUCCEEDED / RETRY_WAIT / DEAD with the attempt's outcome, fenced by the
        lease token: one write of one item. Raises ConditionFailed(Label.OCCURRENCE) when the lease
        was lost."""
        attempt = f"attempts[{lease.attempt_index}]"
        sets: dict[str, Any] = {"to": state.value, "now": now, "outcome": outcome.value}
        expression = (
            f"SET #state = :to, finished_at = :now, {attempt}.outcome = :outcome, "
            f"{attempt}.finished_at = :now"
        )
        if error is not None:
            expression += f", reason = :why, {attempt}.#e = :why"
            sets["why"] = error[:1000]
        if retry_at is not None:
            expression += ", retry_at = :retry_at"
            sets["retry_at"] = retry_at
        if state is OccurrenceState.DEAD:
            # Set with the DEAD write, cleared once the message is in the DLQ: a crash in
            # between is finished by the next delivery, and only the lease holder copies.
            expression += ", dlq_pending = :true"
            sets["true"] = True
        try:
            self._client.update_item(
                TableName=self._occurrences,
                Key=self._occurrence_key(lease.occurrence_id),
                UpdateExpression=expression + " REMOVE lease_token",
                # Race: the lease expired and another worker claimed the occurrence (new
                # token); this late completion must not overwrite the new attempt's state.
                ConditionExpression="#state = :running AND lease_token = :token",
                ExpressionAttributeNames={"#state": "state"}
                | ({"#e": "error"} if error is not None else {}),
                ExpressionAttributeValues=values(
                    running=OccurrenceState.RUNNING.value, token=lease.token, **sets
                ),
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailed as refused:
            if not _finished_by(refused.old_item, lease, state, outcome, now):
                raise ConditionFailed(Label.OCCURRENCE, refused.old_item) from refused

    def withdraw(self, lease: RunLease, *, reason: str, now: int) -> None:
        """Undo a claim whose schedule changed before its handler ran: CANCELED with the
        reason, the attempt taken out of the history and the count back, as if the claim
        had been refused. Raises ConditionFailed(Label.OCCURRENCE) when the lease was lost."""
        self._undo_claim(
            lease,
            "SET #state = :canceled, reason = :why, finished_at = :now, attempt_count = :before "
            f"REMOVE lease_token, attempts[{lease.attempt_index}]",
            canceled=OccurrenceState.CANCELED.value,
            why=reason,
            now=now,
            before=lease.attempt_no - 1,
        )

    def unclaim(self, lease: RunLease, seen: Seen) -> None:
        """Undo a claim made from SCHEDULED or RETRY_WAIT whose handler has not run: the
        state, attempt count and history as ``seen``, no lease, so the attempt is not spent
        (the worker could not check the schedule after it). A claim from those states only
        appended its entry to the history, so taking that entry out restores it. (A
        QUEUE_ONE wait the claim ended stays ended: the next delivery waits again if it
        must.) Raises ConditionFailed (Label.OCCURRENCE) when the lease was lost."""
        assert seen.state is not OccurrenceState.RUNNING, "a takeover's lease is not restored"
        self._undo_claim(
            lease,
            "SET #state = :seen, attempt_count = :before "
            f"REMOVE lease_token, lease_expires_at, attempts[{lease.attempt_index}]",
            seen=seen.state.value,
            before=seen.attempt_count,
        )

    def _undo_claim(self, lease: RunLease, update: str, **given: Any) -> None:
        """ConditionFailed when the claim is no longer this lease's (the caller leaves it to
        run out)."""
        self._client.update_item(
            TableName=self._occurrences,
            Key=self._occurrence_key(lease.occurrence_id),
            UpdateExpression=update,
            # Race: none expected within the lease; a stale worker must not undo a newer
            # holder's claim.
            ConditionExpression="#state = :running AND lease_token = :token",
            ExpressionAttributeNames={"#state": "state"},
            ExpressionAttributeValues=values(
                running=OccurrenceState.RUNNING.value, token=lease.token, **given
            ),
        )

    def release(self, lease: RunLease) -> None:
        """Free the slots this lease holds; best effort, since an expired lease frees them too."""
        slots = [(self._tenants, self._concurrency_key(lease.tenant_id, lease.concurrency_slot))]
        if lease.overlap:
            slots.append((self._tenants, self._run_slot_key(lease.tenant_id, lease.schedule_id)))
        for table, key in slots:
            try:
                self._client.update_item(
                    TableName=table,
                    Key=key,
                    UpdateExpression="REMOVE lease_token, expires_at, occurrence_id",
                    # Race: our lease expired and another occurrence took the slot; it
                    # is theirs now and must stay held.
                    ConditionExpression="lease_token = :token",
                    ExpressionAttributeValues=values(token=lease.token),
                )
            except ConditionFailed:
                continue
