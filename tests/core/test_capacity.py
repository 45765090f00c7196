"""Capacity rule and staleness bounds (paper §3.3, Appendix B)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo2sdk.core.capacity import (
    delta_max_conservative,
    delta_max_tightened,
    kappa_for,
    mu_min,
    mu_target,
    num_chains,
    overlap_ok,
)
from echo2sdk.errors import CapacityError


# ---------------------------------------------------------------- kappa_for


@pytest.mark.parametrize(("S", "kappa"), [(2, 1), (3, 2), (4, 3), (10, 9)])
def test_kappa_is_S_minus_1(S, kappa):
    assert kappa_for(S) == kappa


@pytest.mark.parametrize("S", [1, 0, -3])
def test_kappa_rejects_S_below_2_naming_value(S):
    with pytest.raises(CapacityError, match=rf"S.*{S}"):
        kappa_for(S)


@pytest.mark.parametrize("S", [2.0, "3", True, None])
def test_kappa_rejects_non_integer_S(S):
    with pytest.raises(CapacityError, match="S"):
        kappa_for(S)


# ---------------------------------------------------------------- mu_min


def test_mu_min_formula():
    # kappa*R / (kappa*T_train - T_bcast) = 2*128 / (2*100 - 40) = 1.6
    assert mu_min(T_train=100.0, T_bcast=40.0, R=128, kappa=2) == pytest.approx(1.6)


def test_mu_min_zero_broadcast_is_R_over_T_train():
    assert mu_min(10.0, 0.0, 50, 3) == pytest.approx(5.0)


def test_mu_min_decreases_with_kappa():
    values = [mu_min(100.0, 150.0, 128, k) for k in (2, 3, 4, 8)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(("T_train", "T_bcast", "kappa"), [(100.0, 200.0, 2), (100.0, 250.0, 2), (10.0, 10.0, 1)])
def test_mu_min_infeasible_names_values_and_remedy(T_train, T_bcast, kappa):
    with pytest.raises(CapacityError) as e:
        mu_min(T_train, T_bcast, 128, kappa)
    msg = str(e.value)
    assert "infeasible" in msg
    assert f"{T_bcast:g}" in msg and f"{T_train:g}" in msg and str(kappa) in msg
    assert "increase S (kappa) or reduce T_bcast" in msg


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"T_train": 0.0}, "T_train"),
        ({"T_train": -1.0}, "T_train"),
        ({"T_train": math.inf}, "T_train"),
        ({"T_train": math.nan}, "T_train"),
        ({"T_bcast": -0.5}, "T_bcast"),
        ({"T_bcast": math.nan}, "T_bcast"),
        ({"R": 0}, "R"),
        ({"R": math.inf}, "R"),
        ({"kappa": 0}, "kappa"),
        ({"kappa": 2.5}, "kappa"),
    ],
)
def test_mu_min_rejects_bad_inputs_naming_them(kwargs, name):
    args = {"T_train": 100.0, "T_bcast": 10.0, "R": 64, "kappa": 2} | kwargs
    with pytest.raises(CapacityError, match=name):
        mu_min(**args)


# ---------------------------------------------------------------- overlap_ok


def test_overlap_ok_examples():
    # 2*100 >= 40 + 2*128/2 = 168
    assert overlap_ok(100.0, 40.0, 128, 2, 2.0)
    # 2*100 >= 40 + 2*128/1.5 = 210.7 is false
    assert not overlap_ok(100.0, 40.0, 128, 2, 1.5)


@pytest.mark.parametrize("mu_pool", [0, 0.0, -1.0])
def test_overlap_ok_false_without_pool(mu_pool):
    assert overlap_ok(100.0, 0.0, 1, 2, mu_pool) is False


def test_overlap_ok_rejects_nan_pool():
    with pytest.raises(CapacityError, match="mu_pool"):
        overlap_ok(100.0, 0.0, 1, 2, math.nan)


@settings(max_examples=200, deadline=None)
@given(
    T_train=st.floats(0.01, 1e4),
    T_bcast=st.floats(0.0, 1e4),
    R=st.floats(0.01, 1e4),
    kappa=st.integers(1, 20),
    gamma=st.floats(1.0, 3.0),
)
def test_overlap_holds_at_and_above_mu_min(T_train, T_bcast, R, kappa, gamma):
    """Eq. (1) and mu_min agree: mu_min is exactly where the overlap condition starts to hold."""
    if kappa * T_train <= T_bcast:
        with pytest.raises(CapacityError):
            mu_min(T_train, T_bcast, R, kappa)
        return
    m = mu_min(T_train, T_bcast, R, kappa)
    assert overlap_ok(T_train, T_bcast, R, kappa, m)
    assert overlap_ok(T_train, T_bcast, R, kappa, mu_target(m, gamma))
    assert not overlap_ok(T_train, T_bcast, R, kappa, m * 0.99)


# ---------------------------------------------------------------- staleness bounds


def test_delta_max_conservative_formula():
    # kappa + ceil((T_bcast + R/mu_pool)/T_train) - 1 = 2 + ceil((40 + 64)/100) - 1 = 2 + 2 - 1
    assert delta_max_conservative(100.0, 40.0, 128, 2, 2.0) == 3
    # Exact multiple: (100 + 100)/100 = 2 -> 2 + 2 - 1
    assert delta_max_conservative(100.0, 100.0, 100, 2, 1.0) == 3


def test_delta_max_tightened_formula():
    # kappa + ceil((1 - 1/kappa) * T_bcast / T_train) = 2 + ceil(0.5 * 150/100) = 2 + 1
    assert delta_max_tightened(100.0, 150.0, 2) == 3
    assert delta_max_tightened(100.0, 0.0, 3) == 3
    # kappa = 1: (1 - 1) * anything = 0
    assert delta_max_tightened(1.0, 1e6, 1) == 1


def test_ceil_tolerates_float_noise():
    # (0.1 + 0.2) / 0.1 = 3.0000000000000004: a plain ceil would give 4.
    assert delta_max_conservative(0.1, 0.1, 0.2, 1, 1.0) == 1 + 3 - 1
    # (1 - 1/4) * 0.4 / 0.1 = 3.0000000000000004: a plain ceil would give 4.
    assert delta_max_tightened(0.1, 0.4, 4) == 4 + 3


def test_delta_max_rejects_bad_pool():
    with pytest.raises(CapacityError, match="mu_pool"):
        delta_max_conservative(100.0, 40.0, 128, 2, 0.0)


@pytest.mark.parametrize("kappa", [0, -1, 1.5])
def test_delta_max_tightened_rejects_bad_kappa(kappa):
    with pytest.raises(CapacityError, match="kappa"):
        delta_max_tightened(100.0, 40.0, kappa)


@settings(max_examples=200, deadline=None)
@given(
    T_train=st.floats(0.01, 1e4),
    T_bcast=st.floats(0.0, 1e4),
    R=st.floats(0.01, 1e4),
    kappa=st.integers(1, 20),
    gamma=st.floats(1.0, 3.0),
)
def test_tightened_bound_dominates_under_overlap(T_train, T_bcast, R, kappa, gamma):
    """Appendix B.3: when eq. (1) holds, the conservative bound is at most the tightened one."""
    if kappa * T_train <= T_bcast:
        return
    pool = mu_target(mu_min(T_train, T_bcast, R, kappa), gamma)
    assert delta_max_conservative(T_train, T_bcast, R, kappa, pool) <= delta_max_tightened(T_train, T_bcast, kappa)
    assert delta_max_tightened(T_train, T_bcast, kappa) >= kappa


# ---------------------------------------------------------------- num_chains


@pytest.mark.parametrize(("B0", "Bw", "n"), [(1000, 100, 10), (1050, 100, 10), (100, 100, 1), (199.9, 100, 1)])
def test_num_chains_floor(B0, Bw, n):
    assert num_chains(B0, Bw) == n


def test_num_chains_float_noise():
    # 0.3 / 0.1 = 2.9999999999999996 must be 3 chains.
    assert num_chains(0.3, 0.1) == 3


def test_num_chains_rejects_uplink_below_worker_link():
    with pytest.raises(CapacityError, match=r"B0=50.*Bw=100"):
        num_chains(50, 100)


@pytest.mark.parametrize(("B0", "Bw", "name"), [(0, 100, "B0"), (-5, 100, "B0"), (100, 0, "Bw"), (100, math.inf, "Bw")])
def test_num_chains_rejects_non_positive(B0, Bw, name):
    with pytest.raises(CapacityError, match=name):
        num_chains(B0, Bw)


# ---------------------------------------------------------------- mu_target


def test_mu_target_default_gamma():
    assert mu_target(10.0) == pytest.approx(11.0)
    assert mu_target(10.0, gamma=1.0) == pytest.approx(10.0)


@pytest.mark.parametrize(("m", "gamma", "name"), [(0.0, 1.1, "mu_min"), (math.nan, 1.1, "mu_min"), (1.0, 0.9, "gamma")])
def test_mu_target_rejects(m, gamma, name):
    with pytest.raises(CapacityError, match=name):
        mu_target(m, gamma)
