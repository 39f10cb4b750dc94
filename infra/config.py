"""Deployment knobs from CDK context (cdk.json or -c key=value), validated."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from punctual.settings import Settings


class DeployConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shard_count: int = Field(default=64, ge=1, le=4096)
    lookahead_seconds: int = Field(default=180, ge=0, le=600)
    shard_group_size: int = Field(default=8, ge=1, le=256)
    map_concurrency: int = Field(default=40, ge=1, le=40)
    relay_parallelization_factor: int = Field(default=10, ge=1, le=10)
    operator_principals: list[str] = Field(default_factory=list)
    retention_days: int = Field(default=30, ge=1, le=3650)
    retain_data: bool = True

    @classmethod
    def from_context(cls, context: dict[str, Any]) -> DeployConfig:
        try:
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
        return {
            "PUNCTUAL_SHARD_COUNT": str(self.shard_count),
            "PUNCTUAL_LOOKAHEAD_SECONDS": str(self.lookahead_seconds),
            "PUNCTUAL_RETENTION_DAYS": str(self.retention_days),
            "PUNCTUAL_OPERATOR_PRINCIPALS": ",".join(self.operator_principals),
        }
