"""The one way Punctual tries a call again: a bounded number of tries, apart by an
exponential back-off with full jitter (each pause drawn uniformly between 0 and
min(cap, base * 2**n)), as AWS's SDKs and its Architecture Blog advise. Throttled callers
that retry at once, in step, hammer the partition that throttled them; a loop without a
bound turns a lasting fault into a hung invocation.

Every retry loop of the runtime uses it: DynamoDB keys left unprocessed, a transaction
cancelled by a conflict or throttling, an SQS batch's failed entries, a worker's fenced
completion, a queue policy granted again. The pause goes through an injected ``sleep``, so
tests and the simulation wait without a clock."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Sleep = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class Backoff:
    """``tries`` in all; the pause before try n+1 (n from 0) is uniform in
    [0, min(cap, base * 2**n)] seconds."""

    tries: int
    base: float = 0.05
    cap: float = 1.0

    def ceiling(self, retry: int) -> float:
        """The longest pause before the ``retry``-th retry (0 for the first)."""
        return float(min(self.cap, self.base * 2**retry))

    def pause(self, retry: int, rng: random.Random | None = None) -> float:
        """A jittered pause before the ``retry``-th retry (0 for the first)."""
        return (rng or random).uniform(0, self.ceiling(retry))

    def attempts(self, sleep: Sleep, rng: random.Random | None = None) -> Iterator[int]:
        """The try numbers 0 .. tries - 1, after a jittered pause for every one but the first.
        A caller breaks out once a try succeeded; a loop that runs out (``for ... else``)
        failed every try."""
        for attempt in range(self.tries):
            if attempt:
                sleep(self.pause(attempt - 1, rng))
            yield attempt
