"""The head-to-head's Elo fit (masrl.families.games.head_to_head): ratings that reproduce a consistent table, order
an inconsistent one, and stay finite when a player wins everything."""

from __future__ import annotations

import pytest


def _elo():
    from masrl.families.games.head_to_head import elo

    return elo


def _expected(ra: float, rb: float) -> float:
    return 1.0 / (1.0 + 10 ** ((rb - ra) / 400.0))


def test_ratings_reproduce_a_table_that_some_ratings_explain_and_keep_the_mean_at_1000():
    elo = _elo()
    truth = {"a": 1200.0, "b": 1000.0, "c": 800.0}
    cells = {(x, y): _expected(truth[x], truth[y]) for x in truth for y in truth if x != y}
    got = elo(list(truth), cells, iters=5000)
    assert all(got[n] == pytest.approx(truth[n], abs=2.0) for n in truth)
    assert sum(got.values()) / 3 == pytest.approx(1000.0)


def test_an_even_table_rates_everyone_alike_and_a_clean_sweep_stays_finite():
    elo = _elo()
    even = elo(["x", "y"], {("x", "y"): 0.5, ("y", "x"): 0.5})
    assert even["x"] == pytest.approx(1000.0) and even["y"] == pytest.approx(1000.0)
    sweep = elo(["w", "l"], {("w", "l"): 1.0, ("l", "w"): 0.0})
    assert sweep["w"] > 1300 > 700 > sweep["l"] and all(abs(v) < 5000 for v in sweep.values())
