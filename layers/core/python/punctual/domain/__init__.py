"""Domain types and pure rules: records and their states, identifiers, errors, the message
schema, tenancy and quotas, planning fires into occurrences, principals, drain arithmetic.
No AWS call is made here."""
