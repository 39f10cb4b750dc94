#!/usr/bin/env python3
"""CDK entry point: `cdk synth` / `cdk deploy` (see cdk.json)."""

import aws_cdk as cdk

from infra.stack import PunctualStack

app = cdk.App()
PunctualStack(app, "Punctual")
app.synth()
