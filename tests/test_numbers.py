"""Every reported number against a hand-computed, nonzero answer, on cases where the plausible mistakes
(a swapped KL, another average, nats for bits, a flipped sign) give different answers."""

import math

import numpy as np
import pytest

import bayesattn as ba
from tunnels import bijection
import evaluation
import models
import optim
from tunnels import windtunnels as wt
from evaluation import calibration, evaluate

LOG2_10 = math.log2(10)


def two_sequences():
    """One supervised position, 4 classes, two sequences whose posterior entropies differ:
        sequence A: posterior (1/2, 1/2, 0, 0), H = 1;  model (1/4, 1/4, 1/4, 1/4), H = 2
        sequence B: posterior (1/4, 1/4, 1/4, 1/4), H = 2;  model (.4, .4, .1, .1), H = 0.8 log2 2.5 + 0.2 log2 10
    targets: A class 0, B class 2."""
    post = np.array([[[0.5, 0.5, 0, 0]], [[0.25] * 4]])                       # (2, 1, 4)
    q = np.array([[[0.25] * 4], [[0.4, 0.4, 0.1, 0.1]]])
    batch = dict(tokens=np.zeros((2, 1), dtype=int), targets=np.array([[0], [2]]), mask=np.ones((2, 1)),
                 posterior=post)
    return batch, q


H_B_MODEL = 0.8 * math.log2(2.5) + 0.2 * LOG2_10                             # 1.7219 bits


def test_paper_metric_per_sequence_mae_and_kl_by_hand():
    batch, q = two_sequences()
    m, _ = evaluate(lambda tok: q, batch)
    # the paper's metric averages over sequences first: |mean(2, 1.7219) - mean(1, 2)| = 0.3610
    assert m["entropy_mae_bits"] == pytest.approx(abs((2 + H_B_MODEL) / 2 - 1.5), abs=1e-12)
    assert m["entropy_mae_bits"] == pytest.approx(0.36096, abs=1e-5)
    # per sequence first: (|2 - 1| + |1.7219 - 2|) / 2 = 0.6390, a different number
    assert m["entropy_mae_seq_bits"] == pytest.approx((1 + (2 - H_B_MODEL)) / 2, abs=1e-12)
    assert m["entropy_mae_seq_bits"] == pytest.approx(0.63904, abs=1e-5)
    # KL(posterior || model): A = 2 * 1/2 log2(2) = 1; B = 1/4 (2 log2 .625 + 2 log2 2.5) = 0.3219; mean 0.6610.
    # The swapped KL(model || posterior) is infinite on A (the model puts mass where the posterior has none).
    kl_b = 0.5 * (math.log2(0.625) + math.log2(2.5))
    assert m["kl_bits"] == pytest.approx((1 + kl_b) / 2, abs=1e-12)
    assert m["kl_bits"] == pytest.approx(0.66096, abs=1e-5)
    # excess CE: model -log2 q(target) = 2 (A), log2 10 (B); posterior 1 (A), 2 (B); mean difference 1.1610
    assert m["excess_ce_bits"] == pytest.approx((2 + LOG2_10) / 2 - 1.5, abs=1e-12)
    # mass on ruled-out answers: A has 1/4 + 1/4 on classes 2, 3; B rules out nothing
    assert m["impossible_mass"] == pytest.approx(0.25, abs=1e-12)


def test_reported_kl_is_posterior_against_model_in_bits():
    """One answer, posterior p = (1/2, 1/2) and model q = (0.9, 0.1), where the plausible mistakes all give
    other numbers:  KL(p || q) = 1/2 log2(0.5 / 0.9) + 1/2 log2(0.5 / 0.1) = 0.736966 bits (the one to report);
    in nats 0.510826; the swapped KL(q || p) = 0.9 log2 1.8 + 0.1 log2 0.2 = 0.531004 bits (0.368064 nats)."""
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    batch = dict(tokens=np.zeros((1, 1), dtype=int), targets=np.array([[0]]), mask=np.ones((1, 1)),
                 posterior=p[None, None])                                       # (1, 1, 2)
    m, _ = evaluate(lambda tok: q[None, None], batch)
    kl_bits = 0.5 * math.log2(0.5 / 0.9) + 0.5 * math.log2(0.5 / 0.1)
    assert m["kl_bits"] == pytest.approx(kl_bits, abs=1e-12)
    assert m["kl_bits"] == pytest.approx(0.736966, abs=1e-6)                   # not 0.510826, 0.531004, 0.368064
    assert m["per_position"][0]["kl"] == pytest.approx(0.736966, abs=1e-6)
    assert calibration(q[None, None], p[None, None])[0]["kl_bits"] == pytest.approx(0.736966, abs=1e-6)


def test_calibration_is_the_same_metric_for_the_probes():
    import manifold as mf
    batch, q = two_sequences()
    c, h_model, h_bayes = calibration(q, batch["posterior"])
    assert c["entropy_mae_bits"] == pytest.approx(0.36096, abs=1e-5) and c["kl_bits"] == pytest.approx(0.66096, abs=1e-5)
    np.testing.assert_allclose(h_bayes[:, 0], [1, 2])
    np.testing.assert_allclose(h_model[:, 0], [2, H_B_MODEL])
    # the geometry probes (logit lens, ablations, frame-precision) report the paper's metric too, not the
    # per-sequence MAE (0.63904)
    probe = mf.calibration(q, batch["posterior"])
    assert probe["entropy_mae_bits"] == pytest.approx(0.36096, abs=1e-5)
    assert probe["kl_bits"] == pytest.approx(0.66096, abs=1e-5)


# distributions over 4 classes with round entropies (bits)
U4 = [0.25, 0.25, 0.25, 0.25]       # H = 2
U2 = [0.5, 0.5, 0.0, 0.0]           # H = 1
HALF = [0.5, 0.25, 0.25, 0.0]       # H = 1.5
ONE = [1.0, 0.0, 0.0, 0.0]          # H = 0


def ragged_batch():
    """Three rows of T = 4 whose answers sit at different columns, and different numbers of them:
        row  column  posterior  model   H_Bayes  H_model  KL(post || model)  target
        A    0       U4         U4      2        2        0                  0
        A    2       U2         HALF    1        1.5      1/2 log2 2 = 0.5   0
        B    1       U2         U4      1        2        1                  1
        B    2       ONE        U2      0        1        log2 2 = 1         0
        B    3       ONE        HALF    0        1.5      log2 2 = 1         0
        C    3       HALF       U4      1.5      2        2 - 1.5 = 0.5      2
    Elsewhere the posterior is 0 and the model U4, so any padding scored by mistake changes the numbers."""
    n, T = 3, 4
    answers = {(0, 0): (U4, U4, 0), (0, 2): (U2, HALF, 0), (1, 1): (U2, U4, 1), (1, 2): (ONE, U2, 0),
               (1, 3): (ONE, HALF, 0), (2, 3): (HALF, U4, 2)}
    mask, targets = np.zeros((n, T)), np.zeros((n, T), dtype=int)
    post, q = np.zeros((n, T, 4)), np.full((n, T, 4), 0.25)
    for (b, t), (p, model, y) in answers.items():
        mask[b, t], post[b, t], q[b, t], targets[b, t] = 1.0, p, model, y
    return dict(tokens=np.zeros((n, T), dtype=int), targets=targets, mask=mask, posterior=post), q


def test_answers_at_different_columns_are_scored_by_hand():
    batch, q = ragged_batch()
    pos, valid = evaluation.answers(batch)
    assert valid.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    assert np.where(valid, pos, -1).tolist() == [[0, 2, -1], [1, 2, 3], [3, -1, -1]]
    m, traces = evaluate(lambda tok: q, batch)
    # the paper metric, by answer index i over the rows that have an i-th answer:
    #   i = 1 (A, B, C): H_model (2 + 2 + 2) / 3 = 2,   H_Bayes (2 + 1 + 1.5) / 3 = 1.5  -> 0.5
    #   i = 2 (A, B):    H_model (1.5 + 1) / 2 = 1.25,  H_Bayes (1 + 0) / 2 = 0.5       -> 0.75
    #   i = 3 (B):       H_model 1.5,                   H_Bayes 0                       -> 1.5
    # mean (0.5 + 0.75 + 1.5) / 3 = 0.916667 (padding averaged in would give 0.5 as zeros, 0.944444 as the
    # entries at column 0)
    assert m["entropy_mae_bits"] == pytest.approx(2.75 / 3, abs=1e-12)
    assert m["entropy_mae_bits"] == pytest.approx(0.916667, abs=1e-6)
    # per sequence: the mean over the 6 answers of |H_model - H_Bayes| = (0 + .5 + 1 + 1 + 1.5 + .5) / 6 = 0.75
    # (row by row first it would be mean(0.25, 1.1667, 0.5) = 0.6389)
    assert m["entropy_mae_seq_bits"] == pytest.approx(0.75, abs=1e-12)
    # KL(posterior || model) over the 6 answers: (0 + .5 + 1 + 1 + 1 + .5) / 6 = 0.666667 bits (nats: 0.462098;
    # the swapped KL is infinite at A's second answer, where HALF has mass U2 rules out)
    assert m["kl_bits"] == pytest.approx(4 / 6, abs=1e-12)
    # -log2 q(target): 2, 1, 2, 1, 1, 2 (mean 1.5); -log2 post(target): 2, 1, 1, 0, 0, 2 (mean 1): excess 0.5
    assert m["excess_ce_bits"] == pytest.approx(0.5, abs=1e-12)
    # mass on ruled-out classes: 0, 1/4, 1/2, 1/2, 1/2, 1/4: mean 1/3
    assert m["impossible_mass"] == pytest.approx(1 / 3, abs=1e-12)
    rows = [(r["position"], r["H_model"], r["H_bayes"], r["kl"], r["impossible_mass"]) for r in m["per_position"]]
    np.testing.assert_allclose(rows, [(1, 2.0, 1.5, 0.5, 0.25), (2, 1.25, 0.5, 0.75, 0.375), (3, 1.5, 0.0, 1.0, 0.5)],
                               atol=1e-12)
    nan = np.nan
    np.testing.assert_allclose(traces["h_bayes"], [[2, 1, nan], [1, 0, 0], [1.5, nan, nan]], atol=1e-12)
    np.testing.assert_allclose(traces["h_model"], [[2, 1.5, nan], [2, 1, 1.5], [2, nan, nan]], atol=1e-12)
    # the same metric as a named function, on the entropies at each row's answers; padding is never read
    h_model = np.array([[2, 1.5, 99], [2, 1, 1.5], [2, 99, 99]])
    h_bayes = np.array([[2, 1, -99], [1, 0, 0], [1.5, -99, -99]])
    assert evaluation.paper_metric(h_model, h_bayes, valid) == pytest.approx(2.75 / 3, abs=1e-12)


def test_paper_metric_groups_by_answer_index_not_by_column():
    """Two rows with two answers each, row A at columns 0, 1 and row B at columns 1, 2:
        A: posterior U4, U2 (H_Bayes 2, 1), model U2, U4   (H_model 1, 2)
        B: posterior U4, U2 (H_Bayes 2, 1), model HALF, HALF (H_model 1.5, 1.5)
    By answer index: i = 1 |mean(1, 1.5) - 2| = 0.75, i = 2 |mean(2, 1.5) - 1| = 0.75: the metric is 0.75.
    By column it would be: column 0 |1 - 2| = 1, column 1 |mean(2, 1.5) - mean(1, 2)| = 0.25, column 2
    |1.5 - 1| = 0.5: 1.75 / 3 = 0.583333."""
    mask = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    post, q = np.zeros((2, 3, 4)), np.full((2, 3, 4), 0.25)
    post[0, 0], post[0, 1], q[0, 0], q[0, 1] = U4, U2, U2, U4
    post[1, 1], post[1, 2], q[1, 1], q[1, 2] = U4, U2, HALF, HALF
    batch = dict(tokens=np.zeros((2, 3), dtype=int), targets=np.zeros((2, 3), dtype=int), mask=mask, posterior=post)
    m, _ = evaluate(lambda tok: q, batch)
    assert m["entropy_mae_bits"] == pytest.approx(0.75, abs=1e-12)
    # the same entropies grouped by column, to show this case tells the two apart
    h_model, h_bayes = wt.entropy_bits(q), wt.entropy_bits(post)                # (2, 3)
    by_column = np.mean([abs(h_model[mask[:, t] > 0, t].mean() - h_bayes[mask[:, t] > 0, t].mean()) for t in range(3)])
    assert by_column == pytest.approx(1.75 / 3, abs=1e-12)
    assert [r["H_model"] for r in m["per_position"]] == pytest.approx([1.25, 1.75], abs=1e-12)


def test_a_row_without_an_answer_is_refused_in_one_line():
    batch, q = ragged_batch()
    batch["mask"][1] = 0.0                                            # row B supervises nothing
    with pytest.raises(ValueError, match="^row 1 of the batch has no supervised answer$"):
        evaluate(lambda tok: q, batch)
    batch, q = ragged_batch()
    batch["query_mask"] = np.zeros((3, 4))
    batch["query_mask"][2, 3] = 1.0                                   # row C's only answer is scored apart
    with pytest.raises(ValueError, match="^row 2 of the batch has no supervised answer$"):
        evaluate(lambda tok: q, batch)


def test_sawtooth_query_is_scored_apart_as_an_answer_group():
    """A value position, then the final query (one-hot posterior on its answer), two sequences:
        A: model at the query (.5, .25, .25, 0), answer 0: KL = -log2 .5 = 1 bit, argmax right, H = 1.5 bits
        B: model at the query (.1, .6, .3, 0),   answer 2: KL = -log2 .3 = 1.7370 bits, argmax wrong,
           H = .1 log2 10 + .6 log2(1/.6) + .3 log2(1/.3) = 1.2955 bits
    mean KL 1.3685 bits (the swapped KL(model || one-hot) would be enormous), the excess CE the same (the
    posterior's CE is 0), per-sequence MAE and the model's mean entropy 1.3977 (the exact one 0), accuracy 1/2."""
    value_post = np.array([0.25] * 4)
    q = np.array([[value_post, [0.5, 0.25, 0.25, 0.0]], [value_post, [0.1, 0.6, 0.3, 0.0]]])   # (2, 2, 4)
    post = np.array([[value_post, [1.0, 0, 0, 0]], [value_post, [0, 0, 1.0, 0]]])
    query = np.array([[0, 1], [0, 1]])
    batch = dict(tokens=np.zeros((2, 2), dtype=int), targets=np.array([[1, 0], [3, 2]]), mask=np.ones((2, 2)),
                 query_mask=query, groups={"final query": query}, posterior=post)
    m, _ = evaluate(lambda tok: q, batch)
    g = m["groups"]["final query"]
    assert g["kl_bits"] == pytest.approx((1 - math.log2(0.3)) / 2, abs=1e-12)
    assert g["kl_bits"] == pytest.approx(1.36848, abs=1e-5) and g["excess_ce_bits"] == pytest.approx(1.36848, abs=1e-5)
    assert g["entropy_mae_seq_bits"] == pytest.approx(1.39773, abs=1e-5) == g["h_model_bits"]
    assert (g["h_bayes_bits"], g["accuracy"], g["one_hot"], g["n_answers"]) == (0.0, 0.5, 1.0, 2)
    # the value position alone makes the paper's curve: the model equals the posterior there
    assert m["entropy_mae_bits"] == pytest.approx(0.0, abs=1e-12) and len(m["per_position"]) == 1


def test_an_answer_group_scores_accuracy_on_its_one_hot_answers_only():
    """One group of two answers, one stored key (one-hot posterior on 0, model (.5, .25, .25, 0): KL 1 bit,
    argmax right) and one unstored (uniform posterior, model (.7, .1, .1, .1): KL = 1/4 (log2(.25/.7)
    + 3 log2 2.5) = 0.62009 bits, its argmax meaningless). Group KL 0.81005; accuracy 1 over the one-hot
    answer alone (over both it would be 1/2 or 1 by the target drawn); one_hot 1/2; the model's mean entropy
    (1.5 + 1.35678) / 2 = 1.42839, the exact one (0 + 2) / 2 = 1."""
    q = np.array([[[0.5, 0.25, 0.25, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    post = np.array([[[1.0, 0, 0, 0], [0.25] * 4]])
    both = np.ones((1, 2))
    batch = dict(tokens=np.zeros((1, 2), dtype=int), targets=np.array([[0, 3]]), mask=both, posterior=post,
                 groups={"queries": both})
    g = evaluate(lambda tok: q, batch)[0]["groups"]["queries"]
    assert g["kl_bits"] == pytest.approx(0.81005, abs=1e-5)
    assert (g["accuracy"], g["one_hot"]) == (1.0, 0.5)
    # a context-free uniform predictor's KL: (log2 4 - 0 + log2 4 - 2) / 2 = 1 bit (KL(uniform || post), the
    # swapped one, would be infinite at the one-hot answer)
    assert evaluate(lambda tok: q, batch)[0]["prior_kl_bits"] == pytest.approx(1.0, abs=1e-12)
    assert g["h_model_bits"] == pytest.approx(1.42839, abs=1e-5) and g["h_bayes_bits"] == pytest.approx(1.0)
    batch["groups"] = {"queries": np.array([[0, 1]])}                 # the uniform answer alone: no accuracy
    g = evaluate(lambda tok: q, batch)[0]["groups"]["queries"]
    assert "accuracy" not in g and g["one_hot"] == 0.0 and g["kl_bits"] == pytest.approx(0.62009, abs=1e-5)
    batch["mask"] = np.array([[1.0, 0.0]])
    with pytest.raises(ValueError, match="^answer group 'queries' must mark supervised positions"):
        evaluate(lambda tok: q, batch)


def test_kl_is_asymmetric_and_in_bits():
    p, q = np.array([0.5, 0.5]), np.array([0.9, 0.1])
    # KL(p || q) = 1/2 log2(1/2 / 0.9) + 1/2 log2(1/2 / 0.1) = 0.7370; KL(q || p) = 0.5310
    assert wt.kl_bits(p, q) == pytest.approx(0.5 * math.log2(0.5 / 0.9) + 0.5 * math.log2(5), abs=1e-12)
    assert wt.kl_bits(p, q) == pytest.approx(0.73697, abs=1e-5)
    assert wt.kl_bits(q, p) == pytest.approx(0.53100, abs=1e-5)


def test_evidence_mass_averages_only_rows_that_have_evidence():
    """A bijection with V = 3, L = 2: k1 v1 k2 v2, keys predicted at positions 0 and 2. Row 0 (the first
    key) has no evidence; row 2's evidence is the earlier value position 1. With attention 0.5 there, the
    mean evidence mass is 0.5 (0.25 if the evidence-free row were averaged in)."""
    import manifold as mf
    batch = bijection.batch(np.random.default_rng(0), 1, V=3, n_pairs=2)
    alpha = np.zeros((1, 1, 4, 4))
    alpha[0, 0, 0, 0] = 1.0
    alpha[0, 0, 2, :3] = [0.2, 0.5, 0.3]
    alpha[0, 0, 1, :2] = 0.5                                       # the value rows are not read by the probe
    alpha[0, 0, 3, :4] = 0.25
    cfg = ba.Config(vocab_size=6, n_classes=3, max_len=4, d_model=4, n_layers=1, n_heads=1)
    att = mf.attention_probe({"layers": [{"alpha": alpha}]}, batch, "bijection", cfg)
    assert att["layers"][0]["consistent_mass"] == [pytest.approx(0.5)]
    # entropy of row 0 is 0 bits, of row 2 is H(0.2, 0.5, 0.3) = 1.4855 bits: mean 0.7427
    h2 = -(0.2 * math.log2(0.2) + 0.5 * math.log2(0.5) + 0.3 * math.log2(0.3))
    assert att["layers"][0]["entropy_bits_mean"] == pytest.approx(h2 / 2, abs=1e-12)
    # uniform causal attention: 1 position (0 bits) at row 0, 3 positions (log2 3 bits) at row 2;
    # the reported reduction is 1 - 0.7427 / 0.7925 = 0.0628 (in nats the baseline would be 0.5493, and
    # the reduction negative)
    assert att["uniform_entropy_bits"] == pytest.approx(math.log2(3) / 2, abs=1e-12)
    assert att["layers"][0]["entropy_reduction"] == pytest.approx(1 - h2 / math.log2(3), abs=1e-12)
    assert att["layers"][0]["entropy_reduction"] == pytest.approx(0.06277, abs=1e-5)
    # uniform attention's mass on the evidence, over the rows that have evidence: 1 of row 2's 3 positions
    # (1/6 if row 0 were averaged in)
    assert att["uniform_consistent_mass"] == pytest.approx(1 / 3, abs=1e-12)


def test_prototype_cosine_has_the_sign_of_the_m_step():
    """The M-step moves v_j against dv_j = sum_i alpha_ij u_i. A value that moved by exactly -0.1 dv has
    cosine +1 with the M-step's direction, one that moved along +dv has -1, one at right angles 0."""
    from dynamics import experiments as dy
    rng = np.random.default_rng(0)
    V, dV = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    assert dy.prototype_cosine(V, V - 0.1 * dV, dV) == pytest.approx(1.0)
    assert dy.prototype_cosine(V, V + 0.1 * dV, dV) == pytest.approx(-1.0)
    ortho = np.cross(dV, rng.normal(size=(5, 3)))                  # perpendicular to each row of dV
    assert dy.prototype_cosine(V, V + ortho, dV) == pytest.approx(0.0, abs=1e-12)


def test_held_out_kl_of_the_one_head_is_posterior_against_model(monkeypatch):
    """dynamics.evaluate_vs_bayes with a model that always predicts (0.9, 0.1, 0, ...)-like q against a
    posterior (1/2, 1/2, 0, ...): KL(posterior || model) = 0.7370 bits, not the reverse."""
    from dynamics import experiments as dy
    K, T = 8, 3
    q = np.full(K, 1e-12)
    q[:2] = [0.9, 0.1]
    q /= q.sum()
    post = np.zeros((1, T, K))
    post[..., :2] = 0.5
    monkeypatch.setattr(dy, "head_forward", lambda params, x: (np.log(np.broadcast_to(q, (1, T, K))), None))
    ref = (np.zeros((1, T, dy.D_X)), np.zeros((1, T), dtype=int), post, dict(bayes_loss_bits=1.0))
    out = dy.evaluate_vs_bayes(None, reference=ref)
    assert out["kl_bits"] == pytest.approx(0.73697, abs=1e-4)
    assert out["loss_bits"] == pytest.approx(-math.log2(0.9), abs=1e-6)      # every target is class 0
    assert out["excess_ce_bits"] == pytest.approx(-math.log2(0.9) - 1.0, abs=1e-6)


def test_weight_decay_touches_exactly_the_matrices(monkeypatch):
    cfg = models.make_config("transformer", vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=2, n_heads=2,
                             dtype="float64")
    params = models.init_params("transformer", cfg, 0)
    decayed = models.decay_set("transformer", params)
    assert decayed == {"wte", "wpe", "unembed.w"} | {f"blocks.{l}.{w}" for l in range(2) for w in
                                                      ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1", "mlp.w2")}
    # the default rule reads the shape, not the name: a matrix decays whatever it is called, a vector does not
    assert models.decayed("transformer", "w_ih", (3, 2)) and not models.decayed("transformer", "w_ih", (3,))
    assert models.decayed("transformer", "A_log", (3, 2)) and not models.decayed("transformer", "A_log", (3,))
    assert not models.decayed("transformer", "unembed.w", (5,)) and models.decayed("transformer", "lnf.g", (8, 1))
    rng = np.random.default_rng(0)
    params.update(w_ih=rng.normal(size=(3, 2)), A_log=rng.normal(size=3))
    decayed = models.decay_set("transformer", params)
    assert "w_ih" in decayed and "A_log" not in decayed
    # a step with zero gradient and weight decay wd shrinks exactly those by (1 - lr wd) = 1 - 0.1 * 0.5 = 0.95
    # (zero gradient: Adam's own step mhat / (sqrt(vhat) + eps) is 0)
    zeros = {k: np.zeros_like(v) for k, v in params.items()}
    before = {k: v.copy() for k, v in params.items()}
    optim.adamw_step(params, zeros, optim.adamw_init(params), 0.1, weight_decay=0.5, decay=decayed)
    for name in params:
        np.testing.assert_allclose(params[name], before[name] * (0.95 if name in decayed else 1.0), rtol=1e-15,
                                   err_msg=name)
    # decay=None is the same default rule; a set decays exactly its names
    for decay, shrunk in ((None, decayed), ({"A_log"}, {"A_log"})):
        p = {k: v.copy() for k, v in before.items()}
        optim.adamw_step(p, zeros, optim.adamw_init(p), 0.1, weight_decay=0.5, decay=decay)
        assert {k for k in p if not np.array_equal(p[k], before[k])} == shrunk
    # a family's own decayed(name, shape) wins over the default
    monkeypatch.setattr(ba, "decayed", lambda name, shape: name == "A_log", raising=False)
    assert models.decay_set("transformer", params) == {"A_log"}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # Wilcoxon on two seeds divides by zero; not checked here
def test_compare_em_steps_threshold_and_speedup_by_hand(monkeypatch):
    """Paper II's reported numbers from designed loss curves (nats), two seeds, 4 steps (M-step 2):
        SGD   seed 1: 5 4 3 1.0 1.0      seed 2: 5 4 3 2.5 2.0   -> threshold = mean final = 1.5
        EM    seed 1: 5 1.5 1.4 1.2 1.1  seed 2: 5 1.2 1 1 1     -> first strictly below 1.5: steps 2 and 1
        M     seed 1: 5 0.5 0.4          seed 2: 5 3 2           -> 1, and never (counts as its 2 steps)
    SGD reaches it at 3 (seed 1) and never (seed 2, counts 4). Speed-up, the authors' way = SGD's steps
    run / the mean: 4 / 1.5 = 2.667 for EM (against SGD's own mean 3.5 it would be 2.333). Seconds per step
    0.1 (SGD) and 0.2 (the others): SGD 0.3 and 0.4 s, EM 0.4 and 0.2 s -> 0.35 / 0.3 = 1.167."""
    from dynamics import experiments as dy
    curves = {("sgd", 1): [5, 4, 3, 1.0, 1.0], ("sgd", 2): [5, 4, 3, 2.5, 2.0],
              ("em", 1): [5, 1.5, 1.4, 1.2, 1.1], ("em", 2): [5, 1.2, 1, 1, 1],
              ("mstep", 1): [5, 0.5, 0.4], ("mstep", 2): [5, 3, 2]}

    def train_head(params, x, targets, n, method, lr=None, log_every=None, seed=0):
        loss = np.array(curves[method, seed], float)
        assert len(loss) == n + 1
        return dict(loss=loss, seconds=np.arange(n + 1) * (0.1 if method == "sgd" else 0.2))
    monkeypatch.setattr(dy, "train_head", train_head)
    monkeypatch.setattr(dy, "bayes_loss_bits", lambda *a, **k: 2.0)
    monkeypatch.setattr(dy, "evaluate_vs_bayes", lambda params, reference=None: dict(loss_bits=3.0, kl_bits=0.1))
    s, _ = dy.compare_setting("toy", [1, 2], lambda seed: (None, None), 4, 2, (None, None, None, {"chain": "exact"}))
    assert s["threshold_nats"] == pytest.approx(1.5) and s["threshold_bits"] == pytest.approx(1.5 / math.log(2))
    assert [r["sgd"]["steps_to_threshold"] for r in s["per_seed"]] == [3, 4]
    assert [r["em"]["steps_to_threshold"] for r in s["per_seed"]] == [2, 1]
    assert [r["mstep"]["steps_to_threshold"] for r in s["per_seed"]] == [1, 2]
    assert (s["sgd"]["reached"], s["em"]["reached"], s["mstep"]["reached"]) == (1, 2, 1)
    assert s["em"]["steps_to_threshold_mean"] == pytest.approx(1.5)
    assert s["em"]["speedup_steps"] == pytest.approx(4 / 1.5)
    assert s["em"]["speedup_seconds"] == pytest.approx(0.35 / 0.3)
    assert s["em"]["final_loss_bits_mean"] == pytest.approx(1.05 / math.log(2))
    # paired on final losses, EM minus SGD: (1.1 - 1.0, 1.0 - 2.0) -> mean difference -0.45 nats
    assert s["em"]["paired_final_loss_vs_sgd"]["mean_diff"] == pytest.approx(-0.45)


def test_paired_t_test_is_the_paired_one():
    """Differences (1, 2, 3, 3): mean 2.25, sd 0.9574, t = 2.25 / (0.9574 / 2) = 4.700 on 3 degrees of
    freedom, p = 0.0182; an unpaired test on the same numbers gives t = 3.25 on 6, p = 0.0175."""
    from dynamics import experiments as dy
    out = dy._paired([1, 2, 3, 4], [0, 0, 0, 1])
    assert out["mean_diff"] == pytest.approx(2.25)
    assert out["ttest_rel"]["statistic"] == pytest.approx(2.25 / (math.sqrt(2.75 / 3) / 2), abs=1e-9)
    assert out["ttest_rel"]["statistic"] == pytest.approx(4.700, abs=1e-3)
    assert out["ttest_rel"]["p"] == pytest.approx(0.0182, abs=1e-4)


def test_ablation_frame_head_by_the_authors_rule_and_its_ratio(monkeypatch):
    """One layer, three heads; zeroing each raises (entropy MAE, KL) from the baseline (0.1, 0.05) to
    head 0: (0.5, 0.2), head 1: (0.3, 0.9), head 2: (0.12, 0.06). The authors' rule (largest MAE rise)
    names L0H0 with a rise of 0.4, the runner-up L0H1 0.2: ratio 2.0 (0.5 inverted). Our KL rule names L0H1."""
    import manifold as mf
    table = {None: (0.1, 0.05), (0, 0): (0.5, 0.2), (0, 1): (0.3, 0.9), (0, 2): (0.12, 0.06), "layer": (1.0, 2.0)}

    def fake(params, cfg, batch, layer=None, heads=(), method="zero", clean=None):
        assert method == "zero"
        key = None if layer is None else "layer" if len(heads) == cfg.n_heads else (layer, heads[0])
        mae, kl = table[key]
        return {"entropy_mae_bits": mae, "kl_bits": kl}
    monkeypatch.setattr(mf, "ablated_calibration", fake)
    cfg = ba.Config(vocab_size=6, n_classes=3, max_len=4, d_model=6, n_layers=1, n_heads=3)
    batch = dict(tokens=np.zeros((1, 2), dtype=int), targets=np.zeros((1, 2), dtype=int), mask=np.ones((1, 2)),
                 posterior=np.full((1, 2, 3), 1 / 3))               # read only for the uniform guess's KL
    out = mf.ablations(None, cfg, batch, methods=("zero",))
    a = out["authors_frame_head"]
    assert (a["name"], a["second"]) == ("L0H0", "L0H1")
    assert a["delta_entropy_mae_bits"] == pytest.approx(0.4) and a["ratio_to_second"] == pytest.approx(2.0)
    assert out["hypothesis_frame_head"]["name"] == "L0H1"
    assert out["layers"][0]["delta_kl_bits"] == pytest.approx(1.95)


def test_frame_overlap_chance_and_plateau_by_hand():
    """Overlap ||U^T W||_F^2 / min(r1, r2): U = span(e1, e2) in R^4 and W = (e1 + e3)/sqrt 2 give 0.5 / 1.
    Chance for an 8-dimensional frame against a 20-dimensional one in R^64: 8 * 20 / 64 / 8 = 0.3125
    (ceiling 3.2x). The plateau: ratios (2, 5, 6.5, 6, 6.2) at steps (100, 200, 300, 1000, 3000) stay
    >= 0.9 * 6.2 = 5.58 from step 300 on; the MAE there is 0.05 and at the end 0.002: a gain of 25."""
    from geometry import formation as fm
    e = np.eye(4)
    assert fm.projection_overlap(e[:, :2], ((e[:, 0] + e[:, 2]) / math.sqrt(2))[:, None]) == pytest.approx(0.5)
    assert fm.random_overlap(64, 8, 20) == pytest.approx(0.3125)
    steps = [100, 200, 300, 1000, 3000]
    out = fm.authors_frame_precision(steps, [0.2, 0.5, 0.65, 0.6, 0.62], [0.5, 0.1, 0.05, 0.01, 0.002], 0.1)
    assert out["ratio_to_chance"] == pytest.approx([2, 5, 6.5, 6, 6.2])
    assert out["frame_plateau_step"] == 300 and out["ratio_at_plateau"] == pytest.approx(6.5)
    assert out["calibration_gain_after_plateau"] == pytest.approx(25.0)
    assert out["step_nearest_300"] == 300 and out["ratio_ceiling"] == pytest.approx(10.0)


def test_welch_bound_for_twenty_hypotheses_in_heads_of_sixteen():
    """sqrt((n - d) / (d (n - 1))) = sqrt(4 / 304) = 0.1147 for n = 20, d = 16 (the issue's 'at least 0.115')."""
    from geometry import measures as ms
    assert ms.welch_rms_bound(20, 16) == pytest.approx(math.sqrt(4 / 304)) and ms.welch_rms_bound(20, 16) == pytest.approx(0.11471, abs=1e-5)


def test_the_prior_only_row_is_the_uniform_predictor_measured_on_the_same_answers():
    """Three answers, K = 4: row 0 one-hot (H 0) then uniform (H 2), row 1 two-way (H 1). The uniform
    predictor's |2 - H| and KL are 2, 0, 1: per-sequence MAE and KL 1.0 bit; the paper metric averages H over
    rows first, index 1 |2 - 0.5| = 1.5 and index 2 |2 - 2| = 0, so 0.75. The summary table prints these,
    not the prior's expected gap it is handed (here 9.0, which it prints only for rows without them)."""
    post = np.full((2, 2, 4), 0.25)
    post[0, 0] = [1.0, 0, 0, 0]
    post[1, 0] = [0.5, 0.5, 0, 0]
    batch = dict(tokens=np.zeros((2, 2), dtype=int), targets=np.zeros((2, 2), dtype=int),
                 mask=np.array([[1.0, 1.0], [1.0, 0.0]]), posterior=post)
    m = evaluate(lambda tok: np.full((2, 2, 4), 0.25), batch)[0]
    assert m["prior_only"]["entropy_mae_bits"] == pytest.approx(0.75, abs=1e-12)
    assert m["prior_only"]["entropy_mae_seq_bits"] == pytest.approx(1.0, abs=1e-12)
    assert m["prior_only"]["kl_bits"] == m["prior_kl_bits"] == pytest.approx(1.0, abs=1e-12)
    from train import summary_table
    row = next(line for line in summary_table({"m": m}, prior_gap=9.0).splitlines() if line.startswith("prior only"))
    assert row.split()[2:] == ["0.75", "1", "1"]
    del m["prior_only"]
    row = next(line for line in summary_table({"m": m}, prior_gap=9.0).splitlines() if line.startswith("prior only"))
    assert row.split()[2:] == ["9", "9", "9"]


def test_hallucinated_and_honest_doubt_are_shares_of_all_a_groups_answers():
    """Six answers, K = 4. (1) one-hot on 0, model .6 on 1: hallucinated. (2) one-hot, model (.4, .3, .2, .1),
    H 1.846: honest doubt. (3) posterior (.5, .5, 0, 0), model (.45, .45, .1, 0): neither. (4) posterior
    (.96, .04, 0, 0), model .7 on 1 (< .05 there): hallucinated, though not one-hot. (5) one-hot, model exact:
    neither. (6) one-hot on 0, model (.4, .3, .3, 0): .6 on the wrong answers together but at most .3 on any
    one: not hallucinated; H 1.571: honest doubt. (7) one-hot on 0, model (.02, .49, .49, 0): no answer over
    1/2, H 1.12, but the truth given .02: neither. Shares 2/7 and 2/7 (over the one-hot answers alone 1/5 and
    2/5; mass on the wrong set instead of one answer: 4/7 and 1/7; without the truth's floor, doubt 3/7)."""
    post = np.array([[1, 0, 0, 0], [1, 0, 0, 0], [.5, .5, 0, 0], [.96, .04, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0],
                     [1, 0, 0, 0]], float)[None]
    q = np.array([[.1, .6, .2, .1], [.4, .3, .2, .1], [.45, .45, .1, 0], [.3, .7, 0, 0], [1, 0, 0, 0],
                  [.4, .3, .3, 0], [.02, .49, .49, 0]])[None]
    every = np.ones((1, 7))
    batch = dict(tokens=np.zeros((1, 7), dtype=int), targets=np.zeros((1, 7), dtype=int), mask=every,
                 posterior=post, groups={"all": every})
    g = evaluate(lambda tok: q, batch)[0]["groups"]["all"]
    assert g["hallucinated"] == pytest.approx(2 / 7) and g["honest_doubt"] == pytest.approx(2 / 7)
