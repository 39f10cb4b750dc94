"""Deployment knobs from CDK context (cdk.json or -c key=value), validated: each knob on its
own, then together against the fixed limits below, which the constructs use too."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from punctual.control.plane import PROMPT_MARGIN_SECONDS
from punctual.domain.ids import shard_groups
from punctual.domain.principals import PRINCIPAL_ARN_PATTERN
from punctual.integrations.streams import ON_TIME_WINDOW_SECONDS
from punctual.settings import Settings


@dataclass(frozen=True)
class Retry:
    """How a shard group's failed invocation is retried (a Step Functions retrier on
    States.ALL, the only one: its worst case must be known)."""

    interval_seconds: int
    backoff_rate: float
    max_attempts: int

    def worst_case_seconds(self, timeout_seconds: int) -> float:
        """Every attempt running into the function's timeout, with the waits between."""
        waits = sum(self.interval_seconds * self.backoff_rate**n for n in range(self.max_attempts))
        return (self.max_attempts + 1) * timeout_seconds + waits


# The materializer: a tick is one minute; a group that fails fast is retried within it.
MATERIALIZER_TIMEOUT_SECONDS = 55
MATERIALIZER_RETRY = Retry(interval_seconds=2, backoff_rate=2, max_attempts=2)
# The Express ticker outlives its groups' whole retry chain (plus the Map's own steps), so
# that a retried group ends as retried or caught, never cut off as a timed-out tick.
TICKER_TIMEOUT_SECONDS = (
    math.ceil(MATERIALIZER_RETRY.worst_case_seconds(MATERIALIZER_TIMEOUT_SECONDS)) + 10
)
# The reconciler: Lambda's whole 15 minutes per group, one retry, and a run ends within its
# hour so that runs never pile up.
RECONCILER_TIMEOUT_SECONDS = 900
RECONCILER_RETRY = Retry(interval_seconds=30, backoff_rate=2, max_attempts=1)
RECONCILE_RUN_TIMEOUT_SECONDS = 55 * 60
# Step Functions runs at most this many iterations of an inline Map at once.
MAX_CONCURRENCY = 40
# What a new on-demand table or index serves at once (DynamoDB's warm throughput docs).
WARM_WRITES_DEFAULT = 4000
# EventBridge's limit on a target's input (InputTemplate) in characters.
EVENTBRIDGE_INPUT_LIMIT = 8192
# Lambda refuses a reservation that leaves fewer than this unreserved in the account: the
# reconciler's groups (at most MAX_CONCURRENCY) and the re-drives run there.
UNRESERVED_MINIMUM = 100
# Re-drives of discarded stream batches at once (its SQS mapping's maximum concurrency,
# the least SQS allows).
REDRIVE_CONCURRENCY = 2


def rule_input_text(time_key: str, shard_count: int, group_size: int) -> str:
    """The InputTemplate the CDK renders for a rule handing a state machine the event's time
    and every shard group (``<time>`` is EventBridge's placeholder)."""
    groups = json.dumps(shard_groups(shard_count, group_size), separators=(",", ":"))
    return f'{{"{time_key}":<time>,"groups":{groups}}}'


# The principal ARNs the operator API accepts (the same rule as its principal binding).
PrincipalArn = Annotated[str, Field(pattern=PRINCIPAL_ARN_PATTERN)]
AccountId = Annotated[str, Field(pattern=r"^\d{12}$")]
Email = Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]


class AlarmThresholds(BaseModel):
    """Each alarm fires when its measure is above the threshold (see docs/deploy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The delivery SLO: p99 schedule lag of strict occurrences, per minute.
    strict_lag_p99_seconds: float = Field(default=5.0, gt=0, le=900)
    # Oldest unread outbox record: strict occurrences are planned `lookahead_seconds`
    # ahead, so a relay this far behind is eating into that margin.
    stream_iterator_age_seconds: int = Field(default=60, ge=1, le=86_400)
    # The catch-up lane's oldest unread record: a catch-up waits by design, but its records
    # leave the stream after 6 hours (the mapping's maximum record age).
    catchup_iterator_age_seconds: int = Field(default=3600, ge=1, le=21_600)
    # Entries SQS refused in 5 minutes (the stream retries them; a steady count is not normal).
    relay_send_failures: int = Field(default=0, ge=0)
    # Failed or timed-out ticks plus materializer Lambda errors in 5 minutes.
    materializer_failures: int = Field(default=0, ge=0)
    # Occurrences the reconciler found missing in one hourly run.
    reconcile_missing: int = Field(default=0, ge=0)
    # Throttled reads and writes of one table (indexes included) in 5 minutes.
    dynamodb_throttles: int = Field(default=0, ge=0)
    # API Gateway 5xx answers in 5 minutes.
    api_5xx: int = Field(default=5, ge=0)
    # How far, for certain, a component's clock is from DynamoDB's, for 3 minutes: the
    # relay's moves every message's receivable instant by as much (docs/operations.md,
    # *Clock skew*).
    clock_skew_seconds: float = Field(default=1.0, gt=0, le=60)


CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"


def committed_context() -> dict[str, Any]:
    """cdk.json's "punctual" object (what a deploy uses where the command line says nothing)."""
    context = json.loads(CDK_JSON.read_text(encoding="utf-8"))["context"]
    found: dict[str, Any] = context.get("punctual", {})
    return found


def _overlaid(base: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` over ``base``: a knob given replaces the base's, an object given is laid
    over the base's object the same way."""
    merged = dict(base)
    for key, value in given.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, dict):
            value = _overlaid(below, value)
        merged[key] = value
    return merged


class DeployConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shard_count: int = Field(default=64, ge=1, le=4096)
    lookahead_seconds: int = Field(default=180, ge=0, le=600)
    shard_group_size: int = Field(default=8, ge=1, le=256)
    map_concurrency: int = Field(default=40, ge=1, le=MAX_CONCURRENCY)
    relay_parallelization_factor: int = Field(default=10, ge=1, le=10)
    # The on-time relay mapping waits up to this long to fill a batch: ~17 records an
    # invocation instead of ~2 at the seed's load (docs/capacity.md). What the API makes due
    # sooner it also sends at once (docs/operations.md, *Batching window*).
    relay_batching_window_seconds: int = Field(default=ON_TIME_WINDOW_SECONDS, ge=0, le=60)
    # The catch-up lane's batches per stream shard at once: its Lambda concurrency is at
    # most this times the shards, whatever the catch-up's size (docs/operations.md).
    catchup_parallelization_factor: int = Field(default=2, ge=1, le=10)
    # Groups reconciled at once: the hourly run's groups must fit its 55 minutes.
    reconcile_concurrency: int = Field(default=32, ge=1, le=MAX_CONCURRENCY)
    # Shards per reconciler invocation: each reads every schedule of its shards (about
    # 312k per shard at 20 M schedules and 64 shards), so 1-2 fit in 15 minutes.
    reconcile_group_size: int = Field(default=2, ge=1, le=256)
    # Minute of the hour the reconciler starts: away from the top-of-hour peak.
    reconcile_minute: int = Field(default=20, ge=0, le=59)
    # The reconciler materializes what it finds missing; off: it only reports.
    reconcile_repair: bool = True
    # The stack creates an operator role (output OperatorRoleArn) that principals of the
    # deploying account may assume; without it, operator_principals must name someone.
    operator_role: bool = True
    operator_principals: list[PrincipalArn] = Field(default_factory=list)
    # Other AWS accounts whose principals may call the API (an API resource policy);
    # principals of the deploying account need only an identity policy.
    caller_accounts: list[AccountId] = Field(default_factory=list)
    retention_days: int = Field(default=30, ge=1, le=3650)
    # Removal policy of the tables: keep them when their stack is deleted.
    retain_data: bool = True
    # DynamoDB deletion protection: a table cannot be deleted until this is turned off.
    deletion_protection: bool = True
    # Warm throughput (write units/s each) of the tables and the index the top-of-hour peak
    # writes: the schedules and occurrences tables and the due index. A new on-demand table
    # serves about 4,000 at once and throttles past twice its previous peak; 0: AWS's own.
    warm_write_units: int = Field(default=0, ge=0, le=1_000_000)
    # The account's Lambda concurrency quota in the region (docs/deploy.md, prerequisites:
    # `aws lambda get-account-settings`; new accounts may have far less than 1,000). The
    # reservations below must fit in it, with what the reconciler needs left unreserved.
    account_concurrency: int = Field(default=1000, ge=1, le=1_000_000)
    # Reserved for the API: about this many requests at once whatever else runs (at the
    # 1,000 requests/s limit, invocations averaging up to 100 ms).
    api_concurrency: int = Field(default=100, ge=1, le=10_000)
    # The relay lanes' caps (reserved concurrency, which is also a limit): a backlog after
    # an outage, or a replayed stream, takes no more. A throttled batch waits in the stream
    # and is retried until it is 6 hours old, its retries not counted (docs/capacity.md).
    relay_concurrency: int = Field(default=400, ge=1, le=10_000)
    catchup_concurrency: int = Field(default=50, ge=1, le=10_000)
    # Stage-wide API throttling (requests/s and burst); every tenant shares it.
    api_rate_limit: int = Field(default=1000, ge=1, le=10_000)
    api_burst_limit: int = Field(default=2000, ge=1, le=5000)
    alarm_emails: list[Email] = Field(default_factory=list)
    alarms: AlarmThresholds = AlarmThresholds()

    @model_validator(mode="after")
    def _fits_the_limits(self) -> Self:
        """What each knob allows alone but cannot work together, with the arithmetic."""
        problems = [
            *self._operators(),
            *self._ticks(),
            *self._hourly_run(),
            *self._rule_inputs(),
            *self._window(),
            *self._warm(),
            *self._concurrency(),
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def materializer_concurrency(self) -> int:
        """Reserved for the materializer: a tick runs its groups at once (at most the Map's
        concurrency), and a tick whose groups are retried runs into the next ticks' (up to
        its timeout), so this many never wait for a slot the relay took."""
        groups = min(math.ceil(self.shard_count / self.shard_group_size), self.map_concurrency)
        return math.ceil(TICKER_TIMEOUT_SECONDS / 60) * groups

    def reserved_concurrency(self) -> dict[str, int]:
        """Each reservation the stack makes (infra/stack.py passes these on)."""
        return {
            "materializer": self.materializer_concurrency,
            "api": self.api_concurrency,
            "relay": self.relay_concurrency,
            "catch-up relay": self.catchup_concurrency,
        }

    def _concurrency(self) -> list[str]:
        reserved = self.reserved_concurrency()
        left = self.account_concurrency - sum(reserved.values())
        if left >= UNRESERVED_MINIMUM:
            return []
        parts = " + ".join(f"{n} {k}" for k, n in reserved.items())
        return [
            f"punctual.account_concurrency: the reservations ({parts}) leave "
            f"{self.account_concurrency} - {sum(reserved.values())} = {left} unreserved, "
            f"fewer than Lambda's minimum of {UNRESERVED_MINIMUM} (where the reconciler's "
            f"groups and the re-drive run); account_concurrency >= "
            f"{sum(reserved.values()) + UNRESERVED_MINIMUM} (ask AWS for a higher quota: "
            "docs/deploy.md), or a lower relay_concurrency"
        ]

    def _warm(self) -> list[str]:
        if 0 < self.warm_write_units < WARM_WRITES_DEFAULT:
            return [
                f"punctual.warm_write_units: {self.warm_write_units} is below the "
                f"{WARM_WRITES_DEFAULT:,} write units/s a new on-demand table has already "
                "(0: leave it to AWS)"
            ]
        return []

    def _window(self) -> list[str]:
        # A tick plans up to lookahead ahead; the fire just past that is planned by the next
        # tick, a minute later, and committed up to a group's timeout into it. So the
        # materializer's fires reach the outbox at least lookahead - 60 - 55 s before their
        # time (a healthy tick); the on-time mapping's window, and the margin the API's
        # prompt send assumes, must fit in that, or they would be relayed after their time.
        slack = self.lookahead_seconds - 60 - MATERIALIZER_TIMEOUT_SECONDS
        needed = self.relay_batching_window_seconds + PROMPT_MARGIN_SECONDS
        if not self.relay_batching_window_seconds or slack >= needed:
            return []
        return [
            f"punctual.relay_batching_window_seconds: the materializer's fires reach the "
            f"relay as little as lookahead_seconds {self.lookahead_seconds} - 60 - "
            f"{MATERIALIZER_TIMEOUT_SECONDS} (a tick's groups) = {slack} s before their "
            f"time, less than the window {self.relay_batching_window_seconds} s + "
            f"{PROMPT_MARGIN_SECONDS} s margin; lookahead_seconds >= "
            f"{needed + 60 + MATERIALIZER_TIMEOUT_SECONDS} or relay_batching_window_seconds "
            f"<= {max(0, slack - PROMPT_MARGIN_SECONDS)}"
        ]

    def _operators(self) -> list[str]:
        if self.operator_role or self.operator_principals:
            return []
        return [
            "punctual.operator_principals: empty while operator_role is false: nobody could call "
            "/v1/admin after the deploy, so no tenant could ever be created; name an IAM role "
            "or user ARN, or keep operator_role (docs/deploy.md, first deploy)"
        ]

    def _ticks(self) -> list[str]:
        groups = math.ceil(self.shard_count / self.shard_group_size)
        if groups <= self.map_concurrency:
            return []
        return [
            f"punctual.map_concurrency: a tick has {groups} shard groups "
            f"({self.shard_count} shards / shard_group_size {self.shard_group_size}) but runs "
            f"{self.map_concurrency} at once: the rest would start only as the first end, up to "
            f"{MATERIALIZER_TIMEOUT_SECONDS} s later, past the one-minute tick; "
            f"map_concurrency >= {groups} (at most {MAX_CONCURRENCY}) or shard_group_size >= "
            f"{math.ceil(self.shard_count / self.map_concurrency)}"
        ]

    def _hourly_run(self) -> list[str]:
        groups = math.ceil(self.shard_count / self.reconcile_group_size)
        waves = math.ceil(groups / self.reconcile_concurrency)
        retry = RECONCILER_RETRY.worst_case_seconds(RECONCILER_TIMEOUT_SECONDS)
        retry -= RECONCILER_TIMEOUT_SECONDS
        longest = waves * RECONCILER_TIMEOUT_SECONDS + retry
        if longest <= RECONCILE_RUN_TIMEOUT_SECONDS:
            return []
        fitting = int((RECONCILE_RUN_TIMEOUT_SECONDS - retry) // RECONCILER_TIMEOUT_SECONDS)
        return [
            f"punctual.reconcile_concurrency: the hourly run has {groups} shard groups "
            f"({self.shard_count} shards / reconcile_group_size {self.reconcile_group_size}), "
            f"{self.reconcile_concurrency} at a time: {waves} waves x "
            f"{RECONCILER_TIMEOUT_SECONDS} s + {retry:.0f} s for one retried group = "
            f"{longest:.0f} s, past the run's {RECONCILE_RUN_TIMEOUT_SECONDS} s timeout; at "
            f"most {fitting} waves fit: reconcile_concurrency >= {math.ceil(groups / fitting)} "
            f"(at most {MAX_CONCURRENCY}) or reconcile_group_size >= "
            f"{math.ceil(self.shard_count / (self.reconcile_concurrency * fitting))}"
        ]

    def _rule_inputs(self) -> list[str]:
        problems = []
        for knob, key, rule, size in (
            ("shard_group_size", "tick", "ticker", self.shard_group_size),
            ("reconcile_group_size", "time", "hourly run", self.reconcile_group_size),
        ):
            length = len(rule_input_text(key, self.shard_count, size))
            if length <= EVENTBRIDGE_INPUT_LIMIT:
                continue
            most = max(
                n
                for n in range(1, self.shard_count)
                if len(rule_input_text(key, n, size)) <= EVENTBRIDGE_INPUT_LIMIT
            )
            problems.append(
                f"punctual.shard_count: the rule starting the {rule} lists every shard group "
                f"in its input: {length:,} characters for "
                f"{self.shard_count} shards in groups of {size} ({knob}), over EventBridge's "
                f"{EVENTBRIDGE_INPUT_LIMIT:,}; at most {most} shards fit in groups of {size}"
            )
        return problems

    @classmethod
    def from_context(
        cls, context: dict[str, Any] | str, base: dict[str, Any] | None = None
    ) -> DeployConfig:
        """``context``: the "punctual" object, or its JSON text (from ``-c punctual=...``),
        laid knob by knob (and alarm by alarm) over ``base``, cdk.json's committed object:
        the CDK replaces a context key given on the command line whole, so an override of
        one knob would otherwise deploy the code's defaults for every other (64 shards, not
        cdk.json's 128: the schedules homed in the others never materialized)."""
        given: Any = context
        if isinstance(context, str):
            try:
                given = json.loads(context)
            except ValueError:
                raise ValueError("invalid CDK context: punctual is not JSON") from None
        if not isinstance(given, dict):
            raise ValueError("invalid CDK context: punctual is not a JSON object")
        try:
            return cls.model_validate(_overlaid(base or {}, given))
        except ValidationError as error:
            problems = "; ".join(
                f"punctual.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                if e["loc"]
                # A check across knobs names its knobs in its own message.
                else e["msg"].removeprefix("Value error, ")
                for e in error.errors()
            )
            raise ValueError(f"invalid CDK context: {problems}") from None

    def settings(self) -> Settings:
        return Settings(
            shard_count=self.shard_count,
            lookahead_seconds=self.lookahead_seconds,
            retention_days=self.retention_days,
            relay_window_seconds=self.relay_batching_window_seconds,
            operator_principals=frozenset(self.operator_principals),
        )

    def environment(self) -> dict[str, str]:
        settings = self.settings()
        return {
            "PUNCTUAL_SHARD_COUNT": str(settings.shard_count),
            "PUNCTUAL_LOOKAHEAD_SECONDS": str(settings.lookahead_seconds),
            "PUNCTUAL_RETENTION_DAYS": str(settings.retention_days),
            "PUNCTUAL_RELAY_WINDOW_SECONDS": str(settings.relay_window_seconds),
            "PUNCTUAL_OPERATOR_PRINCIPALS": ",".join(sorted(settings.operator_principals)),
            # The relay's and the API's SQS permissions are scoped to this prefix.
            "PUNCTUAL_QUEUE_PREFIX": settings.queue_prefix,
            "PUNCTUAL_RECONCILE_REPAIR": str(self.reconcile_repair).lower(),
        }
