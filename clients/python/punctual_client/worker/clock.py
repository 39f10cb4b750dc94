"""How far the worker's clock is from SQS's, measured from what SQS stamps on the messages it
hands out (docs/worker.md, *Starting on the instant*).

SQS stamps a message's first receive (``ApproximateFirstReceiveTimestamp``, epoch
milliseconds, by its clock). That instant lies within the receive call that returned the
message: after the call was made and before its answer arrived, by the worker's clock
corrected by the true offset. So each first receive bounds the offset (SQS's time minus the
worker's): at least the stamp minus the answer's arrival, at most the stamp (plus its
millisecond) minus the call's start. Every bound holds at once, so the estimate is their
intersection, and it narrows with every call that answered at once.

What the worker uses is the lower bound: by the worker's clock plus the least offset every
sample allows, an instant is never reached early (the true offset is at least that), and at
most late by the width of the tightest sample's answer leg (milliseconds). A sample that
contradicts the others (the host's clock was stepped) starts the estimate again from it, and
samples older than KEEP_SECONDS are dropped, so a clock that drifts is followed.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

KEEP_SECONDS = 600.0  # samples kept (a drifting clock: a few ms in ten minutes)
RESOLUTION = 0.001  # SQS's stamps are in milliseconds
MAX_SAMPLES = 256


@dataclass(frozen=True, slots=True)
class Offset:
    """SQS's time minus the worker's, in seconds, within [low, high] (high may be inf: only
    a lower bound is known). ``samples``: how many first receives it is made of."""

    low: float
    high: float
    samples: int

    @property
    def width(self) -> float:
        return self.high - self.low


class ClockSkew:
    """The worker clock's offset from SQS's, from first receives' stamps. Thread-safe."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=MAX_SAMPLES)
        self._lock = threading.Lock()

    def observe(self, stamp: float, called: float, answered: float) -> None:
        """A first receive SQS stamped ``stamp`` (epoch seconds, its clock), in a receive
        call made at ``called`` and answered at ``answered`` (the worker's clock; ``called``
        may be -inf when not known: a message handed over by Lambda)."""
        if not (math.isfinite(stamp) and math.isfinite(answered)) or called > answered:
            return
        low, high = stamp - answered, stamp + RESOLUTION - called
        with self._lock:
            self._samples.append((answered, low, high))
            bounds = self._bounds()
            if bounds[0] > bounds[1]:
                # Contradicts an earlier one: the clock was stepped; start again from it.
                self._samples.clear()
                self._samples.append((answered, low, high))

    def _bounds(self) -> tuple[float, float]:
        return (
            max(low for _, low, _ in self._samples),
            min(high for _, _, high in self._samples),
        )

    def offset(self, now: float) -> Offset | None:
        """The offset as the samples of the last KEEP_SECONDS bound it; None with none."""
        with self._lock:
            while self._samples and self._samples[0][0] < now - KEEP_SECONDS:
                self._samples.popleft()
            if not self._samples:
                return None
            low, high = self._bounds()
            return Offset(low, high, len(self._samples))

    def true_now(self, now: float) -> float:
        """The earliest the true time (SQS's) can be when the worker's clock says ``now``:
        ``now`` itself until a sample is known."""
        found = self.offset(now)
        return now if found is None else now + found.low
