"""Tests for manifold.py: every probe on a tiny case whose answer is known; then geometry.py, which runs them
on a checkpoint, end to end."""
import json
import os

import manifold as mf  # first: bayesattn, imported by it, pins OpenBLAS to one thread before NumPy loads
import geometry  # noqa: E402
import bayesattn as ba
import checkpoints
import formation
import numpy as np
import pytest
import windtunnels as wt


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
    assert all(mf.mean_abs_offdiag(c) == pytest.approx(0.0, abs=1e-9) for c in cos)
    assert mf.gaussian_baseline(4, hs) > 0.2                         # random vectors are far from orthogonal
    params["blocks.0.attn.wk"][2, :] = 1.0                           # token 1's key is now 2 (1, 1, 1, 1) per head:
    want = 6 * 0.5 / 12                                              # cos 1/2 with each of the 3 others, 0 elsewhere
    got = mf.authors_key_frame(params, cfg, "sawtooth")              # the same keys by the authors' probe
    assert got["per_head"] == pytest.approx([want, want], rel=1e-6)
    cos = mf.key_frame(params, cfg, groups, recipe="authors")["keys"]
    assert [mf.mean_abs_offdiag(c) for c in cos] == pytest.approx([want, want], rel=1e-6)
    params["blocks.0.attn.bk"] = np.full(cfg.d_model, 3.0)            # the authors' key has no bias: no change
    assert mf.authors_key_frame(params, cfg, "sawtooth")["per_head"] == pytest.approx([want, want], rel=1e-6)


def test_welch_bound_is_met_by_the_regular_simplex():
    d = 5
    simplex = np.eye(d + 1) - 1.0 / (d + 1)                           # d + 1 unit-norm-able vectors in a d-dim subspace
    cos = mf.cosine_matrix(simplex)
    assert mf.rms_offdiag(cos) == pytest.approx(1.0 / d)              # cos = -1/d for every pair
    assert mf.welch_rms_bound(d + 1, d) == pytest.approx(1.0 / d)
    assert mf.welch_rms_bound(3, 5) == 0.0                            # n <= d: orthonormal sets exist


def test_centred_recipe_removes_a_shared_key():
    cfg = tiny_config()
    params = loud_params(cfg)
    groups = mf.token_groups("bijection", cfg, np.zeros((1, 6), dtype=int))
    k = mf.layer0_vectors(params, cfg, groups["keys"][0], np.zeros(cfg.d_model), "ln_centred")
    np.testing.assert_allclose(k.sum(1), 0.0, atol=1e-12)            # (NH, hs): a sum of zero over the tokens


# ----------------------------------------------------------------------------
# probe 2: evidence positions

def test_bijection_evidence_is_the_answer_when_a_key_repeats():
    V = 4
    tokens = np.array([[0, V + 2, 1, V + 3, 0, V + 2]])              # k0 v2 k1 v3 k0 v2
    m = mf.evidence_masks("bijection", tokens, np.array([0, 2, 4]))
    assert not m["consistent"][0, 0].any()                            # first key: no evidence yet
    np.testing.assert_array_equal(np.flatnonzero(m["consistent"][0, 1]), [1])     # new key: earlier values
    np.testing.assert_array_equal(np.flatnonzero(m["consistent"][0, 2]), [1])     # repeated k0: its value v2
    np.testing.assert_array_equal(np.flatnonzero(m["value"][0, 2]), [1, 3])


def test_hmm_evidence_is_the_emission_column_of_the_observation():
    batch = wt.hmm_batch(np.random.default_rng(0), 2, K=3)
    cols = mf.supervised_columns(batch)
    m = mf.evidence_masks("hmm", batch["tokens"], cols)
    for b in range(2):
        for p, t in enumerate(cols):
            o = batch["tokens"][b, t] - wt.HMM_OBS0
            np.testing.assert_array_equal(np.flatnonzero(m["consistent"][b, p]), 26 + 5 * np.arange(5) + o)
            T, E, _ = wt.hmm_detokenize(batch["tokens"][b])
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
        checkpoints.save_checkpoint(str(tmp_path / "snapshots" / f"step_{step:07d}.npz"), params, cfg, meta={"step": step})
    batch = mf.probe_batch("bijection", cfg, 8, 0)
    snaps = [(s, checkpoints.load_checkpoint(p)[0]) for s, p in formation.snapshot_paths(str(tmp_path))]
    fp = formation.frame_precision(snaps, lambda p: mf.snapshot_state(p, cfg, batch, "bijection"),
                                   lambda p, rank: mf.frame_basis(p, "bijection", cfg, rank), 8, cfg.d_model)
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
                           meta={"step": 10 ** (i + 1)})
    checkpoints.save_checkpoint(str(run / "checkpoint.npz"), ba.init_params(cfg, seeds[-1]), cfg, meta=meta)
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


def test_analyze_smoke_bijection(tmp_path):
    cfg = tiny_config(dtype="float32")
    run = write_run(tmp_path, cfg, {"task": "bijection", "replacement": False})
    g = geometry.analyze(str(run / "checkpoint.npz"), fig_dir=str(tmp_path / "figs"), n_seqs=12, seed=0)
    check_geometry(g, run, tmp_path / "figs")
    assert len(g["attention"]["layers"]) == cfg.n_layers
    assert g["frame_precision"]["steps"] == [10, 100]
    assert g["ablations"]["hypothesis_frame_head"]["name"].startswith("L")


def test_analyze_smoke_hmm(tmp_path):
    cfg = ba.Config(vocab_size=wt.HMM_VOCAB, n_classes=wt.HMM_S, max_len=wt.HMM_HEADER + 20, d_model=8,
                    n_layers=1, n_heads=2, pos="sinusoidal")
    run = write_run(tmp_path, cfg, {"task": "hmm", "replacement": False})
    g = geometry.analyze(str(run / "checkpoint.npz"), fig_dir=str(tmp_path / "figs"), n_seqs=3, seed=0)
    check_geometry(g, run, tmp_path / "figs")
    assert set(g["key_frame"]["ln"]) == {"observations", "probabilities"}


def test_bad_arguments_give_one_clear_line(tmp_path):
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 truncated")
    for args, expected in ((["missing.npz"], "checkpoint 'missing.npz' does not exist"),
                           (["broken.npz"], "is truncated or not a bayesattn checkpoint"),
                           (["broken.npz", "--n-seqs", "1"], "--n-seqs 1: must be at least 2"),
                           ([], "the following arguments are required: checkpoint")):
        proc = subprocess.run([sys.executable, os.path.join(here, "geometry.py"), *args], cwd=tmp_path,
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
    assert mf.r_squared(X[:100], h[:100]) is None and mf.pearson(X[:100, 0], h[:100]) is None


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
