"""Running a chain of thought free: exact free-running distributions, sampling and greedy decoding, on oracles
whose answers are known by hand."""
import os

import numpy as np
import pytest

from primitives import cot
from tunnels import hops

pytestmark = pytest.mark.plain_python


def oracle(V, H, m):
    """A model calibrated at every hop: at hop j, the exact posterior given the context and the hops written
    before it in the tokens (whatever wrote them). -> predict(tokens) (L, T, V)."""
    H1, Q, _, UNSEEN = hops.tokens_of(V, H)
    P = 2 * V

    def predict(tokens):
        L, T = tokens.shape
        f_shown = np.full((L, V + 1), -1)                                # a last column for the hidden ones
        values = tokens[:, 1:P:2]
        np.put_along_axis(f_shown, np.where(values == UNSEEN, V, tokens[:, 0:P:2]), values - V, axis=1)
        f_shown = f_shown[:, :V]
        h, x = tokens[:, P + 1] - H1 + 1, tokens[:, P + 2]
        chain = np.zeros((L, H + 1), dtype=np.int64)
        chain[:, 0] = x
        for j in range(1, H):
            chain[:, j] = np.where(h > j, tokens[:, min(P + 2 + j, T - 1)], 0)
        _, post = hops.hop_posteriors(f_shown, x, H, np.where(chain < V, chain, 0))
        q = np.full((L, T, V), 1.0 / V)
        q[:, P + 2:P + 2 + H] = post[:, :T - P - 2]
        return q
    return predict


def hand_batch():
    """V = 4, shown 0 -> 1 and 1 -> 2, hidden 2 -> ? and 3 -> ? (hidden values 0, 3), x = 0, h = 4, the true f
    sending 2 -> 3 -> 0. Exact final posterior (1/2 on 0, 1/2 on 1), tests/test_hops.py."""
    V, H = 4, 4
    H1, Q, FILL, UNSEEN = hops.tokens_of(V, H)
    tokens = np.array([[2, UNSEEN, 0, 4 + 1, 3, UNSEEN, 1, 4 + 2, Q, H1 + 3, 0, 1, 2, 3, FILL]])
    mask = np.zeros((1, 15))
    mask[0, 10:14] = 1
    return dict(tokens=tokens, mask=mask, posterior=np.zeros((1, 15, V)), targets=np.zeros((1, 15), dtype=int),
                final_posterior=np.array([[.5, .5, 0, 0]]), final_target=np.array([0]))


def test_the_hand_case_free_is_exact_and_greedy_is_one_bit_off():
    """Free: hop 3 is 0 or 3 (1/2 each), then f(0) = 1 or f(3) = 0: (1/2, 1/2, 0, 0), KL 0. Greedy writes the
    argmax 0 at hop 3 (a tie: the first), then is certain of 1: its KL is unbounded (the posterior's half on 0
    gets no mass; clipped, about 511 bits), yet it does not count as hallucinated (the posterior gives 1 a
    half, not under 5%)."""
    b, layout = hand_batch(), (np.array([10]), np.array([4]))
    predict = oracle(4, 4, 2)
    p_free, dropped = cot.free_run(predict, b, layout, prune=1e-12)
    np.testing.assert_allclose(p_free, [[.5, .5, 0, 0]], atol=1e-12)
    assert dropped[0] == pytest.approx(0.0, abs=1e-12)
    g = cot.greedy_run(predict, b, layout)
    np.testing.assert_allclose(g, [[0, 1, 0, 0]], atol=1e-12)
    r = cot.report(predict, b, layout, prune=1e-12)
    assert r["free"]["kl_bits"] == pytest.approx(0.0, abs=1e-9)
    assert r["greedy"]["kl_bits"] > 100 and r["greedy"]["groups"]["h=4"]["hallucinated"] == 0.0


def test_pruning_drops_the_chains_below_it_and_says_how_much():
    """A model uniform over K = 4 at every hop, h = 3: the 16 chains of two hops weigh 1/16 each. Prune 0.1
    keeps the four first hops (1/4) and drops all 16 (1/16 < 0.1): p_free 0, dropped 1; prune 0.05 keeps them
    all: p_free uniform, dropped 0."""
    b = hand_batch()
    layout = (np.array([10]), np.array([3]))
    uniform = lambda tokens: np.full(tokens.shape + (4,), 0.25)
    p, d = cot.free_run(uniform, b, layout, prune=0.1)
    assert np.all(p == 0) and d[0] == pytest.approx(1.0)
    p, d = cot.free_run(uniform, b, layout, prune=0.05)
    np.testing.assert_allclose(p, [[.25] * 4])
    assert d[0] == pytest.approx(0.0)
    # a beam of 2: two first hops kept (dropped 1/2), two of their eight children (dropped 6/16): the two
    # chains left end with 1/16 each, spread evenly, p_free 1/8 in all, dropped 7/8
    p, d = cot.free_run(uniform, b, layout, prune=1e-12, beam=2)
    assert p.sum() == pytest.approx(0.125) and d[0] == pytest.approx(0.875)
    # what the dropped mass leaves open: with all of it dropped no answer is hallucinated in what is kept,
    # but all of it could sit on an answer the posterior (1/2, 1/2, 0, 0) rules out: the upper bound is 1
    g = cot.report(uniform, b, layout, prune=0.1)["free"]["groups"]["h=3"]
    assert (g["hallucinated"], g["hallucinated_upper"]) == (0.0, 1.0)


def test_a_model_calibrated_at_every_hop_runs_free_to_the_exact_posterior():
    """The chain rule on held-out sequences: an oracle's p_free is final_posterior, and its sampled answers'
    frequencies are within five standard errors of it."""
    s = dict(n_symbols=6, hidden=3, max_hops=4, cot=True)
    b = hops.batch(np.random.default_rng(0), 40, **s)
    layout = hops.chain_layout(b, s)
    predict = oracle(6, 4, 3)
    p_free, dropped = cot.free_run(predict, b, layout, prune=1e-9)
    np.testing.assert_allclose(p_free, b["final_posterior"], atol=1e-9)
    assert dropped.max() < 1e-9 and b["final_posterior"].max(-1).min() < 1      # some answers are uncertain
    S = 400
    freq = cot.sample_run(predict, b, layout, np.random.default_rng(1), S)
    se = np.sqrt(p_free * (1 - p_free) / S) + 1e-12
    assert np.all(np.abs(freq - p_free) <= 5 * se + 1e-12)
    assert hops.chain_layout(hops.batch(np.random.default_rng(0), 4, **{**s, "cot": False}), {**s, "cot": False}) is None


def test_the_companion_figures_sequences_are_uncertain_ones_first(tmp_path):
    """An oracle on held-out sequences: the examples start with the rows whose final posterior is uncertain,
    the oracle's free run matches each one, and the figure is written."""
    from harness import plots
    s = dict(n_symbols=6, hidden=3, max_hops=4, cot=True)
    b = hops.batch(np.random.default_rng(0), 40, **s)
    ex = cot.examples(oracle(6, 4, 3), b, hops.chain_layout(b, s), k=4, prune=1e-9)
    uncertain = np.flatnonzero(b["final_posterior"].max(-1) < 1)
    assert list(ex["rows"]) == list(uncertain[:4]) and np.all(ex["posterior"].max(-1) < 1)
    np.testing.assert_allclose(ex["p_free"], ex["posterior"], atol=1e-9)
    path = plots.plot_free(ex, "hops", str(tmp_path / "free.png"))
    assert os.path.getsize(path) > 0
