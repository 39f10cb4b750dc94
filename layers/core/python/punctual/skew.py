"""How far a clock is from a server's, measured from the instants the server stamps on what
it answers: the worker's from SQS's first-receive stamps (docs/worker.md, *Starting on the
instant*), each server component's from the Date of DynamoDB's answers (``AnswerClock``;
docs/operations.md, *Clock skew*).

A server's stamp lies within the call that returned it: after the call was made and before
its answer arrived, by the caller's clock corrected by the true offset. So each stamp bounds
the offset (the server's time minus the caller's): at least the stamp minus the answer's
arrival, at most the stamp (plus its resolution: a millisecond for SQS's
``ApproximateFirstReceiveTimestamp``, a second for HTTP's Date) minus the call's start.
Every bound holds at once, so the estimate is their intersection, and it narrows with every
call that answered at once (and, for a Date, with every call made just after the server's
second turned).

What the worker uses is the lower bound: by its clock plus the least offset every sample
allows, an instant is never reached early (the true offset is at least that), and at most
late by the width of the tightest sample's answer leg (milliseconds). What a server
component publishes is the offset nearest zero the bounds allow (``Offset.least``): how far
off its clock is for certain, never more, so an alarm on it does not fire on a wide guess.

The offset moves: a clock drifts (NTP slews one that was behind by up to 500 ppm) or is
stepped. So a sample's bounds widen with its age by MAX_DRIFT per second (a sample's
lower bound never stays above an offset that drifted down since), samples older than
KEEP_SECONDS are dropped, and a step is caught where it happens: between two samples the
caller's clock must have moved as its monotonic clock did (within STEP_SECONDS plus the
drift); otherwise every earlier sample is dropped. A sample that contradicts the others
starts the estimate again from it too, and a clock stepped back is caught before its next
sample: samples answered more than a second after the time asked about are dropped.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

R = TypeVar("R")

KEEP_SECONDS = 300.0  # samples kept
RESOLUTION = 0.001  # SQS's stamps are in milliseconds
DATE_RESOLUTION = 1.0  # HTTP's Date is in whole seconds
SAMPLE_EVERY = 1.0  # an AnswerClock samples at most one answer a second (a Date's resolution)
MAX_SAMPLES = 256
MAX_DRIFT = 500e-6  # seconds per second a clock may drift (NTP's largest slew)
STEP_SECONDS = 0.05  # the host clock moved this much more or less than the monotonic one: a step
# A sample answered this long after the time asked about: the clock was stepped back (more
# than a thread's read of the clock racing another's sample can make it).
BACK_STEP_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Offset:
    """The server's time minus the caller's, in seconds, within [low, high] (high may be
    inf: only a lower bound is known). ``samples``: how many stamps it is made of."""

    low: float
    high: float
    samples: int

    @property
    def width(self) -> float:
        return self.high - self.low

    @property
    def least(self) -> float:
        """The offset nearest zero the bounds allow: 0 when they hold zero, else the bound
        nearer it (positive: the caller's clock is behind the server's by at least that)."""
        return max(self.low, min(0.0, self.high))


class ClockSkew:
    """A clock's offset from a server's, from the server's stamps. Thread-safe.
    ``monotonic``: the clock a step of the host's clock is told against."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        # (answered by the host's clock, by the monotonic one, low, high)
        self._samples: deque[tuple[float, float, float, float]] = deque(maxlen=MAX_SAMPLES)
        self._monotonic = monotonic
        self._lock = threading.Lock()

    def steady(self) -> float:
        """The monotonic clock a step is told against, now."""
        return self._monotonic()

    def observe(
        self,
        stamp: float,
        called: float,
        answered: float,
        resolution: float = RESOLUTION,
        steady: float | None = None,
    ) -> None:
        """A stamp of ``stamp`` (epoch seconds by the server's clock, truncated to
        ``resolution``: a first receive's by default) in a call made at ``called`` and
        answered at ``answered`` (the caller's clock); ``steady``: the monotonic clock when
        it was answered (read now if not given)."""
        if not (math.isfinite(stamp) and math.isfinite(called)) or called > answered:
            return
        steady = self._monotonic() if steady is None else steady
        sample = (answered, steady, stamp - answered, stamp + resolution - called)
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
        """The offset as the samples of the last KEEP_SECONDS bound it now; None with none.
        A sample answered more than BACK_STEP_SECONDS after ``now`` says the clock was
        stepped back since: every sample is dropped (they would hold the old offset until
        the clock caught up with them)."""
        with self._lock:
            if self._samples and self._samples[-1][0] > now + BACK_STEP_SECONDS:
                self._samples.clear()
            while self._samples and self._samples[0][0] < now - KEEP_SECONDS:
                self._samples.popleft()
            if not self._samples:
                return None
            low, high = self._bounds(now)
            return Offset(low, high, len(self._samples))

    def true_now(self, now: float) -> float:
        """The earliest the true time (the server's) can be when the clock says ``now``:
        ``now`` itself until a sample is known."""
        found = self.offset(now)
        return now if found is None else now + found.low


class AnswerClock:
    """A server component's clock against AWS's: ``timed`` calls, and the Date of the answer
    (the server's clock when it answered, in whole seconds) bounds the offset as any stamp
    does (``skew``). At most one answer a second is taken (a Date says nothing finer), by
    the monotonic clock (a step of ``now`` back does not stop the sampling), so a walk of
    thousands of calls pays three clock reads each and little else."""

    def __init__(self, now: Callable[[], float], skew: ClockSkew | None = None) -> None:
        self.now = now
        self.skew = skew or ClockSkew()
        self._sampled = -math.inf  # (read and written without a lock: a lost sample is harmless)

    def timed(self, call: Callable[[], R]) -> R:
        called = self.now()
        answer = call()
        answered = self.now()
        steady = self.skew.steady()
        if steady - self._sampled >= SAMPLE_EVERY:
            stamp = answer_date(answer)
            if stamp is not None:
                self._sampled = steady
                self.skew.observe(stamp, called, answered, DATE_RESOLUTION, steady)
        return answer

    def offset(self) -> Offset | None:
        return self.skew.offset(self.now())


def answer_date(answer: Any) -> float | None:
    """An AWS answer's Date header as epoch seconds; None without one (an emulator may send
    none) or with one that does not parse."""
    metadata = answer.get("ResponseMetadata") if isinstance(answer, dict) else None
    headers = metadata.get("HTTPHeaders") if isinstance(metadata, dict) else None
    text = headers.get("date") if isinstance(headers, dict) else None
    if not isinstance(text, str):
        return None
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    # (HTTP's Date is GMT; one written without a zone is read as UTC, not the host's zone)
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
