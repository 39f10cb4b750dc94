"""cdk-nag's AWS Solutions checks run on every synthesis; a finding is either fixed or
acknowledged, next to the construct it concerns, with the reason it is acceptable."""

from __future__ import annotations

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

PACK = "AwsSolutions"


def add_security_checks(app: cdk.App) -> None:
    """An unacknowledged finding stops `cdk synth` and `cdk deploy`."""
    # The acknowledgments are also copied into each resource's template Metadata (cdk_nag
    # rules_to_suppress), so that a reviewer of the template sees every reason.
    cdk.Validations.of(app).add_plugins(
        AwsSolutionsChecks(app, write_suppressions_to_cloud_formation=True)
    )


def acknowledge(scope: IConstruct, finding: str, reason: str) -> None:
    """``finding`` as cdk-nag names it, e.g. 'IAM5[Resource::*]' (the pack is implied);
    it covers ``scope`` and everything under it."""
    cdk.Validations.of(scope).acknowledge(
        cdk.Acknowledgment(id=f"{PACK}::{PACK}-{finding}", reason=reason)
    )
