"""chainsteps: the geometric claim's statistics on cases computed by hand, every branch of its rule, and one
end-to-end measurement on tiny untrained checkpoints."""
import os

import numpy as np
import pytest

import chainsteps as cs
import hops
import measures as ms
import models
import tasks
from checkpoints import save_checkpoint


def test_chain_steps_are_distances_between_consecutive_hops():
    # two rows: h = 3 (steps at hops 2 and 3), h = 1 (none); row 0's hops predicted at 1, 2, 3
    X = np.zeros((2, 5, 2))
    X[0, 1], X[0, 2], X[0, 3] = [0, 0], [3, 4], [3, 5]
    steps, b, j = cs.chain_steps(X, np.array([1, 1]), np.array([3, 1]))
    np.testing.assert_allclose(steps, [5.0, 1.0])
    assert b.tolist() == [0, 0] and j.tolist() == [2, 3]


def test_scale_is_the_median_distance_between_neighbouring_sequences_answers():
    # three sequences, answers at position 0 (and 1 in the first two): distances 1, 2 (rows 0-1) and 10
    # (rows 1-2, answer index 0 only): median 2 (the mean, 13/3, and the RMS would differ)
    X = np.zeros((3, 2, 1))
    X[0, 0], X[1, 0], X[2, 0] = 0.0, 1.0, 11.0
    X[0, 1], X[1, 1] = 5.0, 7.0
    rows = np.array([[1, 1], [1, 1], [1, 0]], bool)
    assert cs.scale(X, rows) == 2.0


def test_confident_share_counts_only_one_hot_answers():
    post = np.array([[1, 0, 0], [1, 0, 0], [0.5, 0.5, 0], [0, 0, 1]], float)
    q = np.array([[0.6, 0.2, 0.2], [0.4, 0.3, 0.3], [0.9, 0.1, 0], [0.5, 0.25, 0.25]])
    # one-hot rows 0, 1, 3: confident (> 0.5) only row 0 (row 3 exactly 0.5 is not): 1/3; counting
    # every row would give 2/4
    assert cs.confident_share(q, post) == pytest.approx(1 / 3)
    assert cs.confident_share(q[2:3], post[2:3]) is None


def test_shuffled_chains_take_the_next_rows_hops():
    tokens = np.array([[9, 1, 2, 3], [9, 4, 5, 6], [9, 7, 8, 0]])
    out = cs.shuffled(tokens, np.array([0, 0, 0]), np.array([3, 2, 3]))
    # row 0 takes row 1's one written hop (h = 2 there), row 1 its one from row 2, row 2 both from row 0
    assert out.tolist() == [[9, 4, 2, 3], [9, 7, 5, 6], [9, 1, 2, 0]]


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


def stats(step=0.3, jump=0.9, shuffled=0.9, inits=(0.95, 1.0, 1.05), cot_conf=0.95, direct_conf=0.2):
    return dict(cot=dict(step_ratio=step, shuffled_step_ratio=shuffled, random_init_step_ratios=list(inits),
                         confident=cot_conf), direct=dict(jump_ratio=jump, confident=direct_conf))


def test_the_margin_is_the_larger_of_its_floor_and_twice_the_random_inits_sd():
    assert cs.margin(stats(inits=(1.0, 1.0, 1.0))) == cs.MARGIN
    assert cs.margin(stats(inits=(0.8, 1.0, 1.2))) == pytest.approx(0.4)      # sd 0.2


def test_judge_seed_every_branch():
    assert cs.judge_seed(stats()) == (True, True)
    assert cs.judge_seed(stats(step=0.86)) == (False, True)          # within the margin of the jump (0.9)
    assert cs.judge_seed(stats(step=0.5, shuffled=0.52)) == (False, True)   # no shorter than shuffled chains
    assert cs.judge_seed(stats(step=0.5, inits=(0.2, 1.0, 1.8))) == (False, True)   # margin 2 x 0.8
    assert cs.judge_seed(stats(cot_conf=0.85)) == (True, False)      # below CONFIDENT_SHARE
    assert cs.judge_seed(stats(direct_conf=0.8)) == (True, False)    # the direct model as confident
    assert cs.judge_seed(stats(cot_conf=None)) == (True, False)


def test_verdict_every_branch():
    good, long_, doubtful = stats(), stats(step=0.95), stats(cot_conf=0.5)
    assert cs.verdict([good, good])[0] == cs.SUPPORTED
    assert cs.verdict([long_, doubtful])[0] == cs.NOT_SUPPORTED
    assert cs.verdict([good, long_]) == (cs.UNDECIDED, "the seeds disagree")
    assert cs.verdict([good])[0] == cs.UNDECIDED
    assert cs.verdict([good, good], runs_out=False)[0] == cs.UNDECIDED


def test_a_direct_run_runs_out_when_some_h_past_one_is_unsolved():
    def metrics(kl2):               # 8 classes, exact entropy 1 bit: KL(uniform) 2 bits; h = 2 scores 1 - kl2 / 2
        g = lambda kl: dict(kl_bits=kl, h_bayes_bits=1.0)
        return dict(config=dict(n_classes=8), groups={"h=1": g(0.01), "h=2": g(kl2)})
    assert cs.direct_runs_out(metrics(0.2)) and not cs.direct_runs_out(metrics(0.08))   # scores 0.90, 0.96


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
    out = cs.measure(*paths, n=40)
    c, d = out["cot"], out["direct"]
    assert 0 < c["step_ratio"] < 10 and c["steps"] > 0 and len(c["random_init_step_ratios"]) == 3
    assert d["jumps"] > 0 and d["jump_ratio"] > 0          # only the h >= 2 rows, each moved by its hop token
    assert 0 <= c["confident"] <= 1
    with pytest.raises(ValueError, match="direct and a chain-of-thought"):
        cs.measure(paths[1], paths[0], n=8)


def test_the_direct_and_chain_batches_share_their_sequences():
    # measure compares the two formats on the same sequences: one generator draws the same pairs, x and h
    from manifold import probe_batch
    s = {**hops.SETTINGS, "n_symbols": 6, "hidden": 1, "max_hops": 3}
    cfg = models.make_config("transformer", vocab_size=20, n_classes=6, max_len=20)
    d, c = probe_batch("hops", cfg, 30, 0, {**s, "cot": False}), probe_batch("hops", cfg, 30, 0, {**s, "cot": True})
    assert (d["tokens"] == c["tokens"][:, :d["tokens"].shape[1]]).all()
    np.testing.assert_array_equal(d["final_target"], c["final_target"])
