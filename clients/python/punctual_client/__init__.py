"""Punctual's client, what a tenant installs (the punctual-client distribution): the
``punctual`` command (``cli``, ``commands``), its SigV4 HTTP client (``http``) and the worker
SDK (``worker``). It speaks the message schema and the run protocol of the punctual-core it
pins (``punctual --version`` says which)."""
