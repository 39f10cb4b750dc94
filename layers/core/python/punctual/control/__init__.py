"""The control plane: what the API does with schedules (plane), manual runs (run now,
backfill), tenant administration (targets, principals, tenants) and the IAM policy a
tenant's workers get (access)."""
