#!/usr/bin/env python3
"""CDK entry point: `cdk synth` / `cdk deploy --all` (knobs: the "punctual" context in
cdk.json, or -c punctual='{...}'). Two stacks: PunctualData (tables) and Punctual."""

import aws_cdk as cdk

from infra.stack import build

app = cdk.App()
build(app)
app.synth()
