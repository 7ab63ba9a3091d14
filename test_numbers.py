"""Every reported number against a hand-computed, nonzero answer, on cases where the plausible mistakes
(a swapped KL, another average, nats for bits, a flipped sign) give different answers."""

import math

import numpy as np
import pytest

import bayesattn as ba
import optim
import windtunnels as wt
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
    # in nats every bit number would be ln 2 times smaller
    assert m["kl_bits"] != pytest.approx(m["kl_bits"] * math.log(2))


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


def test_sawtooth_query_is_scored_apart_with_kl_and_accuracy():
    """A value position, then the final query (one-hot posterior on its answer), two sequences:
        A: model at the query (.5, .25, .25, 0), answer 0: KL = -log2 .5 = 1 bit, argmax right
        B: model at the query (.1, .6, .3, 0),   answer 2: KL = -log2 .3 = 1.7370 bits, argmax wrong
    mean KL 1.3685 bits (the swapped KL(model || one-hot) would be enormous), accuracy 1/2."""
    value_post = np.array([0.25] * 4)
    q = np.array([[value_post, [0.5, 0.25, 0.25, 0.0]], [value_post, [0.1, 0.6, 0.3, 0.0]]])   # (2, 2, 4)
    post = np.array([[value_post, [1.0, 0, 0, 0]], [value_post, [0, 0, 1.0, 0]]])
    batch = dict(tokens=np.zeros((2, 2), dtype=int), targets=np.array([[1, 0], [3, 2]]), mask=np.ones((2, 2)),
                 query_mask=np.array([[0, 1], [0, 1]]), posterior=post)
    m, _ = evaluate(lambda tok: q, batch)
    assert m["query"]["kl_bits"] == pytest.approx((1 - math.log2(0.3)) / 2, abs=1e-12)
    assert m["query"]["kl_bits"] == pytest.approx(1.36848, abs=1e-5)
    assert m["query"]["accuracy"] == 0.5
    # the value position alone makes the paper's curve: the model equals the posterior there
    assert m["entropy_mae_bits"] == pytest.approx(0.0, abs=1e-12) and len(m["per_position"]) == 1


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
    batch = wt.bijection_batch(np.random.default_rng(0), 1, V=3, L=2)
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
    import dynamics as dy
    rng = np.random.default_rng(0)
    V, dV = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    assert dy.prototype_cosine(V, V - 0.1 * dV, dV) == pytest.approx(1.0)
    assert dy.prototype_cosine(V, V + 0.1 * dV, dV) == pytest.approx(-1.0)
    ortho = np.cross(dV, rng.normal(size=(5, 3)))                  # perpendicular to each row of dV
    assert dy.prototype_cosine(V, V + ortho, dV) == pytest.approx(0.0, abs=1e-12)


def test_held_out_kl_of_the_one_head_is_posterior_against_model(monkeypatch):
    """dynamics.evaluate_vs_bayes with a model that always predicts (0.9, 0.1, 0, ...)-like q against a
    posterior (1/2, 1/2, 0, ...): KL(posterior || model) = 0.7370 bits, not the reverse."""
    import dynamics as dy
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


def test_weight_decay_touches_exactly_the_matrices():
    cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=2, n_heads=2, dtype="float64")
    params = ba.init_params(cfg, 0)
    decayed = {n for n in params if optim.default_decay(n)}
    assert decayed == {"wte", "wpe", "unembed.w"} | {f"blocks.{l}.{w}" for l in range(2) for w in
                                                      ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w1", "mlp.w2")}
    # a step with zero gradient and weight decay wd shrinks exactly those by (1 - lr wd)
    before = {k: v.copy() for k, v in params.items()}
    optim.adamw_step(params, {k: np.zeros_like(v) for k, v in params.items()}, optim.adamw_init(params), 0.1,
                     weight_decay=0.5)
    for name in params:
        np.testing.assert_allclose(params[name], before[name] * (0.95 if name in decayed else 1.0), err_msg=name)
