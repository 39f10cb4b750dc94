"""A hostile tenant in the simulation: its worker's credentials write, now and then, anything
its generated IAM policy allows (tests/hostile.py judges each call as IAM would), malformed:

- an item of only a state at an occurrence key of its own schedule (UpdateItem makes it);
- its real occurrences changed: another state, a lease, a forged tenant, an instant or an
  availability far off, attributes of the wrong type, a wall time that is none, a payload
  over SQS's limit;
- whole occurrence items under keys of its own schedules that do not exist;
- its run slots (the tenants table's ``R#<tenant>`` partition) filled with garbage;
- backfill records under its own schedules' keys: unreadable keys, and ranges of every
  instant there is (the reconciler reads them in the hour they name);
- DEAD occurrences of its own schedules naming another tenant's occurrence id and tenant
  (what would reach that tenant's ledger, if the ledger trusted an item's word);
- and, denied by IAM, the same under another tenant's keys, its own quota record and the
  ledger table (no tenant is granted it).

Its draws come from an RNG of its own, and its calls go to DynamoDB without faults: what it
does leaves the other tenants' draws as they were. The oracle (tests/sim/oracle.py) checks
that nothing of another tenant's work changed: every invariant holds for them, no relay
batch failed on its items, and its bad items were met and counted (``BadItems``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from punctual.dal.common import to_dynamo
from punctual.dal.runs import concurrency_sk, run_partition, run_slot_sk, wait_slot_sk
from punctual.dal.tables import BACKFILL_PREFIX, OCCURRENCE_PREFIX, backfill_sk, occurrence_key
from punctual.dal.tenants import tenant_partition
from punctual.domain.ids import occurrence_id, schedule_key_prefix
from tests.hostile import HostileWorker

if TYPE_CHECKING:
    from tests.sim.world import Simulation

HOUR = 3600


class Hostile:
    def __init__(self, sim: Simulation, tenant: str) -> None:
        self.sim = sim
        self.tenant = tenant
        self.rng = random.Random(sim.config.seed * 7919 + 1)
        self.worker = HostileWorker(sim.real, tenant, sim.settings)
        self.schedule_ids: list[str] = []
        self.kinds = (
            self._only_a_state,
            self._tamper,
            self._forge,
            self._slots,
            self._backfill_records,
            self._trespass,
            self._ledger,
        )

    def act(self) -> None:
        if self.rng.random() >= self.sim.config.hostile_per_hour / 60:
            return
        kind = self.rng.choice(self.kinds)
        self.sim.run_record.counts[f"hostile{kind.__name__}"] += 1
        try:
            kind()
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code != "AccessDeniedException" and "ConditionalCheck" not in code:
                raise
            self.sim.run_record.counts[f"hostile_refused_{code}"] += 1

    @property
    def _table(self) -> str:
        return self.sim.settings.occurrences_table

    def _instant(self) -> int:
        """Near now, where the walk, the re-plans and the reconciler's windows read."""
        return int(self.sim.clock.now) + self.rng.randint(-2 * HOUR, 2 * HOUR)

    def _own(self) -> str:
        return self.rng.choice(self.schedule_ids) if self.schedule_ids else self._unknown()

    def _unknown(self) -> str:
        return schedule_key_prefix(self.tenant) + f"nosuch{self.rng.getrandbits(32)}"

    def _only_a_state(self) -> None:
        key = occurrence_key(occurrence_id(self._own(), 1, self._instant()))
        self.worker.write(self._table, to_dynamo(key), {"state": {"S": "SUCCEEDED"}})

    def _tamper(self) -> None:
        """One of its real occurrences, changed as its worker credentials allow."""
        if not self.schedule_ids:
            return
        sid = self.rng.choice(self.schedule_ids)
        found = self.sim.real.query(
            TableName=self._table,
            KeyConditionExpression="schedule_id = :s AND begins_with(sk, :p)",
            ExpressionAttributeValues={":s": {"S": sid}, ":p": {"S": OCCURRENCE_PREFIX}},
            Limit=50,
        )["Items"]
        if not found:
            return
        item = self.rng.choice(found)
        now = int(self.sim.clock.now)
        change: dict[str, Any] = self.rng.choice(
            [
                {"state": {"S": self.rng.choice(["SUCCEEDED", "RUNNING", "DEAD", "BOGUS"])}},
                {"lease_token": {"S": "mine"}, "lease_expires_at": {"N": str(now + 10 * HOUR)}},
                {"tenant_id": {"S": self.rng.choice(self.sim.tenants)}},
                {"available_at": {"N": str(now + 30 * 86400)}},
                {"scheduled_for": {"S": "soon"}},
                {"attempt_count": {"S": "many"}},
                {"attempts": {"S": "none"}},
                {"local": {"S": "not a wall time"}},  # what a re-plan keys on
                {"payload": {"M": {"x": {"S": "x" * 300_000}}}},
            ]
        )
        key = {"schedule_id": item["schedule_id"], "sk": item["sk"]}
        self.worker.write(self._table, key, change)

    def _forge(self) -> None:
        """A whole occurrence under a key of its own, of a schedule that is not there (or of
        one that is, at an instant it does not fire), claiming another tenant."""
        sid = self._own() if self.rng.random() < 0.5 else self._unknown()
        instant = self._instant()
        forged = occurrence_id(sid, 1, instant)
        now = int(self.sim.clock.now)
        self.worker.write(
            self._table,
            to_dynamo(occurrence_key(forged)),
            {
                "occurrence_id": {"S": forged},
                "tenant_id": {"S": self.rng.choice([self.tenant, *self.sim.tenants])},
                "schedule_version": {"N": "1"},
                "scheduled_for": {"N": str(instant)},
                "available_at": {"N": str(max(now, instant))},
                "target": {"S": "default"},
                "state": {"S": "SCHEDULED"},
                "payload": {"M": {}},
            },
        )

    def _slots(self) -> None:
        """Its run partition: slots of its own schedules (or none) with garbage in them."""
        sk = self.rng.choice(
            [
                run_slot_sk(self._own()),
                wait_slot_sk(self._own()),
                concurrency_sk(self.rng.randint(0, 3)),
                "GARBAGE",
            ]
        )
        value = self.rng.choice([{"S": "x"}, {"N": "-1"}, {"N": str(10**12)}])
        self.worker.write(
            self.sim.settings.tenants_table,
            to_dynamo({"pk": run_partition(self.tenant), "sk": sk}),
            {"expires_at": value, "occurrence_id": {"S": "occ_nonsense"}},
        )

    def _backfill_records(self) -> None:
        """A backfill record (``BKF#<made_at>#<from>#<to>``) of its own: an unreadable key,
        a range that ends before it starts, or one of every instant there is."""
        made = self._instant()
        sk = self.rng.choice(
            [
                f"{BACKFILL_PREFIX}{made:012d}#garbage",
                backfill_sk(made, made, made - HOUR),
                backfill_sk(made, 0, 10**12 - 1),
            ]
        )
        self.worker.write(
            self._table, to_dynamo({"schedule_id": self._own(), "sk": sk}), {"x": {"S": "y"}}
        )

    def _ledger(self) -> None:
        """Into another tenant's ledger: a page written straight into the ledger table (IAM
        denies it), or a DEAD occurrence under its own schedule's key that names the victim's
        occurrence and tenant (the reconciler files it under the schedule's tenant)."""
        victim = self.rng.choice(self.sim.tenants)
        instant = self._instant()
        if self.rng.random() < 0.3:
            key = {"pk": {"S": f"{victim}#20261207"}, "sk": {"S": f"{instant:012d}#00000"}}
            self.worker.write(self.sim.settings.ledger_table, key, {"counts": {"M": {}}})
            return
        theirs = occurrence_id(schedule_key_prefix(victim) + "x", 1, instant)
        self.worker.write(
            self._table,
            to_dynamo(occurrence_key(occurrence_id(self._own(), 1, instant))),
            {
                "occurrence_id": {"S": theirs},
                "tenant_id": {"S": victim},
                "schedule_version": {"N": "1"},
                "scheduled_for": {"N": str(instant)},
                "available_at": {"N": str(instant)},
                "target": {"S": "default"},
                "state": {"S": "DEAD"},
                "attempt_count": {"N": "3"},
            },
        )

    def _trespass(self) -> None:
        """Another tenant's occurrences, or its own quota record: IAM denies both."""
        if self.rng.random() < 0.5:
            victim = self.rng.choice(self.sim.tenants)
            key = occurrence_key(occurrence_id(schedule_key_prefix(victim) + "x", 1, 0))
            self.worker.write(self._table, to_dynamo(key), {"state": {"S": "SUCCEEDED"}})
        else:
            key = {"pk": tenant_partition(self.tenant), "sk": "TENANT"}
            self.worker.write(
                self.sim.settings.tenants_table, to_dynamo(key), {"schedule_count": {"N": "0"}}
            )

    @staticmethod
    def touched(item: dict[str, Any], tenant: str) -> bool:
        """An item under the hostile tenant's keys (its schedules' partitions)."""
        return str(item.get("schedule_id", "")).startswith(schedule_key_prefix(tenant))
