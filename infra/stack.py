"""The Punctual stack: composes the capability constructs, nothing else."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from infra.config import DeployConfig
from infra.data import Data
from infra.layer import CoreLayer
from infra.materializer import Materialization
from infra.relay import Relaying


class PunctualStack(Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: DeployConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        core = CoreLayer(self, "Core")
        self.data = Data(self, "Data", settings=config.settings(), retain=config.retain_data)
        environment = {**self.data.environment(), **config.environment()}
        self.materialization = Materialization(
            self,
            "Materialization",
            data=self.data,
            layer=core.layer,
            environment=environment,
            group_size=config.shard_group_size,
            max_concurrency=config.map_concurrency,
        )
        self.relaying = Relaying(
            self,
            "Relay",
            data=self.data,
            layer=core.layer,
            environment=environment,
            parallelization_factor=config.relay_parallelization_factor,
        )
