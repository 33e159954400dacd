"""A measured time budget for tests against real servers, as in the Rust
test kit (``crates/fencelock-testkit/src/patience.rs``).

A test against a real server cannot fix its TTLs and bounds, or a busy
machine fails it: a 400 ms lease whose grant takes 370 ms to come back is
lost at birth. :meth:`Patience.measure` (``time.sleep``, for a test without
an event loop, and the ``patience`` fixture) or :meth:`Patience.measure_async`
(``asyncio.sleep``, inside the test's event loop) measures what the machine
costs right now, at the start of the test: the worst scheduling delay of a
few short sleeps. Every TTL, wait and bound the test uses is its *base*
figure (what a quiet machine needs, with the margins the test always had)
times the measured factor, so a loaded machine gets longer leases and longer
bounds instead of a false failure.

- The base figures allow :data:`ALLOWANCE` of delay. The factor is
  ``1 + worst delay / ALLOWANCE``, never below 1 (the test keeps its meaning
  on a quiet machine) and never above :data:`MAX_FACTOR` (a test still ends).
- Load comes in bursts that a measurement of a few milliseconds can fall
  between, so a factor measured in the same process within the last 15 s
  is the floor of the next one.
- ``FENCELOCK_TEST_PATIENCE=F`` sets a floor under the factor, for a machine
  known to be slow (a debugger, an emulator).
- A test that still fails names its budget: a patience shows as
  ``patience ×2.3 (scheduling delay up to 18ms)``.

A figure a test would *report* (a latency, a rate) is no business of this
module: those belong in the benchmarks (``bench/``), never in an assertion.

Time: this module is the tests' time budget; it asserts nothing itself.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from typing import Callable, List, Optional, Tuple

import pytest

#: The delay the base figures of the tests allow for, in seconds.
ALLOWANCE = 0.010
#: The largest factor: beyond it the machine is not running tests but thrashing.
MAX_FACTOR = 16.0
#: Short sleeps timed to find the scheduling delay.
SLEEPS = 16
#: The floor's variable.
FLOOR_VAR = "FENCELOCK_TEST_PATIENCE"
#: How long a measured factor stays the floor of later measurements, in seconds.
MEMORY = 15.0


def _clamp(factor: float) -> float:
    if math.isnan(factor):
        return 1.0
    return min(max(factor, 1.0), MAX_FACTOR)


def _shown(seconds: float) -> str:
    """A duration as Rust's ``Debug`` shows one: ``18.5ms``, ``164.521µs``."""

    def trim(value: float) -> str:
        return f"{value:.6f}".rstrip("0").rstrip(".")

    if seconds >= 1:
        return f"{trim(seconds)}s"
    if seconds >= 0.001:
        return f"{trim(seconds * 1e3)}ms"
    return f"{trim(seconds * 1e6)}µs"


class Record:
    """What a process measured: the last budget, and each measurement's own
    factor within :data:`MEMORY`, the floor of the next one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: Optional[Patience] = None
        self.recent: List[Tuple[float, float]] = []  # (monotonic time, factor)

    def from_samples(self, scheduling: float, floor: float) -> Patience:
        """The budget of this delay, no less than ``floor`` and than the
        factor recorded within :data:`MEMORY`; it becomes the last."""
        with self.lock:
            now = time.monotonic()
            # The sample's own factor is remembered, not the floored one, so
            # that a burst's factor is forgotten after MEMORY.
            own = Patience.of(scheduling, 1.0).factor
            self.recent = [(at, f) for at, f in self.recent if now - at < MEMORY]
            recent = max([1.0] + [f for _, f in self.recent])
            self.recent.append((now, own))
            self.last = Patience.of(scheduling, max(floor, recent))
            return self.last


#: This process's record.
MEASURED = Record()


def floor() -> float:
    """``FENCELOCK_TEST_PATIENCE``, or 1."""
    try:
        value = float(os.environ.get(FLOOR_VAR, "").strip())
    except ValueError:
        return 1.0
    return value if math.isfinite(value) else 1.0


class Patience:
    """A time budget measured on this machine, now."""

    def __init__(self, factor: float, scheduling: float = 0.0) -> None:
        self.factor = _clamp(factor)
        #: The worst scheduling delay measured, in seconds.
        self.scheduling = scheduling

    @staticmethod
    def of(scheduling: float, floor: float) -> Patience:
        """The budget of this delay and floor, remembering nothing."""
        return Patience(max(1.0 + scheduling / ALLOWANCE, floor), scheduling)

    @staticmethod
    def measure() -> Patience:
        """The worst overshoot of :data:`SLEEPS` ``time.sleep`` calls of 1 ms."""
        worst = 0.0
        for _ in range(SLEEPS):
            asked = 0.001
            started = time.monotonic()
            time.sleep(asked)
            worst = max(worst, time.monotonic() - started - asked)
        return MEASURED.from_samples(worst, floor())

    @staticmethod
    async def measure_async() -> Patience:
        """The worst overshoot of :data:`SLEEPS` ``asyncio.sleep`` calls of
        1 ms, on the running event loop."""
        worst = 0.0
        for _ in range(SLEEPS):
            asked = 0.001
            started = time.monotonic()
            await asyncio.sleep(asked)
            worst = max(worst, time.monotonic() - started - asked)
        return MEASURED.from_samples(worst, floor())

    @staticmethod
    def current() -> Patience:
        """The last budget this process measured, else a factor of 1 (or the
        floor): for helpers (the CLI, the servers) that no test hands one."""
        with MEASURED.lock:
            last = MEASURED.last
        return last if last is not None else Patience(floor())

    def scale(self, base: float) -> float:
        """A figure (a TTL, a wait, a bound, in seconds) whose base is
        ``base``: never less than the base, rounded up to the millisecond
        (engines count leases in whole milliseconds, and a fraction of one
        would be granted a shade less than asked)."""
        return math.ceil(round(base * self.factor * 1000, 6)) / 1000

    def duration(self, base: float) -> str:
        """:meth:`scale` as a duration string for the CLI (``"2300ms"``)."""
        return f"{math.ceil(round(self.scale(base) * 1000, 6))}ms"

    def wait_for(self, base: float, what: str, condition: Callable[[], bool]) -> None:
        """Polls ``condition`` every few ms until it holds; fails naming
        ``what`` and the budget when it still does not after :meth:`scale`
        of ``base``: how a test waits for a condition instead of sleeping."""
        bound = self.scale(base)
        until = time.monotonic() + bound
        while not condition():
            if time.monotonic() > until:
                pytest.fail(f"{what}: not within {bound:.3f} s [{self}]", pytrace=False)
            time.sleep(0.005)

    async def wait_for_async(self, base: float, what: str, condition: Callable[[], bool]) -> None:
        """:meth:`wait_for` with ``asyncio.sleep``, inside an event loop."""
        bound = self.scale(base)
        until = time.monotonic() + bound
        while not condition():
            if time.monotonic() > until:
                pytest.fail(f"{what}: not within {bound:.3f} s [{self}]", pytrace=False)
            await asyncio.sleep(0.005)

    def __str__(self) -> str:
        return f"patience ×{self.factor:.1f} (scheduling delay up to {_shown(self.scheduling)})"

    __repr__ = __str__


@pytest.fixture
def patience() -> Patience:
    """The budget measured at the start of the test (``time.sleep``)."""
    return Patience.measure()

