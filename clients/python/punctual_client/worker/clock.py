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
most late by the width of the tightest sample's answer leg (milliseconds).

The offset moves: a clock drifts (NTP slews one that was behind by up to 500 ppm) or is
stepped. So a sample's bounds widen with its age by MAX_DRIFT per second (a sample's
lower bound never stays above an offset that drifted down since), samples older than
KEEP_SECONDS are dropped, and a step is caught where it happens: between two samples the
host's clock must have moved as its monotonic clock did (within STEP_SECONDS plus the
drift); otherwise every earlier sample is dropped. A sample that contradicts the others
starts the estimate again from it too.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

KEEP_SECONDS = 300.0  # samples kept
RESOLUTION = 0.001  # SQS's stamps are in milliseconds
MAX_SAMPLES = 256
MAX_DRIFT = 500e-6  # seconds per second a clock may drift (NTP's largest slew)
STEP_SECONDS = 0.05  # the host clock moved this much more or less than the monotonic one: a step


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
    """The worker clock's offset from SQS's, from first receives' stamps. Thread-safe.
    ``monotonic``: the clock a step of the host's clock is told against."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        # (answered by the host's clock, by the monotonic one, low, high)
        self._samples: deque[tuple[float, float, float, float]] = deque(maxlen=MAX_SAMPLES)
        self._monotonic = monotonic
        self._lock = threading.Lock()

    def observe(self, stamp: float, called: float, answered: float) -> None:
        """A first receive SQS stamped ``stamp`` (epoch seconds, its clock), in a receive
        call made at ``called`` and answered at ``answered`` (the worker's clock)."""
        if not (math.isfinite(stamp) and math.isfinite(called)) or called > answered:
            return
        sample = (answered, self._monotonic(), stamp - answered, stamp + RESOLUTION - called)
        with self._lock:
            if self._samples and self._stepped(self._samples[-1], sample):
                self._samples.clear()
            self._samples.append(sample)
            low, high = self._bounds(answered)
            if low > high:
                # Contradicts the earlier ones: start again from it.
                self._samples.clear()
                self._samples.append(sample)

    @staticmethod
    def _stepped(
        before: tuple[float, float, float, float], after: tuple[float, float, float, float]
    ) -> bool:
        """The host's clock moved between two samples otherwise than the monotonic one."""
        host, steady = after[0] - before[0], after[1] - before[1]
        return abs(host - steady) > STEP_SECONDS + MAX_DRIFT * abs(steady)

    def _bounds(self, now: float) -> tuple[float, float]:
        """The intersection of the samples' bounds, each widened by the drift since it."""
        low = max(lo - MAX_DRIFT * max(0.0, now - at) for at, _, lo, _ in self._samples)
        high = min(hi + MAX_DRIFT * max(0.0, now - at) for at, _, _, hi in self._samples)
        return low, high

    def offset(self, now: float) -> Offset | None:
        """The offset as the samples of the last KEEP_SECONDS bound it now; None with none."""
        with self._lock:
            while self._samples and self._samples[0][0] < now - KEEP_SECONDS:
                self._samples.popleft()
            if not self._samples:
                return None
            low, high = self._bounds(now)
            return Offset(low, high, len(self._samples))

    def true_now(self, now: float) -> float:
        """The earliest the true time (SQS's) can be when the worker's clock says ``now``:
        ``now`` itself until a sample is known."""
        found = self.offset(now)
        return now if found is None else now + found.low
