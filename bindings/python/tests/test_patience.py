"""The tests' time budget (``tests/patience.py``) keeps the base figures on a
quiet machine and scales every figure in proportion on a busy one.

Time: nothing here depends on elapsed time (the samples are given).
"""

from __future__ import annotations

from patience import MAX_FACTOR, Patience, Record


def test_a_quiet_machine_keeps_the_base_figures_and_a_busy_one_scales_them() -> None:
    quiet = Patience.of(0.0, 1.0)
    assert quiet.factor == 1.0 and quiet.scale(0.4) == 0.4
    busy = Patience.of(0.020, 1.0)
    assert abs(busy.factor - 3.0) < 1e-9 and abs(busy.scale(2.0) - 6.0) < 1e-9
    assert busy.duration(0.4) == "1200ms"
    assert str(busy) == "patience ×3.0 (scheduling delay up to 20ms)", str(busy)
    assert str(Patience.of(0.000164521, 1.0)).endswith("up to 164.521µs)")
    assert Patience.of(0.0, 2.5).factor == 2.5
    assert Patience.of(60.0, 1.0).factor == MAX_FACTOR
    # A record of its own: this process's would keep the burst as the floor.
    record = Record()
    burst = record.from_samples(0.050, 1.0)
    after = record.from_samples(0.0, 1.0)
    assert after.factor >= burst.factor, (after, burst)
