"""The catch-up lane's relay Lambda: the relay's own code (relay.handler), deployed as a
function of its own so that its event source mapping (the stream's records of catch-up
occurrences only) and its concurrency are apart from the on-time lane's (infra/relay.py)."""

from relay.handler import lambda_handler

__all__ = ["lambda_handler"]
