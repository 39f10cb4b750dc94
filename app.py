#!/usr/bin/env python3
"""CDK entry point: `cdk synth` / `cdk deploy` (knobs: the "punctual" context in cdk.json)."""

import aws_cdk as cdk

from infra.config import DeployConfig
from infra.stack import PunctualStack

app = cdk.App()
config = DeployConfig.from_context(app.node.try_get_context("punctual") or {})
PunctualStack(app, "Punctual", config=config)
app.synth()
