"""Tenant administration: who a caller is (an operator, a tenant's principal), a tenant's
targets (its SQS queues, granted to its principals), its principals and the tenant itself.
The control plane (punctual.control.plane) delegates these to it."""

from __future__ import annotations

from datetime import UTC, datetime

from punctual.backoff import Backoff
from punctual.dal.tenants import TenantStore
from punctual.domain.errors import Conflict, Forbidden, InvalidInput, Retryable
from punctual.domain.principals import PrincipalError, normalize_principal
from punctual.domain.tenancy import Quotas, Target, Tenant
from punctual.integrations.queues import QueueAdmin, TargetQueues
from punctual.services import Services

# Rounds of granting a tenant's principals on its queues until a read finds no new one.
GRANT = Backoff(tries=5, base=0.1, cap=1.0)


class TenantAdmin:
    def __init__(self, services: Services, tenants: TenantStore, queues: QueueAdmin) -> None:
        self._s = services
        self.settings = services.settings
        # The control plane's store and queue admin (the same objects: what a test or a
        # fault layer does to the plane's, it does to these).
        self.tenants = tenants
        self.queues = queues

    def _now(self) -> int:
        return int(self._s.now())

    def is_operator(self, principal_arn: str) -> bool:
        try:
            caller = normalize_principal(principal_arn)
        except PrincipalError:
            return False
        return caller in self.settings.operator_principals

    def tenant_of(self, principal_arn: str) -> str:
        try:
            caller = normalize_principal(principal_arn)
        except PrincipalError:
            raise Forbidden("this kind of principal cannot be bound to a tenant") from None
        tenant_id = self.tenants.tenant_of(caller)
        if tenant_id is None:
            raise Forbidden("this principal is not bound to a tenant")
        return tenant_id

    def create_target(self, tenant_id: str, name: str, *, early_delivery: bool = False) -> Target:
        if self.tenants.get_target(tenant_id, name, consistent=True):
            raise Conflict(f"target {name} already exists")
        principals = self.tenants.get(tenant_id).principals
        queues = self.queues.create(tenant_id, name, principals)
        target = Target(
            tenant_id=tenant_id,
            name=name,
            queue_url=queues.queue_url,
            queue_arn=queues.queue_arn,
            dlq_url=queues.dlq_url,
            dlq_arn=queues.dlq_arn,
            created_at=datetime.fromtimestamp(self._now(), UTC),
            early_delivery=early_delivery,
        )
        self.tenants.put_target(target)
        # Race: a principal bound since the read above, whose bind listed the tenant's targets
        # before this one was stored, is granted here.
        self._grant_until_settled(tenant_id, [queues], granted=principals)
        return target

    def bind_principal(self, principal_arn: str, tenant_id: str) -> Tenant:
        """Bind what callers will present: a session ARN stands for its role, a role or user
        is bound whatever its path."""
        try:
            principal = normalize_principal(principal_arn)
        except PrincipalError as error:
            raise InvalidInput(
                "not a principal that can be bound",
                [{"field": "principal_arn", "reason": str(error)}],
            ) from None
        self.tenants.bind_principal(principal, tenant_id)
        # Consistent: a target made a moment ago must be granted the new principal too.
        targets = self.tenants.list_targets(tenant_id, consistent=True)
        return self._grant_until_settled(
            tenant_id,
            [TargetQueues(t.queue_url, t.queue_arn, t.dlq_url, t.dlq_arn) for t in targets],
            granted=None,
        )

    def _grant_until_settled(
        self, tenant_id: str, targets: list[TargetQueues], *, granted: list[str] | None
    ) -> Tenant:
        """Grant the tenant's principals on ``targets`` (``granted``: what they already
        grant) until a read after the grant finds no other: a queue policy is replaced whole,
        so of two binds at once the one granting last may know only its own principal; it
        reads again and grants both. The tenant, as last read (consistently: a principal
        bound a moment ago must be seen). Retryable if binds kept changing the principals
        through GRANT's tries: the caller's retry grants again."""
        for _ in GRANT.attempts(self._s.sleep):
            tenant = self.tenants.get(tenant_id)
            if tenant.principals == granted:
                return tenant
            for queues in targets:
                self.queues.grant(queues, tenant.principals, tenant_id=tenant_id)
            granted = tenant.principals
        raise Retryable("the tenant's principals kept changing while its queues were granted")

    def create_tenant(self, tenant_id: str, quotas: Quotas) -> Tenant:
        tenant = Tenant(
            tenant_id=tenant_id, quotas=quotas, created_at=datetime.fromtimestamp(self._now(), UTC)
        )
        self.tenants.create(tenant)
        return tenant

    def require_target(self, tenant_id: str, name: str) -> None:
        # Consistent: a target created a moment ago must be usable at once.
        if self.tenants.get_target(tenant_id, name, consistent=True) is None:
            raise InvalidInput(
                f"unknown target {name}",
                [{"field": "target", "reason": f"no target named {name!r}; create it first"}],
            )
