"""Tests for onehead.py and dynamics.py: the one-head model's gradients, the three optimisers, the entry points.

Finite differences are centred (h = 1e-5) in float64 on a small batch, one weight entry at a time,
on the scalar loss. Relative error per weight = max|a - n| / max(max|a|, max|n|).
"""
import json

import dynamics as dy  # first: layers, imported by it, pins OpenBLAS to one thread before NumPy loads
import onehead as oh
import numpy as np
import pytest

H = 1e-5
GRAD_TOL = 1e-6
NAMES = ("W_Q", "W_K", "W_V", "W_O")


def rel_error(a, n):
    return float(np.abs(a - n).max() / max(np.abs(a).max(), np.abs(n).max(), 1e-300))


def small_problem(seed=0, B=2, T=9, std=0.5, dtype="float64"):
    """A batch of sticky chains and a head with weights large enough that attention is far from uniform."""
    x, targets = oh.sticky_data(seed, T=T, n=B)
    return x.astype(dtype), targets, oh.init_head(seed, std=std, dtype=dtype)


def centred_difference(loss, w):
    """dL/dw by centred differences, one entry of w at a time (changed in place, then restored)."""
    g = np.zeros_like(w)
    for idx in np.ndindex(w.shape):
        old = w[idx]
        w[idx] = old + H
        fp = loss()
        w[idx] = old - H
        fm = loss()
        w[idx] = old
        g[idx] = (fp - fm) / (2 * H)
    return g


def numerical_grads(params, x, targets):
    """dL/dW for every weight by centred differences of the reference loss."""
    loss = lambda: oh.head_loss(params, x, targets, fast=False)[0]
    return {name: centred_difference(loss, params[name]) for name in NAMES}


def assert_close(analytic, reference, tol, what):
    errors = {name: rel_error(analytic[name], reference[name]) for name in NAMES}
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= tol}
    assert not bad, f"{what}: relative error above {tol:g}: {bad}"
    return errors


# ----------------------------------------------------------------------------
# gradients

def test_reference_backward_matches_finite_differences():
    x, targets, params = small_problem()
    _, grads, _ = oh.head_loss_and_grads(params, x, targets, fast=False)
    assert_close(grads, numerical_grads(params, x, targets), GRAD_TOL, "head_backward_ref vs finite differences")


def test_reference_backward_at_the_papers_init():
    """At N(0, 0.1^2) the routing gradients are ~100x smaller than the value gradients: check them too."""
    x, targets, params = small_problem(seed=1, std=0.1)
    _, grads, _ = oh.head_loss_and_grads(params, x, targets, fast=False)
    assert_close(grads, numerical_grads(params, x, targets), GRAD_TOL, "head_backward_ref vs finite differences")


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-5)])
def test_fast_path_matches_reference(dtype, tol):
    x, targets, params = small_problem(seed=2, B=3, T=37, dtype=dtype)
    loss_ref, grads_ref, cache_ref = oh.head_loss_and_grads(params, x, targets, fast=False)
    loss, grads, cache = oh.head_loss_and_grads(params, x, targets, fast=True)
    assert abs(loss - loss_ref) <= tol * abs(loss_ref)
    assert rel_error(cache["alpha"], cache_ref["alpha"]) <= tol
    assert np.all(np.triu(cache["alpha"], k=1) == 0), "causal: no attention above the diagonal"
    np.testing.assert_allclose(cache["alpha"].sum(-1), 1.0, rtol=10 * tol)
    assert_close(grads, grads_ref, tol, f"fast path vs reference ({dtype})")


def test_cross_entropy_matches_bayesattn():
    rng = np.random.default_rng(3)
    logits, targets = rng.normal(size=(2, 5, 8)), rng.integers(0, 8, (2, 5))
    loss, dlogits = oh.cross_entropy(logits, targets)
    loss_ba, dlogits_ba = dy.ba.cross_entropy(logits, targets, np.ones(targets.shape))
    assert abs(loss - loss_ba) < 1e-12
    np.testing.assert_allclose(dlogits, dlogits_ba, atol=1e-14)


# ----------------------------------------------------------------------------
# optimisers

def test_em_like_changes_only_the_value_step():
    x, targets, params = small_problem(seed=4)
    _, grads, _ = oh.head_loss_and_grads(params, x, targets)
    sgd = {k: v.copy() for k, v in params.items()}
    em = {k: v.copy() for k, v in params.items()}
    oh.sgd_step(sgd, grads, 0.01)
    oh.em_like_step(em, grads, 0.01)
    for name in ("W_Q", "W_K", "W_O"):
        assert np.array_equal(sgd[name], em[name]), f"{name} differs between the SGD and EM-like steps"
    np.testing.assert_allclose(em["W_V"] - params["W_V"], 10.0 * (sgd["W_V"] - params["W_V"]), rtol=1e-9, atol=1e-15)
    assert not np.allclose(em["W_V"], sgd["W_V"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_m_step_never_increases_the_loss(seed):
    x, targets = oh.sticky_data(seed, T=48, n=3)
    params = oh.init_head(seed, std=0.3)
    loss0, _, _, cache = oh.head_loss(params, x, targets)
    H = oh._rows(cache["H"])
    W, losses = oh.m_step(H, targets.reshape(-1), params["W_V"] @ params["W_O"])
    assert all(b <= a for a, b in zip(losses, losses[1:])), f"Newton losses went up: {losses}"
    assert abs(losses[0] - loss0) < 1e-12
    after = dict(params, W_V=oh.refactor_values(W, params))
    np.testing.assert_allclose(after["W_V"] @ after["W_O"], W, atol=1e-10)    # the refactor is exact
    loss1 = oh.head_loss(after, x, targets)[0]
    assert loss1 <= loss0 + 1e-12, f"M-step raised the loss {loss0} -> {loss1}"
    assert loss1 < loss0 - 1e-3
    # the whole M-step arm's update (M-step, then the routing step) starts from the M-step's loss
    p = {k: v.copy() for k, v in params.items()}
    loss_m, _, g, _ = oh.m_step_update(p, dict(cache), targets, 0.01)
    assert abs(loss_m - loss1) < 1e-10 and set(g) == {"W_Q", "W_K"}
    assert np.array_equal(p["W_O"], params["W_O"])


def test_quick_run_lowers_its_loss(tmp_path):
    m = dy.run_sticky(steps=30, seed=0, T=128, out_dir=str(tmp_path))
    assert m["train_loss_final_bits"] < m["train_loss_first_bits"]
    for key in ("task", "model", "steps", "seconds", "loss_bits", "bayes_loss_bits", "excess_ce_bits", "kl_bits",
                "conditional_entropy_bound_bits", "bound_gap_bits"):
        assert key in m, key
    assert m["task"] == "sticky" and m["model"] == "one-head"
    assert m["kl_bits"] >= 0 and np.isfinite(m["loss_bits"])
    assert (tmp_path / "sticky_metrics.json").exists()


def test_compare_em_quick_writes_everything(tmp_path):
    dy.compare_em(out_dir=str(tmp_path), quick=True)
    for name in ("em_vs_sgd.png", "two_timescales.png", "dynamics.json", "curves.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    out = json.loads((tmp_path / "dynamics.json").read_text())
    for key in ("config", "long_chain", "short_sequences", "exact_bayes_reference", "sigma3_sgd",
                "two_timescales_one_head", "long_horizon_sgd", "transformer", "seconds_total"):
        assert key in out, key
    for setting in ("long_chain", "short_sequences"):
        s = out[setting]
        assert {"threshold_bits", "per_seed", "sgd", "em", "mstep"} <= set(s)
        for key in ("steps_to_threshold_mean", "steps_to_threshold_std", "speedup_steps", "speedup_seconds",
                    "paired_final_loss_vs_sgd", "paired_steps_vs_sgd"):
            assert key in s["em"], key
    tr = out["transformer"]
    assert np.array(tr["routing_norm"]).shape == np.array(tr["value_norm"]).shape


# ----------------------------------------------------------------------------
# the authors' chain and their deep variant

def test_authors_chain_is_the_effective_0_3498():
    P, _ = oh.sticky_task("authors")
    assert P[0, 0] == pytest.approx(0.349802, abs=1e-6) and oh.sticky_task("exact")[0][0, 0] == 0.3
    with pytest.raises(ValueError, match="chain='other': allowed are 'exact', 'authors'"):
        oh.sticky_task("other")


def test_deep_model_gradients_match_finite_differences():
    """The deep variant's model: input projection, then bayesattn's blocks; every tensor against centred
    differences in float64 (tiny sizes, weights loud enough that attention is far from uniform)."""
    cfg, params = dy.deep_init(0, 6, dtype="float64", d_model=8, n_layers=2, n_heads=2, d_mlp=16)
    rng = np.random.default_rng(1)
    for name in params:
        params[name] = params[name] + rng.normal(0, 0.3, params[name].shape)
    x, targets = oh.sticky_data(2, T=6, n=2)
    _, grads = dy.deep_loss_and_grads(params, x, targets, cfg)
    assert set(grads) == set(params)
    loss = lambda: dy.deep_loss_and_grads(params, x, targets, cfg)[0]
    worst = {}
    for name, w in params.items():
        num = centred_difference(loss, w)
        if name.endswith("attn.bk"):     # a shared shift of every key: rows of ds sum to zero, so exactly 0
            assert np.abs(grads[name]).max() < 1e-12 and np.abs(num).max() < 1e-8, name
            continue
        worst[name] = rel_error(grads[name], num)
    bad = {k: f"{v:.2e}" for k, v in worst.items() if not v <= 1e-6}
    assert not bad, f"deep model: relative error above 1e-6: {bad}"


def test_deep_model_is_causal_and_has_no_position():
    """What the deep model predicts at t depends on x_0..x_t only (it memorises a training chain, 0.0001 bits,
    through the inputs' noise, not by seeing ahead)."""
    cfg, params = dy.deep_init(0, 12, dtype="float64", d_model=8, n_layers=2, n_heads=2, d_mlp=16)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 12, dy.D_X))
    later = x.copy()
    later[:, 7:] += rng.standard_normal((1, 5, dy.D_X))             # change the inputs after t = 6
    a, b = dy.deep_forward(params, x, cfg)[0], dy.deep_forward(params, later, cfg)[0]
    np.testing.assert_array_equal(a[:, :7], b[:, :7])
    assert np.abs(a[:, 7:] - b[:, 7:]).max() > 1e-3
    first = dy.deep_forward(params, x[:, :1], cfg)[0]                # one input alone: attends to itself only
    alone = dy.deep_forward(params, x[:, 5:6], cfg)[0]
    np.testing.assert_allclose(first[0, 0], a[0, 0], atol=1e-12)
    assert np.abs(alone[0, 0] - a[0, 5]).max() > 1e-6                # at t = 5 the prefix matters


def test_deep_variant_trains_and_reports_against_exact_bayes():
    out = dy.deep_variant(seeds=(3,), steps=25, lr=3e-3, T=64, chain="authors")
    r = out["per_seed"][0]
    assert r["train_loss_bits"][-1] < r["train_loss_bits"][0]
    assert r["test_kl_bits"] > 0 and r["test_loss_bits"] > r["test_bayes_loss_bits"] - 0.2
    assert out["config"]["bound_bits"] == pytest.approx(2.639, abs=1e-3)     # the authors' chain


@pytest.mark.parametrize("args, expected", [
    (["--sticky", "--sigma", "nan"], "--sigma nan: must be a finite number > 0"),
    (["--sticky", "--sigma=-1"], "--sigma -1.0: must be a finite number > 0"),
    (["--sticky", "--sigma", "inf"], "--sigma inf: must be a finite number > 0"),
    (["--quick", "--steps", "0"], "--steps 0: must be a positive integer"),
    (["--compare-em", "--seed", "3"], "--seed and --sigma belong to --sticky"),
    (["--chain", "other"], "invalid choice: 'other'"),
])
def test_dynamics_cli_bad_input_gives_one_line(args, expected, tmp_path):
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, os.path.join(here, "dynamics.py"), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert os.listdir(tmp_path) == []                               # nothing written
