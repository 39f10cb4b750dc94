"""What every test shares: botocore's service models, parsed once per process.

moto's ``mock_aws`` starts each test with no default boto3 session, so every client a test
makes would come from a new session that parses the service's JSON model again (about 0.1 s
a client, a third of an integration test's setup). The models are read-only data; one
loader serves every session. Nothing else changes: each test still gets new sessions,
clients and moto backends.
"""

from __future__ import annotations

import functools

import botocore.loaders
import botocore.session

botocore.session.create_loader = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)
