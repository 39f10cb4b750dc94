"""The Punctual stack: composes the capability constructs, nothing else."""

from __future__ import annotations

from typing import Any

from aws_cdk import Stack
from constructs import Construct

from infra.layer import CoreLayer


class PunctualStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.core = CoreLayer(self, "Core")
