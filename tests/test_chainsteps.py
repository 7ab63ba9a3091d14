"""chainsteps: the geometric claim's statistics on cases computed by hand, every branch of its rule, and one
end-to-end measurement on tiny untrained checkpoints."""
import os

import numpy as np
import pytest

from primitives import chainsteps as cs
from tunnels import hops
from geometry import measures as ms
import models
from tunnels import tasks
from harness.checkpoints import save_checkpoint


def test_chain_steps_are_distances_between_consecutive_hops():
    # two rows: h = 3 (steps at hops 2 and 3), h = 1 (none); row 0's hops predicted at 1, 2, 3
    X = np.zeros((2, 5, 2))
    X[0, 1], X[0, 2], X[0, 3] = [0, 0], [3, 4], [3, 5]
    steps, b, j = cs.chain_steps(X, np.array([1, 1]), np.array([3, 1]))
    np.testing.assert_allclose(steps, [5.0, 1.0])
    assert b.tolist() == [0, 0] and j.tolist() == [2, 3]
    steps, _, j = cs.chain_steps(X, np.array([1, 1]), np.array([3, 1]), j_min=3)
    np.testing.assert_allclose(steps, [1.0])
    assert j.tolist() == [3]


def test_scale_is_the_median_distance_between_confident_answers_of_different_symbols():
    # three sequences, two answers each (positions 1 and 2), pairs (0, 1) and (1, 2) by answer index:
    #   rows 0-1 index 0: confident, symbols 0 and 1: distance 1;  index 1: confident, the same symbol: left out
    #   rows 1-2 index 0: confident, symbols 1 and 2: distance 10; index 1: row 2 unsure (0.5): left out
    # the median of {1, 10} is 5.5 (keeping the same-symbol pair would give 2, the unsure one 10)
    X, q = np.zeros((3, 3, 1)), np.full((3, 3, 3), 1 / 3)
    conf = lambda c: np.eye(3)[c] * 0.8 + 0.2 / 3
    X[0, 1], X[1, 1], X[2, 1] = 0.0, 1.0, 11.0
    X[0, 2], X[1, 2], X[2, 2] = 4.0, 6.0, 30.0
    q[0, 1], q[1, 1], q[2, 1] = conf(0), conf(1), conf(2)
    q[0, 2], q[1, 2], q[2, 2] = conf(1), conf(1), [0.5, 0.25, 0.25]
    rows = np.array([[0, 1, 1]] * 3, bool)
    assert cs.scale(X, q, rows) == 5.5
    q[:, :, :] = 1 / 3
    assert cs.scale(X, q, rows) is None          # no confident pair


def test_the_baseline_pairs_neighbouring_positions_of_unrelated_sequences():
    # rows 0, 1 with h = 3 and 2, first = 0: row 0's j = 2, 3 against row 1's hop 1, 2 (positions 0, 1);
    # row 1's j = 2 has no row after it
    X = np.zeros((2, 4, 1))
    X[0, :, 0] = [0, 10, 20, 0]
    X[1, :, 0] = [3, 5, 0, 0]
    d, b = cs.baseline_pairs(X, np.array([0, 0]), np.array([3, 2]))
    np.testing.assert_allclose(d, [7.0, 15.0])          # |10 - 3|, |20 - 5|
    assert b.tolist() == [0, 0]


def test_a_paired_bootstrap_sd_is_zero_for_a_constant_difference_and_grows_with_noise():
    n = 50
    seq = np.arange(n)
    a = np.linspace(0, 1, n)
    assert cs.diff_sd(a, seq, a - 0.3, seq, n) == pytest.approx(0.0, abs=1e-12)    # paired: the shift cancels
    noisy = cs.diff_sd(a, seq, np.random.default_rng(1).normal(size=n), seq, n)
    assert 0.05 < noisy < 1.0


def test_the_readout_predicts_each_fold_and_its_twins_from_the_other_folds():
    # H = 2 x[0] exactly (entropies of posteriors over 4 symbols: 0, 1 or 2 bits), 10 sequences, one answer each
    n = 10
    x = np.array([0, 0.5, 1, 0, 0.5, 1, 0, 0.5, 1, 0.5])
    post = np.zeros((n, 1, 4))
    for i, v in enumerate(x):
        k = int(2 ** (2 * v))
        post[i, 0, :k] = 1 / k
    X = np.c_[x, np.zeros(n)][:, None, :]
    twins = np.c_[1 - x, np.zeros(n)]
    pred, tw, r2 = cs.readout(X, np.ones((n, 1), bool), post, twins)
    np.testing.assert_allclose(pred[:, 0], 2 * x, atol=1e-2)      # a line, learned from the other folds
    np.testing.assert_allclose(tw, 2 * (1 - x), atol=1e-2)
    assert r2 == pytest.approx(1.0, abs=1e-3)


def test_confident_share_counts_only_one_hot_answers():
    post = np.array([[1, 0, 0], [1, 0, 0], [0.5, 0.5, 0], [0, 0, 1]], float)
    q = np.array([[0.6, 0.2, 0.2], [0.4, 0.3, 0.3], [0.9, 0.1, 0], [0.5, 0.25, 0.25]])
    # one-hot rows 0, 1, 3: confident (> 0.5) only row 0 (row 3 exactly 0.5 is not): 1/3; counting
    # every row would give 2/4
    assert cs.confident_share(q, post) == pytest.approx(1 / 3)
    assert cs.confident_share(q[2:3], post[2:3]) is None


def test_shuffled_chains_take_every_written_hop_from_a_donor_with_as_many_hops():
    tokens = np.array([[9, 1, 2, 3], [9, 4, 5, 6], [9, 7, 8, 0]])
    h = np.array([3, 2, 3])
    assert cs.donors(h).tolist() == [2, 2, 0]       # row 1 (h = 2) cannot give row 0 two hops; row 2 can
    out = cs.shuffled(tokens, np.array([0, 0, 0]), h)
    assert out.tolist() == [[9, 7, 8, 3], [9, 7, 5, 6], [9, 1, 2, 0]]
    assert cs.donors(np.array([2, 1])).tolist() == [0, 0]    # no other row has as many: itself


def test_one_hop_query_changes_only_the_hop_token():
    s = {**hops.SETTINGS, "n_symbols": 5, "hidden": 1, "max_hops": 3}
    b = hops.sample(np.random.default_rng(0), 8, s)
    t = cs.one_hop_query(b["tokens"], s)
    H1 = hops.tokens_of(5, 3)[0]
    assert (t[:, 11] == H1).all() and (b["tokens"][:, 11] != H1).any()
    assert (np.delete(t, 11, axis=1) == np.delete(b["tokens"], 11, axis=1)).all()


def test_cv_predictions_agree_with_the_fold_sse_and_a_direct_fit():
    r = np.random.default_rng(0)
    X, g = r.normal(size=(60, 3)), np.arange(60) // 3
    y = 2 * X[:, 0] - X[:, 2] + 0.1 * r.normal(size=60)
    pred, fold = ms.cv_predictions(X, y, g)
    sse, _ = ms.cv_fold_sse(X, y, g)
    np.testing.assert_allclose([((y - pred)[fold == f] ** 2).sum() for f in range(5)], sse)
    # a fit on two exact points (no ridge to speak of) predicts the line through them
    f = ms.ridge_fit(np.array([[0.0], [2.0]]), np.array([1.0, 5.0]), ridge=0.0)
    np.testing.assert_allclose(f(np.array([[1.0], [3.0]])), [3.0, 7.0])


def stats(step=0.3, jump=0.9, base=0.9, j3=None, shuffled=0.9, cot_conf=0.95, direct_conf=0.2, margins=(0.05, 0.05, 0.05)):
    c = dict(step_ratio=step, baseline_ratio=base, confident=cot_conf, margin_jump=margins[0],
             margin_baseline=margins[1])
    if shuffled is not None:
        c.update(step_ratio_j3=step if j3 is None else j3, shuffled_ratio_j3=shuffled, margin_shuffled=margins[2])
    return dict(cot=c, direct=dict(jump_ratio=jump, confident=direct_conf))


def test_judge_seed_every_branch():
    assert cs.judge_seed(stats()) == (True, True)
    assert cs.judge_seed(stats(step=0.86)) == (False, True)              # within the floor margin of 0.9
    assert cs.judge_seed(stats(step=0.8, margins=(0.2, 0.05, 0.05))) == (False, True)   # a bootstrap margin
    assert cs.judge_seed(stats(step=0.5, base=0.52)) == (False, True)    # no shorter than unrelated pairs
    assert cs.judge_seed(stats(j3=0.6, shuffled=0.62)) == (False, True)  # no shorter than shuffled chains
    assert cs.judge_seed(stats(shuffled=None)) == (True, True)           # no chain of three hops: not applied
    assert cs.judge_seed(stats(jump=None)) == (False, True)              # no scale: not short
    assert cs.judge_seed(stats(cot_conf=0.85)) == (True, False)          # below CONFIDENT_SHARE
    assert cs.judge_seed(stats(cot_conf=0.9, direct_conf=0.7)) == (True, True)   # at the share and the gap
    assert cs.judge_seed(stats(direct_conf=0.8)) == (True, False)        # the direct model as confident
    assert cs.judge_seed(stats(cot_conf=None)) == (True, False)
    assert cs.judge_seed(stats(direct_conf=None)) == (True, False)


def test_verdict_every_branch():
    good, long_, doubtful = stats(), stats(step=0.95), stats(cot_conf=0.5)
    assert cs.verdict([good, good])[0] == cs.SUPPORTED
    assert cs.verdict([long_, doubtful])[0] == cs.NOT_SUPPORTED
    assert cs.verdict([good, long_]) == (cs.UNDECIDED, "the seeds disagree")
    assert cs.verdict([good])[0] == cs.UNDECIDED
    assert cs.verdict([good, good], runs_out=False)[0] == cs.UNDECIDED


def test_a_direct_run_fails_the_h_whose_score_is_below_good():
    def metrics(kl2):               # 8 classes, exact entropy 1 bit: KL(uniform) 2 bits; h = 2 scores 1 - kl2 / 2
        g = lambda kl: dict(kl_bits=kl, h_bayes_bits=1.0)
        return dict(config=dict(n_classes=8), groups={"h=1": g(1.5), "h=2": g(kl2)})   # h = 1 failed: not counted
    assert cs.direct_fails(metrics(0.2)) == [2] and cs.direct_fails(metrics(0.08)) == []   # scores 0.90, 0.96


def test_measure_on_tiny_untrained_checkpoints(tmp_path):
    s = {**hops.SETTINGS, "n_symbols": 6, "hidden": 1, "max_hops": 3}
    paths = []
    for cot in (False, True):
        st = {**s, "cot": cot}
        z = tasks.sizes("hops", st)
        cfg = models.make_config("transformer", vocab_size=z["vocab"], n_classes=z["classes"], max_len=z["max_len"],
                                 d_model=16, n_layers=1, n_heads=2)
        path = os.path.join(tmp_path, f"{'cot' if cot else 'direct'}.npz")
        save_checkpoint(path, models.init_params("transformer", cfg, 0), cfg, dict(model="transformer", task="hops", **st))
        paths.append(path)
    out = cs.measure(*paths, [2, 3], n=40)
    c, d = out["cot"], out["direct"]
    assert c["steps"] > 0 and c["steps_j3"] > 0 and len(c["random_init_step_ratios"]) == 3
    assert d["jumps"] > 0 and set(d["jump_ratio_by_h"]) == {2, 3}   # only the failed h, each moved by its hop token
    with pytest.raises(ValueError, match="direct and a chain-of-thought"):
        cs.measure(paths[1], paths[0], [2], n=8)
    st = {**s, "cot": False, "max_hops": 2}                  # another max_hops: not the same sequences
    z = tasks.sizes("hops", st)
    cfg = models.make_config("transformer", vocab_size=z["vocab"], n_classes=z["classes"], max_len=z["max_len"],
                             d_model=16, n_layers=1, n_heads=2)
    other = os.path.join(tmp_path, "other.npz")
    save_checkpoint(other, models.init_params("transformer", cfg, 0), cfg, dict(model="transformer", task="hops", **st))
    with pytest.raises(ValueError, match="differ in max_hops"):
        cs.measure(other, paths[1], [2], n=8)


def test_the_direct_and_chain_batches_share_their_sequences():
    # measure compares the two formats on the same sequences: one generator draws the same pairs, x and h
    from manifold import probe_batch
    s = {**hops.SETTINGS, "n_symbols": 6, "hidden": 1, "max_hops": 3}
    cfg = models.make_config("transformer", vocab_size=20, n_classes=6, max_len=20)
    d, c = probe_batch("hops", cfg, 30, 0, {**s, "cot": False}), probe_batch("hops", cfg, 30, 0, {**s, "cot": True})
    assert (d["tokens"] == c["tokens"][:, :d["tokens"].shape[1]]).all()
    np.testing.assert_array_equal(d["final_target"], c["final_target"])
