"""Tests for manifold.py: every probe on a tiny case whose answer is known; then geometry/run.py, which runs them
on a checkpoint, end to end."""
import json
import os

import manifold as mf  # first: bayesattn, imported by it, pins OpenBLAS to one thread before NumPy loads
from geometry import measures as ms
from geometry import run as geometry  # noqa: E402
import bayesattn as ba
from harness import checkpoints
from geometry import formation
import numpy as np
import pytest

from tunnels import hmm
from tunnels import sawtooth
from geometry import verdicts


def tiny_config(V=4, d_model=8, n_layers=2, n_heads=2, dtype="float64"):
    """A bijection model with V keys: vocabulary 2V, L = V - 1 pairs, T = 2L."""
    return ba.Config(vocab_size=2 * V, n_classes=V, max_len=2 * (V - 1), d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, dtype=dtype)


def loud_params(cfg, seed=0, std=0.5):
    """Random weights large enough that attention is far from uniform and every head matters."""
    rng = np.random.default_rng(seed)
    return {k: (v + std * rng.standard_normal(v.shape)).astype(cfg.dtype)
            for k, v in ba.init_params(cfg, seed).items()}


# ----------------------------------------------------------------------------
# probe 1: the hypothesis frame

def test_orthonormal_keys_have_zero_offdiagonal_cosine():
    cfg = tiny_config(V=4, d_model=8, n_heads=2)                    # head size 4 = V: room for 4 orthogonal keys
    params = ba.init_params(cfg)
    hs = cfg.d_model // cfg.n_heads
    params["blocks.0.ln1.g"], params["blocks.0.ln1.b"] = np.ones(cfg.d_model), np.zeros(cfg.d_model)
    params["wte"] = np.zeros((2 * cfg.n_classes, cfg.d_model))
    wk = np.zeros((cfg.d_model, cfg.d_model))
    for t in range(cfg.n_classes):                                   # token t -> 2 (e_2t - e_2t+1): mean 0,
        params["wte"][t, 2 * t], params["wte"][t, 2 * t + 1] = 2.0, -2.0   # variance 1, so LN1 leaves it be
        for h in range(cfg.n_heads):
            wk[2 * t, h * hs + t] = 1.0                              # every head reads coordinate 2t as key slot t
    params["blocks.0.attn.wk"] = wk
    groups = {"keys": (np.arange(cfg.n_classes), np.arange(0, 6, 2))}
    cos = mf.key_frame(params, cfg, groups, recipe="authors")["keys"]   # (NH, V, V)
    np.testing.assert_allclose(cos, np.broadcast_to(np.eye(4), cos.shape), atol=1e-9)
    assert all(ms.mean_abs_offdiag(c) == pytest.approx(0.0, abs=1e-9) for c in cos)
    assert mf.gaussian_baseline(4, hs) > 0.2                         # random vectors are far from orthogonal
    params["blocks.0.attn.wk"][2, :] = 1.0                           # token 1's key is now 2 (1, 1, 1, 1) per head:
    want = 6 * 0.5 / 12                                              # cos 1/2 with each of the 3 others, 0 elsewhere
    got = mf.authors_key_frame(params, cfg, "sawtooth")              # the same keys by the authors' probe
    assert got["per_head"] == pytest.approx([want, want], rel=1e-6)
    cos = mf.key_frame(params, cfg, groups, recipe="authors")["keys"]
    assert [ms.mean_abs_offdiag(c) for c in cos] == pytest.approx([want, want], rel=1e-6)
    params["blocks.0.attn.bk"] = np.full(cfg.d_model, 3.0)            # the authors' key has no bias: no change
    assert mf.authors_key_frame(params, cfg, "sawtooth")["per_head"] == pytest.approx([want, want], rel=1e-6)


def test_welch_bound_is_met_by_the_regular_simplex():
    d = 5
    simplex = np.eye(d + 1) - 1.0 / (d + 1)                           # d + 1 unit-norm-able vectors in a d-dim subspace
    cos = ms.cosine_matrix(simplex)
    assert ms.rms_offdiag(cos) == pytest.approx(1.0 / d)              # cos = -1/d for every pair
    assert ms.welch_rms_bound(d + 1, d) == pytest.approx(1.0 / d)
    assert ms.welch_rms_bound(3, 5) == 0.0                            # n <= d: orthonormal sets exist


def test_centred_recipe_removes_a_shared_key():
    cfg = tiny_config()
    params = loud_params(cfg)
    groups = mf.task_module("bijection").token_groups(cfg, np.zeros((1, 6), dtype=int))
    k = mf.layer0_vectors(params, cfg, groups["keys"][0], np.zeros(cfg.d_model), "ln_centred")
    np.testing.assert_allclose(k.sum(1), 0.0, atol=1e-12)            # (NH, hs): a sum of zero over the tokens


# ----------------------------------------------------------------------------
# probe 2: evidence positions

def test_bijection_evidence_is_the_answer_when_a_key_repeats():
    V = 4
    tokens = np.array([[0, V + 2, 1, V + 3, 0, V + 2]])              # k0 v2 k1 v3 k0 v2
    m = mf.task_module("bijection").evidence_masks(tokens, np.array([0, 2, 4]))
    assert not m["consistent"][0, 0].any()                            # first key: no evidence yet
    np.testing.assert_array_equal(np.flatnonzero(m["consistent"][0, 1]), [1])     # new key: earlier values
    np.testing.assert_array_equal(np.flatnonzero(m["consistent"][0, 2]), [1])     # repeated k0: its value v2
    np.testing.assert_array_equal(np.flatnonzero(m["value"][0, 2]), [1, 3])


def test_hmm_evidence_is_the_emission_column_of_the_observation():
    batch = hmm.batch(np.random.default_rng(0), 2, n_obs=3)
    cols = mf.supervised_columns(batch)
    m = hmm.evidence_masks(batch["tokens"], cols)
    for b in range(2):
        for p, t in enumerate(cols):
            o = batch["tokens"][b, t] - hmm.OBS0
            np.testing.assert_array_equal(np.flatnonzero(m["consistent"][b, p]), 26 + 5 * np.arange(5) + o)
            T, E, _ = hmm.detokenize(batch["tokens"][b])
            np.testing.assert_allclose((batch["tokens"][b, m["consistent"][b, p]] + 5) / 100, E[:, o])


def test_attention_entropy_of_uniform_rows_is_log2_of_their_length():
    alpha = np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]       # uniform causal attention
    np.testing.assert_allclose(mf.row_entropy_bits(alpha), np.log2(np.arange(1, 6)), atol=1e-12)


# ----------------------------------------------------------------------------
# probe 3: the manifold

def test_one_dimensional_manifold_has_rho_one_and_all_variance_on_pc1():
    rng = np.random.default_rng(0)
    h = rng.uniform(0, 4, 300)                                        # "posterior entropies", distinct
    u, c = rng.standard_normal(16), rng.standard_normal(16)
    X = np.exp(-h)[:, None] * u + c                                   # a curve ordered by h, one direction
    stats, xy = mf.manifold_stats(X, h)
    assert stats["pc1_variance"] == pytest.approx(1.0, abs=1e-12)
    assert stats["pc12_variance"] == pytest.approx(1.0, abs=1e-12)
    assert stats["abs_spearman_pc1_entropy"] == pytest.approx(1.0)
    assert xy.shape == (300, 2)


def test_within_position_control_sees_position_confounds():
    pos = np.repeat(np.arange(10), 30)
    h = pos.astype(float)                                             # H a function of position only
    X = np.c_[pos + 0.01 * np.random.default_rng(1).standard_normal(300), np.zeros(300)]
    stats, _ = mf.manifold_stats(X, h, pos)
    assert stats["abs_spearman_pc1_entropy"] > 0.99
    assert stats["mean_within_position_spearman"] is None             # H never varies at a fixed position


# ----------------------------------------------------------------------------
# probes 4 and 5: logit lens, ablations

def test_ablating_a_head_with_zero_output_projection_changes_nothing():
    cfg = tiny_config()
    params = loud_params(cfg)
    hs = cfg.d_model // cfg.n_heads
    params["blocks.1.attn.wo"][hs:2 * hs] = 0.0                       # head 1 of layer 1 writes nothing
    batch = mf.probe_batch("bijection", cfg, 16, 0)
    abl = mf.ablations(params, cfg, batch)
    silent = next(r for r in abl["heads"] if (r["layer"], r["head"]) == (1, 1))
    assert silent["delta_kl_bits"] == pytest.approx(0.0, abs=1e-12)
    assert silent["delta_entropy_mae_bits"] == pytest.approx(0.0, abs=1e-12)
    assert max(abs(r["delta_kl_bits"]) for r in abl["heads"]) > 1e-6  # the others matter


def test_logit_lens_of_the_last_stream_is_the_model():
    cfg = tiny_config()
    params = loud_params(cfg)
    batch = mf.probe_batch("bijection", cfg, 8, 0)
    _, cache = ba.forward(params, batch["tokens"], cfg)
    lens = mf.logit_lens(params, cache, batch)
    assert len(lens["kl_bits"]) == cfg.n_layers + 1
    assert lens["kl_bits"][-1] == pytest.approx(mf.ablations(params, cfg, batch)["baseline"]["kl_bits"], rel=1e-10)


# ----------------------------------------------------------------------------
# probe 6: frame and precision over snapshots

def test_identical_snapshots_give_zero_attention_change(tmp_path):
    cfg = tiny_config()
    params = loud_params(cfg)
    os.makedirs(tmp_path / "snapshots")
    for step in (10, 100):
        checkpoints.save_checkpoint(str(tmp_path / "snapshots" / f"step_{step:07d}.npz"), params, cfg,
                                    meta={"step": step, "model": "transformer"})
    batch = mf.probe_batch("bijection", cfg, 8, 0)
    snaps = [(s, checkpoints.load_checkpoint(p)[0]) for s, p in formation.snapshot_paths(str(tmp_path))]
    fp = formation.frame_precision(snaps, lambda p: mf.snapshot_state(p, cfg, batch, "bijection"),
                                   lambda p: mf.frame_matrix(p, "bijection", cfg), 8, cfg.d_model)
    assert fp["steps"] == [10, 100]
    assert fp["authors"]["overlap"] == pytest.approx([1.0, 1.0])       # the same frame: full overlap
    assert np.all(np.asarray(fp["attention_tv_per_layer"]) == 0.0)
    assert fp["entropy_mae_bits"][0] == fp["entropy_mae_bits"][1]


def test_settling_step_is_the_first_step_after_which_change_stays_small():
    steps = [1, 2, 4, 8, 16]
    assert formation.settling_step(steps, [1.0, 5.0, 0.2, 0.1]) == 4         # threshold 0.5: calm from 4 -> 8
    assert formation.settling_step(steps, [1.0, 5.0, 0.2, 0.6]) is None      # still moving in the last interval
    assert formation.attention_tv(np.eye(3), np.eye(3)) == 0.0
    assert formation.attention_tv(np.eye(2), np.eye(2)[::-1]) == pytest.approx(1.0)  # disjoint rows: TV 1


# ----------------------------------------------------------------------------
# end to end

def write_run(tmp_path, cfg, meta, seeds=(1, 2)):
    run = tmp_path / "tiny-run"
    os.makedirs(run / "snapshots")
    for i, s in enumerate(seeds):
        checkpoints.save_checkpoint(str(run / "snapshots" / f"step_{10 ** (i + 1):07d}.npz"), ba.init_params(cfg, s), cfg,
                                    meta={"step": 10 ** (i + 1), "model": "transformer"})
    checkpoints.save_checkpoint(str(run / "checkpoint.npz"), ba.init_params(cfg, seeds[-1]), cfg,
                                meta={"model": "transformer", **meta})
    return run


def check_geometry(g, run, figs):
    json.dumps(g, allow_nan=False)                                    # plain JSON types, no NaN
    with open(run / "geometry.json") as f:
        assert json.load(f) == g
    for key in ("key_frame", "attention", "manifold", "logit_lens", "ablations", "frame_precision"):
        assert g[key] is not None, key
    assert len(g["figures"]) == 7
    for path in g["figures"]:
        assert os.path.basename(path).startswith("geometry_") and os.path.exists(path)
    assert os.path.dirname(g["figures"][0]) == str(figs)


def longest_labels(monkeypatch):
    """Every verdict's label as long as a label may be (verdicts.LABEL_MAX characters of a label's usual words),
    so that the figures drawn next keep the figure rules (conftest: plots.STRICT) with the longest title a
    verdict can give them."""
    words = "mean |cos| 0.300 (init 0.170), centred 0.100 (0.170); KL 40x after step 12800, still 0.1; " * 2
    monkeypatch.setattr(verdicts, "label", lambda outcome, deciding: f"{outcome}: {words}"[:verdicts.LABEL_MAX])


def test_analyze_smoke_bijection(tmp_path, monkeypatch):
    longest_labels(monkeypatch)
    cfg = tiny_config(dtype="float32")
    run = write_run(tmp_path, cfg, {"task": "bijection", "replacement": False})
    g = geometry.analyze(str(run / "checkpoint.npz"), fig_dir=str(tmp_path / "figs"), n_seqs=12, seed=0)
    check_geometry(g, run, tmp_path / "figs")
    assert len(g["attention"]["layers"]) == cfg.n_layers
    assert g["frame_precision"]["steps"] == [10, 100]
    assert g["clusters"] is None and "state_clusters" not in g["verdicts"]      # the bijection names no hidden state
    heads = [f"L{l}H{h}" for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    assert g["ablations"]["hypothesis_frame_head"]["name"] in heads
    worst = max(g["ablations"]["heads"], key=lambda r: r["delta_kl_bits"])     # the rule it states: largest KL rise
    assert g["ablations"]["hypothesis_frame_head"]["name"] == f"L{worst['layer']}H{worst['head']}"
    assert set(g["verdicts"]) == set(verdicts.CLAIMS) - {"state_clusters"} and all(v["rule"] == verdicts.RULES[c] for c, v in g["verdicts"].items())
    assert all(len(v["label"]) == verdicts.LABEL_MAX for v in g["verdicts"].values())   # the longest, drawn
    for key in ("key_frame", "sink", "query_swap", "position_norm", "graded_rows", "readout", "ablations", "frame_change"):
        assert key in g["definitions"]                                 # every control is defined where it is written


def test_analyze_smoke_hmm(tmp_path, monkeypatch):
    longest_labels(monkeypatch)
    cfg = ba.Config(vocab_size=hmm.VOCAB, n_classes=hmm.S, max_len=hmm.HEADER + 20, d_model=8,
                    n_layers=1, n_heads=2, pos="sinusoidal")
    run = write_run(tmp_path, cfg, {"task": "hmm", "replacement": False})
    g = geometry.analyze(str(run / "checkpoint.npz"), fig_dir=str(tmp_path / "figs"), n_seqs=3, seed=0)
    check_geometry(g, run, tmp_path / "figs")
    assert set(g["key_frame"]["ln"]) == {"observations", "probabilities"}
    c = g["clusters"]                                   # probe 7: the HMM names hidden states; 3 x 20 rows
    assert c["k"] == hmm.S and c["rows"] == 60 and len(c["nmi_init_per_seed"]) == len(geometry.RANDOM_INIT_SEEDS)
    assert g["verdicts"]["state_clusters"]["rule"] == verdicts.RULES["state_clusters"]


def test_bad_arguments_give_one_clear_line(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    broken, missing = str(tmp_path / "broken.npz"), str(tmp_path / "missing.npz")
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 truncated")
    for args, expected in (([missing], f"checkpoint {missing!r} does not exist"),
                           ([broken], "is truncated or not a bayesattn checkpoint"),
                           ([broken, "--n-seqs", "1"], "--n-seqs 1: must be at least 2"),
                           ([], "give a checkpoint (runs/<name>/checkpoint.npz), or --definitions")):
        proc = subprocess.run([sys.executable, "-m", "geometry.run", *args], cwd=root,
                              capture_output=True, text=True, timeout=600)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr


def test_authors_manifold_by_hand_and_positions_where_h_is_constant():
    """H = 2 x PC1 exactly: |Pearson| 1 and R^2 1 on the top 5 PCs. A position where H is constant (up to
    float rounding, as log2 20 computed per sequence is) has no within-position R^2, not a huge negative one."""
    rng = np.random.default_rng(0)
    t = rng.normal(size=200)
    X = np.c_[5 * t, rng.normal(size=(200, 3)) * 0.1]                  # PC1 is the t axis
    position = np.repeat([0, 1], 100)
    m = mf.authors_manifold(X, 2 * t, position)
    assert m["pc1_variance"] > 0.99 and m["best_pc"] == 1
    assert m["best_abs_pearson"] == pytest.approx(1.0) and m["r2_top5"] == pytest.approx(1.0)
    h = 2 * t
    h[position == 0] = np.log2(20) + 1e-16 * rng.normal(size=100)        # "constant" entropy at position 0
    m = mf.authors_manifold(X, h, position)
    assert m["mean_within_position_r2_top5"] == pytest.approx(1.0)        # position 1 alone: H = 2 t exactly
    assert ms.r_squared(X[:100], h[:100]) is None and ms.pearson(X[:100, 0], h[:100]) is None


def test_authors_manifold_when_the_entropy_lies_on_two_pcs():
    """X = (3a, b) with a, b orthogonal, centred, unit variance: PC1 = a holds 9/10 of the variance. H = a + 2b:
    Pearson(PC1, H) = 1/sqrt 5 = 0.447, Pearson(PC2, H) = 2/sqrt 5 = 0.894 (the best, PC2); R^2 of H on the
    top 5 PCs is 1 (on PC1 alone it would be 1/5)."""
    rng = np.random.default_rng(1)
    M = rng.normal(size=(400, 2))
    Q, _ = np.linalg.qr(M - M.mean(0))                                  # orthonormal columns, each centred
    a, b = Q[:, 0] * np.sqrt(400), Q[:, 1] * np.sqrt(400)
    m = mf.authors_manifold(np.c_[3 * a, b], a + 2 * b, np.zeros(400, int))
    assert m["pc1_variance"] == pytest.approx(0.9)
    assert [abs(r) for r in m["pearson_pc1_to_pc5"]] == pytest.approx([1 / np.sqrt(5), 2 / np.sqrt(5)])
    assert m["best_pc"] == 2 and m["best_abs_pearson"] == pytest.approx(0.89443, abs=1e-5)
    assert m["r2_top5"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------
# the controls (issue: a skeptic's re-analysis). Each hand-built case has an artifact and a real effect that
# give the same headline; the controls, through the functions geometry/run.py calls, must tell them apart.

def fake_run(batch, rows_of, C=6, n_layers=1):
    """A cache holding hand-built representations: rows_of(cols) -> X (n, P, C) at the answer rows, zero
    elsewhere, as the final residual stream, the attention output and (the same) after the final LayerNorm."""
    cols = mf.supervised_columns(batch)
    n, T = batch["tokens"].shape
    X = np.zeros((n, T, C))
    X[:, cols] = rows_of(cols)
    return {"resid": [X] * (n_layers + 1), "layers": [{"attn_out": X}] * n_layers, "xf": X}


def judged_manifold(batch, rows_of):
    man, xy = mf.manifold_probe(fake_run(batch, rows_of), batch, "sawtooth")
    return man, verdicts.manifold({"manifold": man, "authors": {"manifold": man["authors"]}})


def test_a_binary_split_on_pc1_is_not_an_entropy_axis():
    """Sawtooth rows whose PC1 is the seen/new split alone (and a graded axis of their H nowhere): PC1 holds
    nearly all the variance and orders H within a position over all rows, as the headline would say. On the
    new-key rows, where H is graded, it orders nothing, and the verdict says so. With H's graded part on PC1
    as well, the same probe calls it supported."""
    rng = np.random.default_rng(0)
    batch = sawtooth.batch(rng, 300, V=8)
    cols = mf.supervised_columns(batch)
    seen = sawtooth.row_split(batch, cols)["seen key"]                    # (n, P)
    h = mf.wt.entropy_bits(batch["posterior"][:, cols])                  # (n, P) H_Bayes
    noise = lambda s: 0.05 * rng.standard_normal(seen.shape + (s,))
    split_only = lambda c: np.concatenate([10.0 * (~seen)[..., None], noise(5)], axis=-1)
    man, v = judged_manifold(batch, split_only)
    r = man["residual_final"]
    assert r["pc1_variance"] > 0.95 and r["mean_within_position_spearman"] > 0.6   # the headline: strong
    assert abs(r["within_position_spearman_graded"]) < 0.2                          # the control: nothing graded
    assert man["readout_baselines"]["within_position_r2_h_by_split"] > 0.95          # the split carries H
    assert v["verdict"].startswith("not supported")
    graded_too = lambda c: np.concatenate([(10.0 * (~seen) + 3.0 * h)[..., None], noise(5)], axis=-1)
    man, v = judged_manifold(batch, graded_too)
    assert man["residual_final"]["within_position_spearman_graded"] > 0.8
    assert v["verdict"].startswith("supported")


def test_one_outlier_position_carries_pc1_and_is_reported_without():
    """Position 0's rows sit 100 units out along one axis, the others are isotropic noise: PC1 holds nearly
    all the variance, all of it position 0's. The norm rule names position 0, and without it PC1 holds what
    isotropic noise in 6 dimensions gives (well under a half); unit rows remove it too."""
    rng = np.random.default_rng(1)
    batch = sawtooth.batch(rng, 200, V=8)
    outlier = np.zeros(6)
    outlier[0] = 100.0

    def rows(cols):
        X = rng.standard_normal((200, len(cols), 6))
        X[:, 0] += outlier                                             # the first answer position (position 0)
        return X
    man, _ = judged_manifold(batch, rows)
    r = man["residual_final"]
    assert r["dominant_positions"] == [0]
    assert r["pc1_variance"] > 0.99
    assert r["pc1_variance_without_dominant"] < 0.3
    assert r["pc1_variance_unit_rows"] < 0.5
    man, _ = judged_manifold(batch, lambda cols: rng.standard_normal((200, len(cols), 6)))
    assert man["residual_final"]["dominant_positions"] == []           # no outlier, nothing dropped


def test_cross_validated_readout_by_hand():
    """y = 2 x exactly: held-out R^2 1 (up to the ridge). y independent of x: held-out R^2 at or below 0
    (a readout cannot beat the mean out of sample), where the in-sample R^2 of a fit is always >= 0."""
    rng = np.random.default_rng(2)
    x, groups = rng.standard_normal((500, 1)), np.repeat(np.arange(100), 5)
    assert ms.cv_r_squared(x, 2 * x[:, 0], groups) == pytest.approx(1.0, abs=1e-4)
    y = rng.standard_normal(500)
    assert ms.cv_r_squared(x, y, groups) < 0.01 and ms.r_squared(x, y) >= 0.0
    wide = rng.standard_normal((500, 60))                              # 60 noise columns: in sample R^2 near
    assert ms.r_squared(wide, y) > 0.08 and ms.cv_r_squared(wide, y, groups) < 0.0   # 60 / 500, held out below 0
    assert ms.cv_r_squared(x, np.ones(500), groups) is None
    pos = np.tile(np.arange(5), 100)                                   # y = position + 3 x: the position leaves
    y = pos + 3 * x[:, 0]                                              # 3 x, all of which x explains
    assert ms.partial_cv_r_squared(x, y, groups, pos) == pytest.approx(1.0, abs=1e-3)
    assert ms.partial_cv_r_squared(rng.standard_normal((500, 1)), y, groups, pos) < 0.02
    # y a function of the position (format a's H): the ridge leaves a sliver of the variance, about 1e-5
    # here, and dividing by it would give any number (format a's default run read -56); none instead
    y = np.log2(20 - pos)
    assert 0.0 < 1.0 - ms.cv_r_squared(ms.onehot(pos), y, groups) < ms.POSITION_LEAVES
    assert ms.partial_cv_r_squared(x, y, groups, pos) is None


def test_the_partial_readouts_noise_over_its_folds_by_hand():
    """Folds full (1, 3, 2), base (2, 4, 8): the partial R^2 is 1 - 6/14 = 0.5714 (the mean of the folds'
    own 1 - full/base, 0.5, is another number); its SE by linearisation: residuals full - (6/14) base =
    (0.1429, 1.2857, -1.4286), sum of squares 3.7143, sqrt(3/2 x 3.7143) / 14 = 0.1686 (the folds' ratios'
    own SE, 0.1443, is another). The difference from another readout on the same folds, full (2, 5, 7):
    (14 - 6) / 14 = 0.5714, paired SE from (1, 2, 5) - 0.5714 x (2, 4, 8) = (-0.1429, -0.2857, 0.4286):
    sqrt(3/2 x 0.2857) / 14 = 0.0468 (unpaired, from the two SEs 0.1686 and 0.1237, it would be 0.209)."""
    f, g = {"full": [1, 3, 2], "base": [2, 4, 8]}, {"full": [2, 5, 7], "base": [2, 4, 8]}
    value, se = ms.partial_from_folds(f)
    assert value == pytest.approx(4 / 7) and se == pytest.approx(0.168599, abs=1e-6)
    d, dse = ms.partial_difference(f, g)
    assert d == pytest.approx(ms.partial_from_folds(f)[0] - ms.partial_from_folds(g)[0])
    assert d == pytest.approx(4 / 7) and dse == pytest.approx(0.046761, abs=1e-6)
    assert ms.partial_from_folds(None) == (None, None) and ms.partial_difference(f, None) == (None, None)
    with pytest.raises(ValueError, match="same rows and folds"):
        ms.partial_difference(f, {"full": [2, 5, 7], "base": [2, 4, 9]})
    # from data: the folds' sums give the same partial R^2 as the two held-out R^2 (the definition), and
    # cv_r_squared is 1 - the folds' sse over the total
    rng = np.random.default_rng(3)
    x, groups, pos = rng.standard_normal((500, 2)), np.repeat(np.arange(100), 5), np.tile(np.arange(5), 100)
    y = pos + x[:, 0] + rng.standard_normal(500)
    folds = ms.partial_cv_folds(x, y, groups, pos)
    full, base = ms.cv_r_squared(np.c_[x, ms.onehot(pos)], y, groups), ms.cv_r_squared(ms.onehot(pos), y, groups)
    assert len(folds["full"]) == ms.READOUT_FOLDS
    assert ms.partial_from_folds(folds)[0] == pytest.approx((full - base) / (1 - base))
    sse, sst = ms.cv_fold_sse(x, y, groups)
    assert ms.cv_r_squared(x, y, groups) == pytest.approx(1 - sse.sum() / sst) and 0 < ms.partial_from_folds(folds)[1] < 0.1


def test_a_sink_carries_the_entropy_drop_and_evidence_rows_do_not():
    """Rows that put all their mass on position 0 are as sharp (entropy 0) as rows on their evidence; the
    sink control tells them apart: share 1 against 0."""
    n, T = 4, 6
    cols = np.arange(T)
    sink = np.zeros((n, 1, T, T))
    sink[..., 0] = 1.0                                                 # every row on position 0
    diag = np.broadcast_to(np.eye(T), (n, 1, T, T)).copy()             # every row on itself (its evidence)
    s, d = mf.sink_stats(sink, cols), mf.sink_stats(diag, cols)
    assert s["sink_row_share"] == [1.0] and s["sink_share_of_entropy_drop"] == 1.0
    assert s["entropy_reduction_without_sink_rows"] is None            # nothing left once the sink rows go
    assert d["sink_row_share"] == [0.0] and d["sink_share_of_entropy_drop"] == 0.0
    assert d["entropy_reduction_without_sink_rows"] == pytest.approx(1.0)
    assert s["sink_share_of_entropy_drop_per_head"] == [1.0] and s["entropy_reduction_without_sink_rows_per_head"] == [None]
    assert d["sink_share_of_entropy_drop_per_head"] == [0.0]
    assert d["entropy_reduction_without_sink_rows_per_head"] == [pytest.approx(1.0)]
    assert d["entropy_reduction_without_sink_rows_se_per_head"] == [pytest.approx(0.0)]   # every sequence the same
    half = sink.copy()
    half[..., 0], half[..., 1:] = 0.6, np.tril(np.ones((T, T)))[:, 1:] * 0.4 / np.maximum(cols[:, None], 1)
    half[:, :, 0] = np.eye(T)[0]                                       # 0.6 on the sink, the rest spread
    assert mf.sink_stats(half, cols)["sink_row_share"] == [1.0]       # more than half: a sink row
    assert mf.sink_stats(half, cols)["sink_mass"] == [pytest.approx(0.6)]
    # two sequences, rows t = 1, 2 (H_uniform 1 and log2 3): one sharp (H = 0), one uniform. Per sequence the drop
    # is (1 + log2 3, 0) of (1 + log2 3) each: reduction 0.5, and its standard error by linearisation
    # sqrt(2 / 1 x 2 x (0.5 (1 + log2 3))^2) / (2 (1 + log2 3)) = 0.5
    two = np.zeros((2, 1, 3, 3))
    two[0, 0] = np.eye(3)
    two[1, 0] = [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]]
    st = mf.sink_stats(two, np.arange(3))
    assert st["sink_row_share"] == [0.0] and st["entropy_reduction_without_sink_rows_per_head"] == [pytest.approx(0.5)]
    assert st["entropy_reduction_without_sink_rows_se_per_head"] == [pytest.approx(0.5)]


def test_the_readout_from_the_output_is_a_baseline_beside_the_position():
    """H_Bayes = position + 3 x; a model whose predictive entropy is exactly H: its one column explains all that
    the position leaves (partial R^2 1); a model whose output is the same for every row explains nothing."""
    rng = np.random.default_rng(4)
    pos, seq = np.tile(np.arange(5), 100), np.repeat(np.arange(100), 5)
    x = rng.uniform(0, 0.2, 500)
    h = 0.1 * pos + x                                                  # H of a two-point distribution below
    grid = np.linspace(1e-9, 0.5, 20001)
    hgrid = -(grid * np.log2(grid) + (1 - grid) * np.log2(1 - grid))
    p = np.interp(h, hgrid, grid)                                     # the p with H(p, 1 - p) = h
    q = np.c_[p, 1 - p]
    out = mf.readout_baselines(h, pos, seq, q=q)
    assert out["output_entropy_partial"] == pytest.approx(1.0, abs=1e-3)
    flat = mf.readout_baselines(h, pos, seq, q=np.full((500, 2), 0.5))
    assert flat["output_entropy_partial"] < 0.01 and flat["output_log_probs_partial"] < 0.01


def test_query_swap_tells_a_fixed_preference_from_a_query():
    """Layer 0 of a tiny model: with W_Q = 0 and a large query bias every row scores the keys the same way
    whatever its query, a fixed preference; with a loud W_Q the row follows its query. The swap ratio
    (how much a row moves when only its query changes, over how much rows of two sequences differ) is far
    smaller for the first."""
    cfg = tiny_config(V=5, d_model=8, n_layers=1, n_heads=1)
    params = loud_params(cfg, std=1.5)
    batch = mf.probe_batch("bijection", cfg, 64, 0)
    aligned = mf.query_swap(params, cfg, batch, "bijection", n=64)["layers"][0]["ratio_mean"]
    fixed = dict(params)
    fixed["blocks.0.attn.wq"] = np.zeros_like(params["blocks.0.attn.wq"])
    fixed["blocks.0.attn.bq"] = 5.0 * np.ones_like(params["blocks.0.attn.bq"])
    ratio = mf.query_swap(fixed, cfg, batch, "bijection", n=64)["layers"][0]["ratio_mean"]
    assert ratio < 0.5 * aligned
    q = mf.query_swap(params, cfg, batch, "bijection", n=64)["layers"][0]
    assert 0.05 < q["between_tv_mean"] <= 1.0 and aligned < 5.0      # TV <= 1, so the ratio is at most 1 / between
    assert q["ratio"] == [pytest.approx(q["swap_tv"][0] / q["between_tv"][0])] and 0.0 < q["ratio_se"][0] < aligned
    swapped, ok = mf.task_module("bijection").swap_query(cfg, batch["tokens"], 4, np.random.default_rng(0))
    assert ok.all() and np.all(swapped[:, 4] != batch["tokens"][:, 4])
    assert np.all(swapped[:, :4] == batch["tokens"][:, :4]) and np.all(swapped[:, 5:] == batch["tokens"][:, 5:])
    for b in range(len(swapped)):                                      # a new key swapped for another new key
        assert swapped[b, 4] not in batch["tokens"][b, 0:4:2] and swapped[b, 4] < cfg.n_classes


def test_a_frame_that_never_leaves_its_initialisation():
    """A frame F_s = F_0 + (tiny random change) while the calibration improves 100x: the authors' reading sees
    a plateau at the first snapshot and a 100x gain after it (a dissociation). Measured on the change since
    initialisation there is no early plateau, and the initialisation already has the final overlap. A frame
    that moves along fixed directions by step 100 and then stops is supported by the same rule, beside a
    weight block W that changes only at the last step (the specificity control reads it)."""
    rng = np.random.default_rng(3)
    C, n, steps = 32, 6, [100, 200, 400, 800, 1600, 3200]
    F0 = rng.standard_normal((n, C))
    mae = [0.1 * 0.01 ** (i / (len(steps) - 1)) for i in range(len(steps))]       # 0.1 -> 0.001 bits
    still = [F0 + 1e-3 * rng.standard_normal((n, C)) for _ in steps]
    D = rng.standard_normal((n, C))
    moving = [F0 + min(1.0, s / 100) * D for s in steps]                           # moves along D until step 100
    W0, E = rng.standard_normal((n, C)), rng.standard_normal((n, C))
    for frames, expect in ((still, "not"), (moving, "supported")):
        params = [{"F": F, "W": W0 + (E if s == steps[-1] else 0.0), "mae": m} for F, m, s in zip(frames, mae, steps)]
        attention = [np.full((1, 1, 2, 2), 0.5)]                        # the same every step: not what is read here
        fp = formation.frame_precision(list(zip(steps, params)), lambda p: (attention, {"entropy_mae_bits": p["mae"], "kl_bits": p["mae"] / 2}),
                                       lambda p: p["F"], 4, C, init={"F": F0, "W": W0},
                                       other_inits=[{"F": rng.standard_normal((n, C))} for _ in range(3)])
        a, c = fp["authors"], fp["frame_change"]
        g = {"frame_precision": fp}
        v = verdicts.frame_precision(g)
        if expect == "not":
            assert a["frame_plateau_step"] == 100 and a["calibration_gain_after_plateau"] == pytest.approx(100.0)
            assert c["init_ratio"] == pytest.approx(a["ratio_to_chance"][-1], rel=1e-3)   # init = the final frame
            assert c["final_energy_in_init_span"] == pytest.approx(1.0, abs=1e-4)
            assert c["change_plateau_step"] == 3200 and c["calibration_gain_after_change_plateau"] == 1.0
            assert v["verdict"].startswith("not supported") and "carried by the initialisation" in v["verdict"]
        else:
            assert c["change_plateau_step"] == 100                     # the change has its final directions at once
            assert c["calibration_gain_after_change_plateau"] == pytest.approx(100.0)
            assert v["verdict"].startswith("supported") and c["stillness"] == pytest.approx(0.0, abs=1e-12)
            assert fp["blocks"]["W"]["plateau_step"] == 3200 and fp["blocks"]["F"]["plateau_step"] == 100
        assert np.mean(c["other_init_ratio"]) < 2.0                     # other seeds: near chance (ceiling C/n)


def test_ablation_methods_differ_on_a_head_whose_output_never_varies():
    """A head whose values are one constant vector (W_V = 0, b_V = c) outputs c at every position of every
    sequence. Zeroing it changes the model; replacing it by its mean (per position or overall) or by
    another sequence's output changes nothing, exactly: the methods answer differently, and only
    information the head carries survives all four."""
    cfg = tiny_config(V=4, d_model=8, n_layers=1, n_heads=2)
    params = loud_params(cfg)
    hs = cfg.d_model // cfg.n_heads
    params["blocks.0.attn.wv"][:, :hs] = 0.0
    params["blocks.0.attn.bv"][:hs] = 3.0                             # head 0's output: the constant (3, 3, 3, 3)
    batch = mf.probe_batch("bijection", cfg, 16, 0)
    abl = mf.ablations(params, cfg, batch)
    head0 = {m: next(r for r in abl["methods"][m]["heads"] if r["head"] == 0) for m in mf.ABLATIONS}
    assert abs(head0["zero"]["delta_kl_bits"]) > 1e-3
    for m in ("position_mean", "mean", "resample"):
        assert head0[m]["delta_kl_bits"] == pytest.approx(0.0, abs=1e-10), m
        assert head0[m]["delta_kl_se_bits"] == pytest.approx(0.0, abs=1e-10), m   # no sequence changes at all
    assert head0["zero"]["delta_kl_se_bits"] > 0.0
    assert "kl_by_sequence" not in head0["zero"] and "kl_by_sequence" not in abl["baseline"]
    post = batch["posterior"][:, mf.supervised_columns(batch)]
    assert abl["uniform_kl_bits"] == pytest.approx(float(np.mean(np.log2(cfg.n_classes) - mf.wt.entropy_bits(post))))


def test_key_offset_and_participation_ratio_by_hand():
    """Keys k_i = (3, e_i) in R^5, n = 4: their mean is (3, 1/n, ..., 1/n), so the offset is sqrt(9 + 1/n) and
    each deviation |e_i - 1/n| = sqrt(1 - 2/n + 1/n); every cosine is 9/10, all of it the offset's. The
    participation ratio of n orthonormal rows is n, of rows on one line 1, of eigenvalues (4, 1) 25/17."""
    n = 4
    K = np.c_[np.full(n, 3.0), np.eye(n)][None]                       # (1 head, n tokens, 5)
    s = mf.offset_stats(K)
    assert s["offset_norm"] == pytest.approx(np.sqrt(9 + n * (1 / n) ** 2))
    assert s["deviation_norm"] == pytest.approx(np.sqrt(1 - 2 / n + n / n ** 2))
    assert ms.mean_abs_offdiag(ms.cosine_matrix(K[0])) == pytest.approx(9 / 10)
    assert ms.participation_ratio(np.eye(n)) == pytest.approx(n)
    assert ms.participation_ratio(np.outer(np.arange(1, 4), [1.0, 2.0])) == pytest.approx(1.0)
    assert ms.participation_ratio(np.diag([2.0, 1.0])) == pytest.approx(25 / 17)
    assert ms.dominant([1, 1, 1, 6]) == [3] and ms.dominant([1, 1, 1, 4]) == []


def ablation_figure(monkeypatch, verdict, uniform=1.0, model=0.1):
    """Draw plots_geometry.plot_ablations on two heads and keep the figure: -> (suptitle, the red tick labels)."""
    from geometry import plots_geometry
    kept = {}
    monkeypatch.setattr(plots_geometry, "_save", lambda fig, path, dpi=120: kept.setdefault("fig", fig) and path)
    head = lambda l, h, d: dict(layer=l, head=h, delta_kl_bits=d, delta_kl_se_bits=0.01, kl_bits=model + d)
    methods = {m: {"heads": [head(0, 0, 0.8), head(0, 1, 0.6 if m == "position_mean" else 0.2)],
                   "layers": [dict(layer=0, kl_bits=0.9)]} for m in ("zero", "position_mean", "resample")}
    abl = dict(methods=methods, heads=[dict(layer=0, head=0), dict(layer=0, head=1)],
               baseline=dict(kl_bits=model), uniform_kl_bits=uniform)
    plots_geometry.plot_ablations(abl, "toy", "unused.png", verdict, 0.5, ("position_mean", "resample"))
    fig = kept["fig"]
    red = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_color() == "C3"]
    return fig._suptitle.get_text(), red


def test_the_ablation_figure_marks_the_heads_its_verdict_names(monkeypatch):
    """Red: the heads above the threshold under every method the rule reads (L0H0: both; L0H1: position mean
    only), never under a verdict that did not judge; the verdict's label is printed in the title, not its
    full sentence."""
    controls = {"position_mean": {"heads above the threshold": ["L0H0", "L0H1"]},
                "resample": {"heads above the threshold": ["L0H0"]},
                "zero": {"heads above the threshold": ["L0H0", "L0H1"]}}
    title, red = ablation_figure(monkeypatch, dict(outcome="supported", verdict="supported by KL: L0H0 raises the KL ...",
                                                   label="supported: L0H0 +1 bits", controls=controls))
    assert red == ["L0H0"] and "verdict: supported: L0H0 +1 bits" in title and "raises" not in title
    title, red = ablation_figure(monkeypatch, dict(outcome="not judged", verdict="not judged: not calibrated",
                                                   label="not judged: not calibrated", controls=controls))
    assert red == [] and "verdict: not judged: not calibrated" in title
    _, red = ablation_figure(monkeypatch, dict(outcome="supported", verdict="x", label="supported", controls=controls),
                                uniform=0.05)
    assert red == []                                         # a model worse than a uniform guess: no gap to judge


def test_uniform_kl_bits_by_hand():
    """KL(posterior || uniform) over 4 classes at the supervised rows only: a one-hot row is log2 4 = 2 bits,
    a uniform row 0, the row (1/2, 1/2, 0, 0) 1 bit; the unsupervised position (uniform) is left out:
    mean (2 + 2 + 0 + 1) / 4 = 1.25 bits (in nats 0.866; with the unsupervised row, 1.0)."""
    import manifold
    post = np.array([[[1, 0, 0, 0], [0, 0, 1, 0], [0.25] * 4, [0.5, 0.5, 0, 0], [0.25] * 4]], float)
    batch = dict(tokens=np.zeros((1, 5), int), posterior=post, mask=np.array([[1, 1, 1, 1, 0]]))
    assert manifold.uniform_kl_bits(batch) == pytest.approx(1.25, abs=1e-12)


def test_cluster_measures_by_hand():
    """nmi([0,0,1,1], [0,0,0,1]): H(a) = ln 2, H(b) = H(0.75, 0.25) = 0.5623 nats, I = 0.5 ln(4/3) + 0.25 ln(2/3)
    + 0.25 ln 2 = 0.2158; I / sqrt(H(a) H(b)) = 0.3456 (over the min 0.384, the mean 0.344, the max 0.311).
    cluster_share of 0, 2, 10, 12 in groups {0, 2}, {10, 12}: within 4, total 104 about the mean 6: 0.9615."""
    assert ms.nmi([0, 0, 1, 1], [0, 0, 0, 1]) == pytest.approx(0.34559, abs=1e-5)
    assert ms.nmi([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0) and ms.nmi([0, 0, 1, 1], [0, 1, 0, 1]) == 0.0
    assert ms.nmi([0, 0, 0, 0], [0, 1, 0, 1]) is None
    x = np.array([[0.0], [2.0], [10.0], [12.0]])
    assert ms.cluster_share(x, np.array([0, 0, 1, 1])) == pytest.approx(1 - 4 / 104)
    assert ms.cluster_share(x, np.array([0, 1, 1, 0])) == pytest.approx(0.0)      # both groups' mean is 6
    assert ms.cluster_share(np.ones((4, 2)), np.array([0, 0, 1, 1])) is None
    rng = np.random.default_rng(0)                                   # three blobs: k-means finds them
    truth = np.repeat(np.arange(3), 50)
    blobs = np.array([[0, 0], [5, 0], [0, 5]])[truth] + 0.3 * rng.standard_normal((150, 2))
    assert ms.nmi(ms.kmeans(blobs, 3), truth) == pytest.approx(1.0)


def test_the_cluster_probe_tells_state_clusters_from_the_posteriors_own():
    """States that are one blob per MAP state, tighter than the posterior: NMI 1, share beyond the
    posterior's; states that are the posterior itself (a linear copy): NMI as high, but nothing beyond it;
    states of noise: NMI near the shuffled labels'. The verdict reads each as supported / partly / not."""
    from geometry import state_clusters
    rng = np.random.default_rng(1)
    n_seq, T, K = 60, 10, 3
    seq = np.repeat(np.arange(n_seq), T)
    P = rng.dirichlet(np.full(K, 0.7), size=n_seq * T)                     # (N, K) graded posteriors
    labels = P.argmax(1)
    blobs = np.eye(K)[labels] * 4 + 0.1 * rng.standard_normal((len(P), K))  # one tight blob per MAP state
    copy = P @ rng.standard_normal((K, 6))                                   # the posterior, linearly
    noise = [rng.standard_normal((len(P), 6)) for _ in range(3)]
    judged = {}
    for name, X in (("blobs", blobs), ("copy", copy), ("noise", noise[0])):
        c = state_clusters.cluster_probe(X, P, seq, noise[1:])
        judged[name] = (c, verdicts.state_clusters({"clusters": c}))
    c, v = judged["blobs"]
    assert c["nmi"] == pytest.approx(1.0) and c["share_beyond_posterior"] > 0.2 and v["outcome"] == "supported"
    c, v = judged["copy"]
    assert c["nmi"] > 0.5 and abs(c["share_beyond_posterior"]) < 0.05 and v["outcome"] == "partly"
    c, v = judged["noise"]
    assert c["nmi"] < 0.05 and v["outcome"] == "not supported"
    assert sum(c["label_shares"]) == pytest.approx(1.0) and len(c["nmi_init_per_seed"]) == 2
    assert c["nmi_token"] is None                                           # no tokens given
    # states that are one blob per input token (the last observation), unrelated to the MAP state: the
    # token's NMI is 1, the state's near 0, and the verdict (which reads the state's alone) is not supported
    tokens = rng.integers(0, K, len(P))
    by_token = np.eye(K)[tokens] * 4 + 0.1 * rng.standard_normal((len(P), K))
    c = state_clusters.cluster_probe(by_token, P, seq, noise[1:], tokens=tokens)
    assert c["nmi_token"] == pytest.approx(1.0) and c["nmi"] < 0.05
    v = verdicts.state_clusters({"clusters": c})
    assert v["outcome"] == "not supported" and v["controls"]["NMI with the row's input token (outside the rule)"] == \
        pytest.approx(1.0)


def test_a_task_whose_rows_are_all_ungraded_is_probed_without_the_graded_controls():
    """Rows whose H_Bayes is only the split's (recall: 0 on a stored key, log2 of the values on another), so
    no row is graded: the controls run, report a graded share of 0 and none of the graded numbers (they
    raised IndexError on the empty selection before)."""
    from manifold import manifold_controls, readout_baselines
    rng = np.random.default_rng(0)
    n, P = 40, 3
    split = rng.integers(0, 2, n * P).astype(bool)
    h = np.where(split, 0.0, 5.0)
    pos, seq = np.tile(np.arange(P), n), np.repeat(np.arange(n), P)
    X = np.c_[h, rng.normal(size=(n * P, 3))]
    none = np.zeros(n * P, bool)
    out = manifold_controls(X, h, pos, seq, split, none)
    assert out["graded_share"] == 0.0 and "readout_r2_graded" not in out and "graded_refit" not in out
    assert out["readout_r2"] > 0.9                               # H is the first column: read back held out
    base = readout_baselines(h, pos, seq, split, none)
    assert "position_graded" not in base and base["split"] > 0.999       # (a ridge readout: not exactly 1)


def test_a_task_without_some_hooks_has_those_probes_skipped_and_the_others_run(tmp_path, monkeypatch):
    """The bijection without evidence_masks and swap_query (what the sharpening probe reads; frame-precision
    reads evidence_masks too) and token_names (the attention maps): the key frame, manifold, lens and
    ablations run and are judged; sharpening and frame-precision are neither measured nor judged, and each
    skip is named in one line."""
    from tunnels import bijection
    for hook in ("evidence_masks", "swap_query", "token_names"):
        monkeypatch.delattr(bijection, hook)
    cfg = tiny_config(dtype="float32")
    run = write_run(tmp_path, cfg, {"task": "bijection", "replacement": False})
    g = geometry.analyze(str(run / "checkpoint.npz"), fig_dir=str(tmp_path / "figs"), n_seqs=12, seed=0)
    assert g["attention"] is None and g["frame_precision"] is None and "sharpening" not in g["verdicts"]
    assert set(g["verdicts"]) == set(verdicts.CLAIMS) - {"state_clusters", "sharpening", "frame_precision"}
    assert g["skipped_probes"] == {"sharpening": "the task provides no evidence_masks, swap_query",
                                   "frame_precision": "the task provides no evidence_masks",
                                   "attention_maps": "the task provides no token_names"}
    assert all(g[k] is not None for k in ("key_frame", "manifold", "logit_lens", "ablations"))
    assert len(g["figures"]) == 4                                         # 7 less the three skipped
    text = geometry.summary(g)
    assert "skipped: sharpening: the task provides no evidence_masks, swap_query" in text
    assert "attention entropy by layer" not in text
