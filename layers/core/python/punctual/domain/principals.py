"""IAM principals as Punctual binds them: one spelling per caller, whatever ARN it came in."""

from __future__ import annotations

import re

# The shape a principal ARN must have to be accepted as input at all (the API's binding,
# the deployment's operator list); normalize_principal then says which kinds are bound.
# (Exactly what normalize_principal binds: a schema-valid ARN is then never refused.)
PRINCIPAL_ARN_PATTERN = (
    r"^arn:aws[a-z-]*:(sts::\d{12}:assumed-role/[^/]+/[^/]+"
    r"|iam::\d{12}:((role|user)/([!-~]*/)?[^/]+|root))$"
)
_ASSUMED_ROLE = re.compile(r"^arn:(aws[a-z-]*):sts::(\d{12}):assumed-role/([^/]+)/[^/]+$")
_IAM = re.compile(r"^arn:(aws[a-z-]*):iam::(\d{12}):(role|user)/(?:[!-~]*/)?([^/]+)$")
_ROOT = re.compile(r"^arn:(aws[a-z-]*):iam::(\d{12}):root$")


class PrincipalError(ValueError):
    """Not an IAM principal ARN Punctual can bind (an IAM role or user, a role session)."""


def normalize_principal(arn: str) -> str:
    """The one spelling under which a caller is bound: ``arn:P:iam::ACCOUNT:role/NAME`` or
    ``...:user/NAME``, without the path.

    A role session (``arn:P:sts::ACCOUNT:assumed-role/NAME/SESSION``, what SigV4 callers
    present) stands for its role, and its ARN does not carry the role's path; a role or user
    name is unique within its account whatever its path (IAM Identity Center roles live
    under ``/aws-reserved/sso.amazonaws.com/``), so dropping the path on both sides makes a
    binding given either way match the callers it means."""
    if match := _ASSUMED_ROLE.match(arn):
        partition, account, role = match.groups()
        return f"arn:{partition}:iam::{account}:role/{role}"
    if match := _IAM.match(arn):
        partition, account, kind, name = match.groups()
        return f"arn:{partition}:iam::{account}:{kind}/{name}"
    if _ROOT.match(arn):
        return arn
    raise PrincipalError(
        f"{arn!r} is not an IAM role, user or role-session ARN "
        "(arn:aws:iam::123456789012:role/NAME, .../user/NAME, "
        "arn:aws:sts::123456789012:assumed-role/NAME/SESSION)"
    )


def principal_patterns(principal: str) -> tuple[str, list[str]]:
    """For a resource policy: the principal's account root and the ``aws:PrincipalArn``
    patterns that match it with any path (a policy's Principal must be an exact ARN, and
    the binding does not know the path)."""
    normal = normalize_principal(principal)
    if _ROOT.match(normal):
        return normal, [normal]
    prefix, name = normal.rsplit("/", 1)
    account = normal.split(":")[4]
    partition = normal.split(":")[1]
    return f"arn:{partition}:iam::{account}:root", [normal, f"{prefix}/*/{name}"]
