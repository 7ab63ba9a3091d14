"""The recall wind tunnel (tunnels/recall.py): its exact posterior against brute force over every random map, its
sampler, its prior's gap, its answer groups, and the paper metric's blind spot it exposes."""
import itertools
import math

import numpy as np
import pytest

import evaluation
from tunnels import recall
from tunnels import tasks


@pytest.mark.parametrize("layout", ["store", "pilot"])
def test_the_posterior_is_the_average_over_every_consistent_map(layout):
    """4 keys, 3 values: all 81 maps f. At each answer, the maps that agree with the pairs stored before it
    (all pairs at a query; those before the key in the pilot) give f(key)'s posterior by counting."""
    K, V = 4, 3
    s = dict(pairs=2, n_keys=K, n_values=V, filler=2, queries=2, p_unstored=0.5, layout=layout)
    b = recall.batch(np.random.default_rng(1), 40, **s)
    STORE, SEP, QUERY, FILL = recall.tokens_of(K, V)
    maps = np.array(list(itertools.product(range(V), repeat=K)))             # (81, K)
    checked = 0
    for row in range(40):
        tok = b["tokens"][row]
        for t in np.flatnonzero(b["mask"][row]):
            before = [(int(tok[i]), int(tok[i + 2]) - K) for i in range(1, min(t, 4 * s["pairs"]), 4)
                      if tok[i - 1] == STORE and i < t]
            ok = np.all([maps[:, k] == v for k, v in before], axis=0) if before else np.ones(len(maps), bool)
            key = int(tok[t])
            brute = np.bincount(maps[ok, key], minlength=V) / ok.sum()
            np.testing.assert_allclose(b["posterior"][row, t], brute, atol=1e-12)
            np.testing.assert_allclose(recall.posterior(*zip(*before), key, V) if before else np.full(V, 1 / V),
                                       brute, atol=1e-12)
            checked += 1
    assert checked == 40 * (2 + (2 if layout == "pilot" else 0))


def test_the_sampler_keeps_its_rules():
    """Stored keys distinct (store layout), queries never repeat, each asks an unstored key with probability
    1/2 (8,000 queries: within 4 standard errors), the filler before the queries spans 0..8, so the queries
    sit at different positions in different rows; the groups split the answers by their posterior."""
    s = tasks.settings("recall")
    n = 2000
    b = recall.sample(np.random.default_rng(0), n, s)
    K, P, Q = s["n_keys"], s["pairs"], s["queries"]
    keys = b["tokens"][:, 1:4 * P:4]
    assert all(len(set(r)) == P for r in keys)
    pos, valid = evaluation.answers(b)
    assert valid.all() and pos.shape == (n, Q)
    q = np.take_along_axis(b["tokens"], pos, 1)
    assert all(len(set(r)) == Q for r in q) and q.max() < K
    unstored = ~np.array([[k in set(keys[i]) for k in q[i]] for i in range(n)])
    assert abs(unstored.mean() - 0.5) < 4 * math.sqrt(0.25 / (n * Q))
    first = pos[:, 0] - 4 * P - 1                                          # the filler run before the queries
    assert set(first) == set(range(s["filler"] + 1))
    stored, other = b["groups"]["stored"] > 0, b["groups"]["not stored"] > 0
    assert np.array_equal(stored | other, b["mask"] > 0) and not np.any(stored & other)
    assert np.all(b["posterior"][stored].max(-1) == 1.0)
    np.testing.assert_allclose(b["posterior"][other], 1 / s["n_values"])
    assert np.array_equal(unstored, np.take_along_axis(other, pos, 1))
    assert b["tokens"].max() < tasks.sizes("recall", s)["vocab"]


@pytest.mark.parametrize("layout, gap", [("store", 2.5), ("pilot", None)])
def test_the_prior_gap_is_what_a_uniform_predictor_scores(layout, gap):
    """Store layout, 32 values, p = 1/2: exactly (1 - 1/2) log2 32 = 2.5 bits (log2 32 = 5 would be the
    mistake of forgetting the unstored half). The pilot: its number against a uniform predictor's paper
    metric on other sequences."""
    s = tasks.settings("recall", {"layout": layout})
    if gap is not None:
        assert tasks.prior_gap_bits("recall", s) == gap
    b = recall.sample(np.random.default_rng(7), 4000, s)
    uniform = lambda tok: np.full(tok.shape + (s["n_values"],), 1 / s["n_values"])
    m = evaluation.evaluate(uniform, b)[0]
    assert m["entropy_mae_bits"] == pytest.approx(tasks.prior_gap_bits("recall", s), abs=0.05)
    assert m["groups"]["not stored"]["kl_bits"] == pytest.approx(0.0, abs=1e-12)
    assert m["groups"]["stored"]["kl_bits"] == pytest.approx(5.0, abs=1e-12)


def test_the_paper_metric_cannot_see_a_model_that_is_half_sure_everywhere():
    """Two queries, 4 values: one stored (one-hot on 0, H = 0), one not (uniform, H = 2 bits). A model that
    answers (1/2, 1/2, 0, 0) to both has H = 1 bit at each: the paper metric averages H over the sequences
    first, |1 - (0 + 2) / 2| = 0; the per-sequence MAE is (|1 - 0| + |1 - 2|) / 2 = 1 bit; on the stored
    key its KL is 1 bit, and on the unstored one it has ruled out two values the posterior allows (KL
    enormous)."""
    post = np.array([[[1.0, 0, 0, 0]], [[0.25] * 4]])                    # (2 rows, 1 answer, 4 values)
    q = np.array([[[0.5, 0.5, 0, 0]], [[0.5, 0.5, 0, 0]]])
    one = np.ones((2, 1))
    b = dict(tokens=np.zeros((2, 1), int), targets=np.array([[0], [3]]), mask=one, posterior=post,
             groups={"stored": np.array([[1.0], [0.0]]), "not stored": np.array([[0.0], [1.0]])})
    m = evaluation.evaluate(lambda tok: q, b)[0]
    assert m["entropy_mae_bits"] == pytest.approx(0.0, abs=1e-12)
    assert m["entropy_mae_seq_bits"] == pytest.approx(1.0, abs=1e-12)
    assert m["groups"]["stored"]["kl_bits"] == pytest.approx(1.0, abs=1e-12)
    assert m["groups"]["stored"]["accuracy"] == 1.0
    assert m["groups"]["not stored"]["kl_bits"] > 100
    assert (m["groups"]["not stored"]["h_model_bits"], m["groups"]["not stored"]["h_bayes_bits"]) == (1.0, 2.0)


@pytest.mark.parametrize("argv, message", [
    (["--pairs", "20"], "--keys 32: the key alphabet must hold at least twice the pairs (20)"),
    (["--keys", "12"], "--keys 12: the key alphabet must hold at least twice the pairs (8)"),
    (["--pairs", "0"], "--pairs 0: recall needs at least 1 stored pair"),
    (["--queries", "9"], "--queries 9: 9 queries without repeats need at least as many stored pairs (8)"),
    (["--queries", "9", "--layout", "pilot", "--keys", "16"],
     "--queries 9: 9 queries without repeats need as many unstored keys (8)"),
    (["--layout", "random"], "--layout 'random': allowed are store, pilot"),
    (["--values", "1"], "--values 1: recall needs at least 2 values"),
    (["--unstored", "1.5"], "--unstored 1.5: a probability must lie in [0, 1]")])
def test_bad_settings_get_one_line(argv, message, capsys):
    import train
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--task", "recall", *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("train.py: error: " + message), err
    assert len(err.splitlines()) == 1


def test_a_pair_curriculum_stores_fewer_pairs_first_at_the_same_length():
    """--recall-curriculum 2:100: before step 100 two pairs are stored (their places filler, T unchanged), the
    posterior still exact (a query is one-hot exactly when its key is among the two); from step 100 and on
    held-out sets (no step), the task itself."""
    s = tasks.settings("recall", {"pair_curriculum": "2:100"})
    STORE = recall.tokens_of(s["n_keys"], s["n_values"])[0]
    early, late, held = (recall.sample(np.random.default_rng(0), 50, s, step) for step in (99, 100, None))
    assert early["tokens"].shape == late["tokens"].shape == (50, tasks.sizes("recall", s)["max_len"])
    assert np.all((early["tokens"] == STORE).sum(1) == 2) and np.all((late["tokens"] == STORE).sum(1) == 8)
    assert np.all((held["tokens"] == STORE).sum(1) == 8)
    for row in range(50):
        tok = early["tokens"][row]
        stored = dict(zip(tok[1:8:4], tok[3:8:4] - s["n_keys"]))
        for t in np.flatnonzero(early["mask"][row]):
            one_hot = early["posterior"][row, t].max() == 1.0
            assert one_hot == (tok[t] in stored)
            if one_hot:
                assert early["posterior"][row, t].argmax() == stored[tok[t]]
    import train
    with pytest.raises(SystemExit):
        train.parse_args(["--task", "recall", "--recall-curriculum", "9:100"])      # more pairs than stored


def test_a_fixed_filler_puts_every_query_at_one_distance():
    """--filler-fixed: the run before the queries is always the longest (8), nothing else drawn differs (the
    same keys, values and queries as the drawn filler's batch, each shifted to its place)."""
    s = tasks.settings("recall")
    drawn = recall.sample(np.random.default_rng(1), 300, s)
    fixed = recall.sample(np.random.default_rng(1), 300, dict(s, filler_fixed=True))
    P = s["pairs"]
    pos, valid = evaluation.answers(fixed)
    assert valid.all() and set(pos[:, 0] - 4 * P - 1) == {s["filler"]}
    assert np.array_equal(fixed["tokens"][:, :4 * P], drawn["tokens"][:, :4 * P])
    pos_d, _ = evaluation.answers(drawn)
    assert np.array_equal(np.take_along_axis(fixed["tokens"], pos, 1), np.take_along_axis(drawn["tokens"], pos_d, 1))
