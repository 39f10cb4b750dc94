"""How a process builds its AWS clients: the functions (``punctual.services``), a tenant's
worker (``punctual_client.worker.wiring``) and the local stack alike."""

from __future__ import annotations

from typing import Any


def aws_client(service: str, *, checked: bool = False, **options: Any) -> Any:
    """A boto3 client as the functions use it: botocore's own check of every request's
    parameters is off (a fifth of the materializer's CPU per step under a profile, 2026-12-03;
    DynamoDB and SQS validate each request themselves, and the tests' clients keep it:
    ``checked``), and DynamoDB's items are parsed as sent (``dal.responses``). ``options``:
    boto3's (region_name, endpoint_url...)."""
    import boto3  # only here: the domain never builds clients at import time
    import botocore.session
    from botocore.config import Config

    from punctual.dal.responses import ValuesAsSent

    session = botocore.session.get_session()
    session.register_component("response_parser_factory", ValuesAsSent())
    return boto3.Session(botocore_session=session).client(
        service, config=Config(parameter_validation=checked), **options
    )
