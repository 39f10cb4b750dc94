"""Deployment knobs from CDK context (cdk.json or -c key=value), validated."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from punctual.settings import Settings

# The principal ARNs the operator API accepts (the same rule as its principal binding).
PrincipalArn = Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:(iam|sts)::\d{12}:.+$")]
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


class DeployConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shard_count: int = Field(default=64, ge=1, le=4096)
    lookahead_seconds: int = Field(default=180, ge=0, le=600)
    shard_group_size: int = Field(default=8, ge=1, le=256)
    map_concurrency: int = Field(default=40, ge=1, le=40)
    relay_parallelization_factor: int = Field(default=10, ge=1, le=10)
    # Groups reconciled at once; each scans its shards' schedules, so fewer than the
    # materializer's to leave read capacity to the hot path.
    reconcile_concurrency: int = Field(default=8, ge=1, le=40)
    # Shards per reconciler invocation: each reads every schedule of its shards (about
    # 312k per shard at 20 M schedules and 64 shards), so 1-2 fit in 15 minutes.
    reconcile_group_size: int = Field(default=2, ge=1, le=256)
    # Minute of the hour the reconciler starts: away from the top-of-hour peak.
    reconcile_minute: int = Field(default=20, ge=0, le=59)
    # The reconciler materializes what it finds missing; off: it only reports.
    reconcile_repair: bool = True
    operator_principals: list[PrincipalArn] = Field(default_factory=list)
    # Other AWS accounts whose principals may call the API (an API resource policy);
    # principals of the deploying account need only an identity policy.
    caller_accounts: list[AccountId] = Field(default_factory=list)
    retention_days: int = Field(default=30, ge=1, le=3650)
    # Removal policy of the tables: keep them when their stack is deleted.
    retain_data: bool = True
    # DynamoDB deletion protection: a table cannot be deleted until this is turned off.
    deletion_protection: bool = True
    # Stage-wide API throttling (requests/s and burst); every tenant shares it.
    api_rate_limit: int = Field(default=1000, ge=1, le=10_000)
    api_burst_limit: int = Field(default=2000, ge=1, le=5000)
    alarm_emails: list[Email] = Field(default_factory=list)
    alarms: AlarmThresholds = AlarmThresholds()

    @classmethod
    def from_context(cls, context: dict[str, Any] | str) -> DeployConfig:
        """``context``: the "punctual" object, or its JSON text (from ``-c punctual=...``)."""
        try:
            if isinstance(context, str):
                return cls.model_validate_json(context)
            return cls.model_validate(context)
        except ValidationError as error:
            problems = "; ".join(
                f"punctual.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
            raise ValueError(f"invalid CDK context: {problems}") from None

    def settings(self) -> Settings:
        return Settings(
            shard_count=self.shard_count,
            lookahead_seconds=self.lookahead_seconds,
            retention_days=self.retention_days,
            operator_principals=frozenset(self.operator_principals),
        )

    def environment(self) -> dict[str, str]:
        settings = self.settings()
        return {
            "PUNCTUAL_SHARD_COUNT": str(settings.shard_count),
            "PUNCTUAL_LOOKAHEAD_SECONDS": str(settings.lookahead_seconds),
            "PUNCTUAL_RETENTION_DAYS": str(settings.retention_days),
            "PUNCTUAL_OPERATOR_PRINCIPALS": ",".join(sorted(settings.operator_principals)),
            # The relay's and the API's SQS permissions are scoped to this prefix.
            "PUNCTUAL_QUEUE_PREFIX": settings.queue_prefix,
            "PUNCTUAL_RECONCILE_REPAIR": str(self.reconcile_repair).lower(),
        }
