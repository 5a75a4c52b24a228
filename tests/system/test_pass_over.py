"""The one "pass over a failing endpoint for a while"."""

from __future__ import annotations

from cartonstore.system.pass_over import PassOver


def test_an_endpoint_is_passed_over_for_the_period_after_its_last_failure() -> None:
    now = [100.0]
    down = PassOver(30.0, clock=lambda: now[0])
    assert "a" not in down and down.add("a") and "a" in down
    now[0] = 120.0
    assert not down.add("a")   # failing again while passed over: nothing new to say, the period starts again
    now[0] = 149.9
    assert "a" in down and "b" not in down
    now[0] = 150.0
    assert "a" not in down and down.add("a")


def test_a_period_of_zero_passes_nothing_over() -> None:
    down = PassOver(0.0, clock=lambda: 5.0)
    assert down.add("a") and "a" not in down and down.add("a")
