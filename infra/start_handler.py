"""The relay's start instant (a CloudFormation custom resource of the service stack; this
file is its whole code, inlined). Created with the stack, and made again whenever the
stream mappings are (its properties name them), it answers the instant as `StartedAt`,
which both relay functions read (PUNCTUAL_RELAY_STARTED_AT). A new mapping reads the
retained stream from its oldest record, up to a day back; the relay does not send again
what was inserted and due before this instant (punctual.pipeline.relay.Relay.relay).

Standard library only: it runs without Punctual's layer, and calls nothing but
CloudFormation's response URL.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any


def answer(event: dict[str, Any], now: float) -> dict[str, Any]:
    """CloudFormation's answer to ``event``: a new instant on Create and Update (the
    mappings are new), none needed on Delete."""
    body: dict[str, Any] = {
        "Status": "SUCCESS",
        "PhysicalResourceId": "punctual-relay-start",
        "StackId": event["StackId"],
        "RequestId": event["RequestId"],
        "LogicalResourceId": event["LogicalResourceId"],
    }
    if event["RequestType"] != "Delete":
        body["Data"] = {"StartedAt": str(int(now))}
    return body


def on_event(event: dict[str, Any], context: Any) -> None:
    request = urllib.request.Request(
        event["ResponseURL"],
        data=json.dumps(answer(event, time.time())).encode(),
        method="PUT",
        headers={"Content-Type": ""},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass
