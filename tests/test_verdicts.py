"""Tests for geometry/verdicts.py: every rule called on hand-built geometry.json-like inputs, one per branch, so that
a rule replaced by a constant verdict, or a control replaced by a constant, fails here; and the controls the
rules read (formation's stillness and specificity, the noise of the probes) on cases computed by hand."""
import copy
import math

import numpy as np
import pytest

from geometry import formation
from geometry import measures as ms
from geometry import verdicts as vd


@pytest.fixture(autouse=True)
def every_verdict_has_a_short_label(monkeypatch):
    """Every branch of every rule that a test below reaches returns a label for figures and the terminal: the
    outcome's word first, then what decided it, at most LABEL_MAX characters (the full verdict can be a
    paragraph; the label goes into a figure's title)."""
    def checked(claim, f):
        def g(*a, **k):
            v = f(*a, **k)
            assert v["label"].startswith(v["outcome"]), (claim, v["label"], v["outcome"])
            assert len(v["label"]) <= vd.LABEL_MAX, (claim, len(v["label"]), v["label"])
            return v
        return g
    for claim, f in list(vd.CLAIMS.items()):
        monkeypatch.setattr(vd, claim, checked(claim, f))
        monkeypatch.setitem(vd.CLAIMS, claim, checked(claim, f))


def test_labels_carry_the_deciding_numbers_by_hand():
    """The key frame at 0.30 against 0.17 as they are, 0.10 against 0.17 centred; the gate at KL 0.5 against
    a uniform guess's 1.1 (45%, not judged); the state clusters at NMI 0.80 against the initialisations' 0.10."""
    assert vd.key_frame({"authors": {"key_frame": key_frame_part(mean=0.30)}})["label"] == \
        "not supported: mean |cos| 0.300 (init 0.170), centred 0.100 (0.170)"
    judged = vd.judge(geometry(kl=0.5))
    assert judged["key_frame"]["label"] == "not judged: KL 0.5 bits, 45% of a uniform guess's (10% asked)"
    assert judged["key_frame"]["verdict"].startswith("not judged: not calibrated")
    assert vd.judge(geometry())["state_clusters"]["label"] == \
        "supported: NMI 0.80, beyond the posterior's share 0.20 (0.1 asked)"
    assert vd.lines({"key_frame": judged["key_frame"]}) == \
        ["key_frame: not judged: KL 0.5 bits, 45% of a uniform guess's (10% asked)"]
    # the HMM's published case: NMI 0.18 against 0.5 asked, its controls near 0
    low = vd.state_clusters({"clusters": cluster_part(nmi=0.18, init=(0.0, 0.0, 0.0), shuffled=(0.0, 0.001))})
    assert low["label"] == "not supported: NMI 0.18 (0.5 asked; init 0.00, shuffled 0.00)"
    # three essential heads and one near the threshold: the label names the largest essential one, not the near one
    abl = ablation_part({"position_mean": [1.0, 1.2, 1.1, 0.5], "resample": [1.0, 1.2, 1.1, 0.5]})
    for r in abl["methods"].values():                       # four heads in one layer
        r["heads"] = [{"layer": 0, "head": h, "delta_kl_bits": d, "delta_kl_se_bits": 0.0}
                      for h, d in enumerate([1.0, 1.2, 1.1, 0.5])]
    assert vd.frame_head({"ablations": abl})["label"] == "supported: L0H1 +1.2 bits (the largest of 3) (0.5 asked)"


def test_labels_stay_short_on_the_largest_inputs_the_presets_give():
    """The paper presets' largest numbers: a frame settling at step 104,000 of 130,000 with 39 other blocks, a
    model of 6 layers x 6 heads all aligned, six-digit KL rises: every label within LABEL_MAX (the fixture)."""
    big = frame_part(plateau=104000, gain_kl=1.05, stillness=0.0012, blocks=tuple([104000] * 39))
    big["steps"] = [100, 1000, 10000, 104000, 130000]
    assert vd.frame_precision({"frame_precision": big})["label"] == \
        "not supported: KL 1.05x after step 104000, still 0.0012, 39/39 blocks earlier"
    heads = [(0.9, 0.01, 0.0)] * 6
    sharp = vd.sharpening({"attention": attention([layer(heads)] * 6, [swap([0.6] * 6)] * 6)})
    assert sharp["label"] == "supported: aligned: 36 heads of 36; by layer yes"
    wide = vd.frame_head({"ablations": ablation_part({"position_mean": [123456.0, 0.1], "resample": [123456.0, 0.1]},
                                                     uniform=123457.0, model=0.1)})
    assert wide["label"] == "supported: L0H0 +1.23e+05 bits (6.17e+04 asked)"


# ----------------------------------------------------------------------------
# hand-built inputs: each part of a geometry.json that a rule reads, with its defaults stated

def spread(mean, sd):
    """Three seeds with this mean and sd (ddof 1): mean - sd, mean, mean + sd."""
    return [mean - sd, mean, mean + sd]


def key_frame_part(mean=0.10, centred=0.10, init=0.17, init_centred=0.17, sd=0.005):
    return {"hypotheses": 20, "per_head": [mean], "mean": mean, "random_init_mean": init,
            "random_init_per_seed": spread(init, sd), "centred_mean": centred,
            "random_init_centred_mean": init_centred, "random_init_centred_per_seed": spread(init_centred, sd),
            "offset_norm": 1.0, "deviation_norm": 1.0, "participation_ratio": 2.0,
            "participation_ratio_centred": 2.0, "welch_rms_lower_bound": 0.0}


def layer(heads, reduction=None):
    """heads: [(reduction without sink rows, its SE, sink share of the drop)] of one layer."""
    return {"entropy_reduction": reduction if reduction is not None else float(np.mean([h[0] or 0.0 for h in heads])),
            "entropy_reduction_per_head": [h[0] for h in heads],
            "entropy_reduction_without_sink_rows_per_head": [h[0] for h in heads],
            "entropy_reduction_without_sink_rows_se_per_head": [h[1] for h in heads],
            "sink_share_of_entropy_drop_per_head": [h[2] for h in heads]}


def swap(ratios, se=0.0):
    return {"ratio": list(ratios), "ratio_se": [se] * len(ratios)}


def attention(layers, swaps):
    return {"layers": layers, "query_swap": {"layers": swaps}}


FOLD_BASE = [10.0] * 5                                   # each fold's held-out sse from the position alone
PATTERNS = {"A": [1, -1, 1, -1, 0], "B": [1, 1, -1, -1, 0]}   # fold-to-fold spread that leaves the sums alone


def folds(r, spread=0.0, pattern="A"):
    """Folds of a partial readout r: full = (1 - r) x base, plus spread x a pattern summing to 0; its standard
    error over the folds is sqrt(5 / 4 x 4) x spread / 50 = 0.0447 x spread."""
    return None if r is None else {"full": [(1 - r) * b + spread * e for b, e in zip(FOLD_BASE, PATTERNS[pattern])],
                                   "base": list(FOLD_BASE)}


def manifold_part(pc1=0.3, within=0.2, readout=0.5, output=0.1, graded="every row", dominant=(0,),
                  readout_spread=0.0, output_spread=0.0, output_pattern="B", log_probs_spread=None):
    level = {k: v for g in ("", "_graded") for k, v in
             ((f"readout_partial_r2{g}", readout), (f"readout_partial_r2{g}_folds", folds(readout, readout_spread)))}
    other = {k: v for g in ("", "_graded") for k, v in
             ((f"readout_partial_r2{g}", None if readout is None else 0.0),
              (f"readout_partial_r2{g}_folds", None if readout is None else folds(0.0)))}
    outputs = {}
    for k, f in (("entropy", 1.0), ("log_probs", 0.5)):
        for g in ("", "_graded"):
            o = None if output is None else output * f
            outputs[f"output_{k}_partial{g}"] = o
            spread = log_probs_spread if k == "log_probs" and log_probs_spread is not None else output_spread
            outputs[f"output_{k}_partial{g}_folds"] = folds(o, spread, output_pattern)
    return {"residual_final": {"pc1_variance": 0.9, "pc1_variance_without_dominant": pc1,
                               "dominant_positions": list(dominant), "pc1_variance_unit_rows": pc1,
                               "mean_within_position_spearman": within, "within_position_spearman_graded": within,
                               "spearman_pc1_entropy": 0.5},
            "graded_rows": graded, "by_layer": {"residual": [other, level]}, "after_final_ln": other,
            "readout_baselines": {"position": 0.5, "position_graded": 0.5, **outputs}}


AUTHORS_MANIFOLD = {"pc1_variance": 0.2, "r2_top5": 0.3, "mean_within_position_r2_top5": 0.01}


def ablation_part(rises, uniform=1.1, model=0.1, se=0.0):
    """rises: {method: [KL rise of head 0, of head 1]} (one layer, two heads)."""
    methods = {}
    for m, r in rises.items():
        heads = [{"layer": 0, "head": h, "delta_kl_bits": d, "delta_kl_se_bits": se} for h, d in enumerate(r)]
        top = max(range(len(r)), key=lambda h: r[h])
        methods[m] = {"heads": heads, "by_kl": {"name": f"L0H{top}", "delta": r[top]},
                      "by_entropy_mae": {"name": "L0H0", "delta": 0.1}}
    return {"uniform_kl_bits": uniform, "baseline": {"kl_bits": model}, "methods": methods,
            "authors_frame_head": {"name": "L0H0", "delta_entropy_mae_bits": 0.1, "ratio_to_second": 2.0,
                                   "second": "L0H1"}}


def frame_part(plateau=200, gain_kl=40.0, stillness=0.1, blocks=(400, 800, None), init_ratio=1.0, last=4.0):
    steps = [100, 200, 400, 800, 1600]
    return {"steps": steps,
            "authors": {"ratio_to_chance": [2.0, last], "ratio_nearest_300": 2.0, "step_nearest_300": 400,
                        "frame_plateau_step": 100, "calibration_gain_after_plateau": 50.0},
            "frame_change": {"init_ratio": init_ratio, "other_init_ratio": [1.0, 1.1],
                             "final_energy_in_init_span": 0.5, "chance_energy_in_init_span": 0.1,
                             "change_plateau_step": plateau, "calibration_gain_kl_after_change_plateau": gain_kl,
                             "calibration_gain_after_change_plateau": None if gain_kl is None else gain_kl / 2,
                             "moved_before_change_plateau": 1.0, "moved_after_change_plateau": stillness,
                             "stillness": stillness},
            "blocks": {f"block{i}": {"plateau_step": p, "gain_kl": 1.0, "stillness": 1.0} for i, p in enumerate(blocks)}}


def cluster_part(nmi=0.8, nmi_se=0.02, init=(0.1, 0.12, 0.08), shuffled=(0.001, 0.001), beyond=0.2, beyond_se=0.02):
    return {"k": 5, "rows": 1000, "label_shares": [0.2] * 5, "nmi": nmi, "nmi_se": nmi_se, "nmi_folds_mean": nmi,
            "share": 0.7, "nmi_init_per_seed": list(init), "share_init_per_seed": [0.3] * len(init),
            "nmi_shuffled_mean": shuffled[0], "nmi_shuffled_sd": shuffled[1], "posterior_share": 0.5,
            "share_beyond_posterior": beyond, "share_beyond_posterior_se": beyond_se}


def geometry(kl=0.01, uniform=1.1, **parts):
    """A whole geometry.json-like dict, each part a default that judges to a known outcome."""
    g = {"authors": {"key_frame": key_frame_part(), "manifold": AUTHORS_MANIFOLD},
         "attention": attention([layer([(0.9, 0.01, 0.0)]), layer([(0.9, 0.01, 0.0)])], [swap([0.6]), swap([0.6])]),
         "manifold": manifold_part(),
         "ablations": ablation_part({"position_mean": [1.0, 0.1], "resample": [1.0, 0.1], "zero": [2.0, 2.0]},
                                    uniform=uniform, model=kl),
         "frame_precision": frame_part(), "clusters": cluster_part(), "task": "bijection", "settings": {},
         "config": {"d_model": 8},
         "step": 3000, "train_seed": 0}
    g.update(parts)
    return g


# ----------------------------------------------------------------------------
# the margins

def test_compare_decides_only_outside_the_noise_and_the_marginal_band():
    """Threshold 1: the noise band is 2 x 0.05 = 0.1 wide on each side, the marginal band 10% of 1."""
    assert vd.compare(1.5, 1.0) == "above" and vd.compare(0.5, 1.0) == "below"
    assert vd.compare(1.08, 1.0, noise=0.05) == "undecided" and vd.compare(0.91, 1.0, noise=0.05) == "undecided"
    assert vd.compare(1.12, 1.0, noise=0.05) == "above"               # outside both bands
    assert vd.compare(1.08, 1.0) == "marginal" and vd.compare(0.95, 1.0) == "marginal"
    assert vd.compare(1.08, 1.0, noise=None) == "marginal"
    assert vd.unsettled(["above", "undecided"]) == "undecided" and vd.unsettled(["marginal", "below"]) == "marginal"


def test_noise_of_a_mean_and_of_a_ratio_by_hand():
    """mean_se([1, 2, 3, 4]) = sd 1.2910 / 2; the ratio of sums (1 + 2) / (2 + 2) = 0.75 with residuals
    1 - 1.5 = -0.5 and 2 - 1.5 = 0.5: se = sqrt(2 / 1 x 0.5) / 4 = 0.25; seed_sd of (1, 2, 3) = 1."""
    assert ms.mean_se([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3) / 2)
    assert ms.mean_se([3.0]) == 0.0
    assert ms.ratio_se([1, 2], [2, 2]) == (pytest.approx(0.75), pytest.approx(0.25))
    assert ms.ratio_se([1, 2], [0, 0]) == (None, None)
    assert ms.seed_sd([1, 2, 3]) == pytest.approx(1.0) and ms.seed_sd([2]) == 0.0


# ----------------------------------------------------------------------------
# the gate

def test_an_uncalibrated_run_is_not_judged_on_any_claim():
    """The HMM default's KL 0.20 bits against a uniform guess's 0.42 (48%): every claim 'not judged', the KL
    named. At 0.01 of 1.1 (0.9%) the same numbers are judged; exactly at 10% the gate still refuses."""
    v = vd.judge(geometry(kl=0.20, uniform=0.42))
    assert set(v) == set(vd.CLAIMS)
    for claim, d in v.items():
        assert d["outcome"] == "not judged" and d["verdict"].startswith("not judged: not calibrated (KL 0.2 bits, 48%")
        assert d["rule"] == vd.RULES[claim]
    judged = vd.judge(geometry())
    assert all(d["outcome"] != "not judged" for d in judged.values())
    assert all(d["outcome"] == "not judged" for d in vd.judge(geometry(kl=0.2, uniform=2.0)).values())
    assert vd.calibration_gate(geometry(kl=0.199, uniform=2.0))[0]
    # a task whose every answer is uniform: the uniform guess is exact, nothing is judged, and it says why
    # (it divided by zero after training, found with a throwaway task)
    v = vd.judge(geometry(kl=0.01, uniform=0.0))
    assert all("a uniform guess is exact" in d["verdict"] for d in v.values())


# ----------------------------------------------------------------------------
# claim 1: the key frame

@pytest.mark.parametrize("part, outcome", [
    (key_frame_part(), "supported"),                                  # 0.10 against 0.17 +- 0.005, both ways
    (key_frame_part(mean=0.30), "not supported"),                     # as they are, less orthogonal
    (key_frame_part(centred=0.30), "not supported"),                  # centred, less orthogonal
    (key_frame_part(mean=0.2505, init=0.2529, centred=0.2505, init_centred=0.2529, sd=0.0175), "undecided"),
    (key_frame_part(mean=0.16, sd=0.001), "marginal"),                # 0.01 below: outside 2 sd, inside 10%
    (key_frame_part(mean=0.165), "undecided"),                        # as they are inside 2 sd; centred below
])
def test_key_frame_rule_reads_both_comparisons_and_the_seed_spread(part, outcome):
    """The fourth case is the issue's untrained model: 0.2505 against 0.2529, seeds spread by 0.0175."""
    v = vd.key_frame({"authors": {"key_frame": part}})
    assert v["outcome"] == outcome and v["verdict"].startswith(outcome)
    assert "init sd" in v["margin"]


# ----------------------------------------------------------------------------
# claim 2: sharpening, per head

@pytest.mark.parametrize("head, ratio, se, kind", [
    ((0.9, 0.01, 0.0), 0.6, 0.01, "query-key alignment"),
    ((0.9, 0.01, 0.6), 0.6, 0.01, "query-key alignment beside a sink"),
    ((0.1, 0.01, 0.9), 0.05, 0.01, "sink"),
    ((0.8, 0.01, 0.0), 0.03, 0.01, "fixed preference"),
    ((0.8, 0.01, 0.0), 0.15, 0.01, "weak"),
    ((0.2, 0.01, 0.0), 0.6, 0.01, "weak"),                            # follows its query, but not sharp
    ((0.52, 0.02, 0.0), 0.6, 0.01, "undecided"),                      # 0.02 above 50%, inside 2 SE (0.04)
    ((0.53, 0.0, 0.0), 0.6, 0.0, "marginal"),                         # 0.03 above, inside 10% of 50%
    ((0.9, 0.01, 0.0), 0.27, 0.02, "undecided"),                      # the swap within 2 SE of 0.25
    ((None, None, 1.0), 0.6, 0.0, "sink"),                            # every row a sink row
])
def test_head_kind_branches(head, ratio, se, kind):
    assert vd.head_kind(layer([head]), swap([ratio], se), 0) == kind


def test_sharpening_is_judged_per_head_and_layer_by_layer_by_the_rule():
    """The issue's layer: L1H0 55% below uniform without a sink, L1H1 89% with sink rows carrying 62% of its
    drop, both following the query: two aligned heads, one beside a sink, named separately; a pooled
    layer would hide the sink's head. Layer 0 a fixed preference: one aligned layer, so not layer by layer
    even though the reductions rise (the sawtooth's 38 -> 93%)."""
    l0, l1 = layer([(0.38, 0.01, 0.0), (0.38, 0.01, 0.0)]), layer([(0.55, 0.01, 0.0), (0.89, 0.01, 0.62)])
    s0, s1 = swap([0.05, 0.05]), swap([0.4, 0.6], 0.01)
    v = vd.sharpening({"attention": attention([l0, l1], [s0, s1])})
    assert v["outcome"] == "partly" and not v["layer_by_layer"]
    assert v["verdict"].startswith("partly: query-key alignment in L1H0, L1H1; layer by layer: no (the reductions rise")
    assert v["controls"]["L1H1"]["kind"] == "query-key alignment beside a sink"
    assert v["controls"]["L1H0"]["kind"] == "query-key alignment" and v["controls"]["L0H1"]["kind"] == "fixed preference"
    # two aligned layers, reductions rising: layer by layer
    v = vd.sharpening({"attention": attention([l1, layer([(0.95, 0.01, 0.0)] * 2)], [s1, s1])})
    assert v["outcome"] == "supported" and v["layer_by_layer"] and "layer by layer: yes" in v["verdict"]
    # the same two aligned layers, the reduction falling: partly
    v = vd.sharpening({"attention": attention([layer([(0.95, 0.01, 0.0)] * 2), l1], [s1, s1])})
    assert v["outcome"] == "partly" and "do not rise" in v["verdict"]
    # no head aligns: not supported; a head near the threshold: undecided
    v = vd.sharpening({"attention": attention([l0, l0], [s0, s0])})
    assert v["outcome"] == "not supported" and v["margin"] is None
    near = layer([(0.52, 0.02, 0.0)])
    v = vd.sharpening({"attention": attention([near], [swap([0.6])])})
    assert v["outcome"] == "undecided" and "L0H0" in v["margin"]
    v = vd.sharpening({"attention": attention([layer([(0.53, 0.0, 0.0)])], [swap([0.6])])})
    assert v["outcome"] == "marginal"
    # a layer 93% below uniform in the headline, all of it sink rows': its head is 30% below uniform without
    # them, so a sink, whatever the pooled number says
    v = vd.sharpening({"attention": attention([layer([(0.3, 0.01, 0.9)], reduction=0.93)], [swap([0.6])])})
    assert v["outcome"] == "not supported" and v["controls"]["L0H0"]["kind"] == "sink"


# ----------------------------------------------------------------------------
# claim 3: the manifold

@pytest.mark.parametrize("kw, outcome, text", [
    (dict(within=None), "cannot be told", "cannot be told from the position"),
    (dict(readout=None), "cannot be told", "cannot be told from the position"),
    (dict(pc1=0.8, within=0.8), "supported", "supported: PC1 orders"),
    (dict(pc1=0.52, within=0.8), "marginal", "marginal: PC1 near"),
    (dict(), "elsewhere", "not on PC1 (without the dominating position 0 PC1 holds 30%"),
    (dict(readout=0.05), "not supported", "not supported: not on PC1"),
    (dict(readout=0.5, output=0.45), "not supported", "readable, but no more than from the model's own output"),
    (dict(readout=0.5, output=0.405), "marginal", "marginal: not on PC1"),  # 0.095 beyond: within 10% of 0.1
    (dict(output=None), "undecided", "undecided: not on PC1"),        # no output readout: cannot count it
    (dict(graded="40.0% of the rows", dominant=()), "elsewhere", "not on PC1 (PC1 holds 30%"),
    # the readout's fold-to-fold noise: 0.25 is 0.05 above 0.2, within 2 x 0.0447 (spread 1): undecided
    (dict(readout=0.25), "elsewhere", "explains 25%"),
    (dict(readout=0.25, readout_spread=1.0), "undecided", "undecided: not on PC1"),
    (dict(readout=0.15, readout_spread=1.0), "undecided", "undecided: not on PC1"),
    (dict(readout=0.1, readout_spread=1.0), "not supported", "not supported: not on PC1"),   # 0.1 below: 2.2 SE
    # beyond the output: 0.12 against 0.1; the output's folds spread on another pattern: undecided
    (dict(readout=0.5, output=0.38), "elsewhere", "graded entropy lies elsewhere"),
    (dict(readout=0.5, output=0.38, output_spread=1.0), "undecided", "undecided: not on PC1"),
    (dict(readout=0.5, output=0.42, output_spread=1.0), "undecided", "undecided: not on PC1"),  # 0.08: not below
    # ... but the same spread on the same folds cancels in the paired difference (unpaired it would not)
    (dict(readout=0.5, output=0.38, readout_spread=1.0, output_spread=1.0, output_pattern="A"), "elsewhere",
     "graded entropy lies elsewhere"),
    # the noise is the folds of the output readout that is compared (the entropy's, 0.38), not the other's
    (dict(readout=0.5, output=0.38, log_probs_spread=3.0), "elsewhere", "graded entropy lies elsewhere"),
])
def test_manifold_rule_branches(kw, outcome, text):
    v = vd.manifold({"manifold": manifold_part(**kw), "authors": {"manifold": AUTHORS_MANIFOLD}})
    assert v["outcome"] == outcome and v["verdict"].startswith(outcome if outcome != "elsewhere" else "not on PC1")
    assert text in v["verdict"], v["verdict"]


def test_the_manifold_rule_reports_the_folds_noise_and_needs_the_folds():
    g = {"manifold": manifold_part(readout=0.25, readout_spread=1.0, output=0.1, output_spread=2.0),
         "authors": {"manifold": AUTHORS_MANIFOLD}}
    v = vd.manifold(g)
    se = 5 ** 0.5 / 50                                   # 0.0447 per unit of spread
    assert v["controls"]["its standard error over the folds"] == pytest.approx(se)
    # the difference's folds: output (pattern B, spread 2) minus readout (pattern A, spread 1): residuals
    # 2B - A = (1, 3, -3, -1, 0), sum of squares 20: sqrt(5 / 4 x 20) / 50 = 0.1
    paired = v["controls"]["the same beyond the output's readout, standard error over the folds (paired)"]
    assert paired == pytest.approx(0.1)
    assert "SE 0.04 over the folds" in v["margin"] and "(SE 0.10; 0.1 asked)" in v["margin"]
    del g["manifold"]["by_layer"]["residual"][1]["readout_partial_r2_folds"]
    with pytest.raises(ValueError, match="readout_partial_r2_folds"):
        vd.manifold(g)


# ----------------------------------------------------------------------------
# the state clusters (probe 7)

@pytest.mark.parametrize("kw, outcome, text", [
    (dict(), "supported", "supported: one discrete cluster per hidden state (NMI 0.80"),
    (dict(nmi=None), "cannot be told", "one MAP state on every row"),
    (dict(init=()), "cannot be told", "no initialisation"),
    (dict(nmi=0.3), "not supported", "fails against the threshold"),
    (dict(init=(0.9, 0.92, 0.88)), "not supported", "fails against the random initialisation"),     # sd 0.02
    (dict(shuffled=(0.95, 0.01)), "not supported", "fails against the shuffled labels"),
    (dict(nmi=0.52), "undecided", "undecided: NMI 0.52 near a control"),          # 0.02 within 2 x 0.02
    (dict(nmi=0.54, nmi_se=0.0), "marginal", "marginal: NMI 0.54"),               # within 10% of 0.5
    (dict(init=(0.76, 0.78, 0.74)), "undecided", "near a control"),               # 0.04 within 2 x sd 0.02
    (dict(beyond=-0.05), "partly", "no more discretely than the exact posterior itself"),
    (dict(beyond=0.13), "undecided", "discreteness near its threshold"),           # 0.03 within 2 x 0.02
    (dict(beyond=0.105, beyond_se=0.0), "marginal", "discreteness near its threshold"),
    (dict(beyond=None), "undecided", "discreteness near its threshold"),
])
def test_state_cluster_rule_branches(kw, outcome, text):
    v = vd.state_clusters({"clusters": cluster_part(**kw)})
    assert v["outcome"] == outcome and v["verdict"].startswith(outcome), v["verdict"]
    assert text in v["verdict"], v["verdict"]


def test_state_clusters_are_not_measured_without_a_hidden_state():
    assert "state_clusters" not in vd.judge({**geometry(), "clusters": None})       # not judged by default ...
    v = vd.judge({**geometry(), "clusters": None}, claims=("state_clusters",))["state_clusters"]   # ... nor measured
    assert v["outcome"] == "not measured" and "names no hidden state" in v["verdict"]
    assert vd.judge(geometry(kl=0.5))["state_clusters"]["outcome"] == "not judged"    # the gate holds here too


# ----------------------------------------------------------------------------
# claim 4: an essential head

def test_frame_head_reads_the_rise_under_every_in_distribution_ablation():
    """Uniform guess 1.1 bits, model 0.1: the gap is 1.0, the threshold 0.5 bits of added KL."""
    judge = lambda rises, **kw: vd.frame_head({"ablations": ablation_part(rises, **kw)})
    v = judge({"position_mean": [0.9, 0.1], "resample": [0.7, 0.1], "zero": [0.0, 0.0]})
    assert v["outcome"] == "supported" and v["verdict"].startswith("supported by KL: removing L0H0 adds +0.9 (position_mean), +0.7 (resample)")
    assert "no probe ties this head to a hypothesis frame" in v["verdict"] and "frame head" not in v["verdict"]
    assert "L0H0: +0.9 (position_mean), +0.7 (resample) bits against 0.5" in v["margin"]
    # the level is below the uniform guess (0.1 + 0.9 = 1.0 < 1.1), the rise is what counts
    # essential under one in-distribution method only: not essential
    v = judge({"position_mean": [0.9, 0.1], "resample": [0.2, 0.1]})
    assert v["outcome"] == "not supported"
    # zeroing costs a lot, the in-distribution methods little: not read, but reported
    v = judge({"position_mean": [0.2, 0.1], "resample": [0.2, 0.1], "zero": [3.0, 0.1]})
    assert v["outcome"] == "not supported" and "zero: L0H0" in v["verdict"]
    # near the threshold: within 2 SE undecided, within 10% marginal
    assert judge({"position_mean": [0.55, 0.1], "resample": [0.9, 0.1]}, se=0.03)["outcome"] == "undecided"
    assert judge({"position_mean": [0.53, 0.1], "resample": [0.9, 0.1]})["outcome"] == "marginal"
    # two heads each essential: both named
    v = judge({"position_mean": [0.9, 0.8], "resample": [0.9, 0.8]})
    assert "removing L0H0 adds +0.9 (position_mean), +0.9 (resample) bits; L0H1 adds +0.8" in v["verdict"]
    assert "these heads" in v["verdict"]
    # a model worse than a uniform guess (the quick preset, 1.881 against 1.857): not judged, whatever the rises
    v = judge({"position_mean": [0.9, 0.8], "resample": [0.9, 0.8]}, uniform=1.857, model=1.881)
    assert v["outcome"] == "not judged" and "no better than a uniform guess" in v["verdict"]
    assert judge({"zero": [3.0, 3.0]})["outcome"] == "not judged"     # no in-distribution method measured


# ----------------------------------------------------------------------------
# claim 5: frame before precision

@pytest.mark.parametrize("kw, outcome, text", [
    (dict(), "supported", "supported: the change since initialisation settles at step 200"),
    (dict(gain_kl=5.0), "weak", "weak"),
    (dict(gain_kl=1.5), "not supported", "not supported: the KL improves only 1.5x"),
    (dict(stillness=3.0), "not supported", "not supported: the frame still moves after its plateau (3x"),
    (dict(blocks=(100, 200, 400)), "not supported", "not supported: not specific to the frame: 2 of 3"),
    (dict(stillness=0.47), "marginal", "marginal"),
    (dict(gain_kl=10.5), "marginal", "marginal"),
    (dict(plateau=None), "not supported", "not supported: the change since initialisation never settles"),
    (dict(blocks=()), "not measured", "not measured"),
    (dict(gain_kl=None), "not measured", "not measured"),
])
def test_frame_precision_rule_branches(kw, outcome, text):
    v = vd.frame_precision({"frame_precision": frame_part(**kw)})
    assert v["outcome"] == outcome and v["verdict"].startswith(text), v["verdict"]


def test_frame_precision_names_a_reading_carried_by_the_initialisation():
    carried = vd.frame_precision({"frame_precision": frame_part(init_ratio=3.0, last=4.0)})["verdict"]
    assert "carried by the initialisation (3.00x of 4.00x already at step 0)" in carried
    assert "carried" not in vd.frame_precision({"frame_precision": frame_part(init_ratio=1.0, last=4.0)})["verdict"]
    assert vd.frame_precision({"frame_precision": None})["outcome"] == "not measured"


def frames_moving(steps, along, C=16, n=4, seed=0):
    """Frames F_s = F_0 + along(s) D (D fixed): the change has its final direction from the start."""
    rng = np.random.default_rng(seed)
    F0, D = rng.standard_normal((n, C)), rng.standard_normal((n, C))
    return F0, [F0 + along(s) * D for s in steps]


def test_stillness_sees_a_frame_that_keeps_moving():
    """The issue's two frames: one that moves at a constant rate to the last step, one that moves 99% of
    its way in the last interval; both change along one fixed direction, so the overlap reading puts their
    plateau at the first snapshot. The stillness reads how far they move after it against before:
    (3200 - 100) / 100 = 31 for the first, 0.99 / 0.01 = 99 for the second. A frame that stops at step 200
    moves 0.5 before the plateau at 100 and 0.5 after it (1); one that stops at step 100, 0."""
    steps = [100, 200, 400, 800, 1600, 3200]
    mae = [0.1 / 2 ** i for i in range(len(steps))]                   # 0.1 -> 0.003125: gain 32
    kl = [m / 2 for m in mae]
    for along, stillness in ((lambda s: s / 3200, 31.0), (lambda s: 0.01 if s < 3200 else 1.0, 99.0),
                             (lambda s: min(1.0, s / 200), 1.0), (lambda s: 1.0, 0.0)):
        F0, frames = frames_moving(steps, along)
        c = formation.change_settling(steps, frames, F0, mae, kl, 2)
        assert c["plateau_step"] == 100
        assert c["stillness"] == pytest.approx(stillness, abs=1e-9)
        assert c["gain_entropy_mae"] == pytest.approx(32.0) and c["gain_kl"] == pytest.approx(32.0)
    F0, frames = frames_moving(steps, lambda s: s / 3200)
    c = formation.change_settling(steps, frames, F0, mae, [1.0, 1.0, 1.0, 1.0, 1.0, 0.5], 2)
    assert c["gain_kl"] == pytest.approx(2.0)                         # the KL's own gain, not the paper metric's
    assert formation.change_settling(steps, [F0] * len(steps), F0, mae, kl, 2)["plateau_step"] is None


def test_specificity_measures_every_weight_block_the_same_way():
    """Two blocks: 'early' changes along one direction and stops at step 200, 'late' takes a new direction
    at step 1600. Each is read as rows in its larger dimension (a (16, 4) block transposed)."""
    steps = [100, 200, 400, 800, 1600]
    rng = np.random.default_rng(1)
    init = {"early": rng.standard_normal((4, 16)), "late": rng.standard_normal((16, 4)), "bias": np.zeros(4)}
    D1, D2 = rng.standard_normal((4, 16)), rng.standard_normal((16, 4))
    snaps = [{"early": init["early"] + min(1.0, s / 200) * D1,
              "late": init["late"] + 0.01 * D1.T + (D2 if s >= 1600 else 0.0), "bias": np.zeros(4)} for s in steps]
    mae = [1.0, 0.5, 0.25, 0.125, 0.0625]
    out = formation.block_settling(steps, snaps, init, mae, mae, 2)
    assert set(out) == {"early", "late"}                              # 2-D blocks only
    assert out["early"]["plateau_step"] == 100 and out["early"]["stillness"] == pytest.approx(1.0)
    assert out["late"]["plateau_step"] == 1600 and out["late"]["gain_kl"] == pytest.approx(1.0)
    assert formation.oriented(np.zeros((16, 4))).shape == (4, 16) and formation.oriented(np.zeros((4, 16))).shape == (4, 16)


def test_frame_change_reports_the_new_controls_beside_the_old():
    steps = [100, 200, 400]
    F0, frames = frames_moving(steps, lambda s: min(1.0, s / 200))
    c = formation.frame_change(steps, frames, [0.4, 0.2, 0.1], F0, [], 2, 16, kl=[0.8, 0.2, 0.1])
    assert c["change_plateau_step"] == 100 and c["calibration_gain_after_change_plateau"] == pytest.approx(4.0)
    assert c["calibration_gain_kl_after_change_plateau"] == pytest.approx(8.0)
    assert c["stillness"] == pytest.approx(1.0)
    assert c["moved_before_change_plateau"] == pytest.approx(0.5 * np.linalg.norm(frames[-1] - F0))


def test_the_initialisation_overlap_is_near_chance_for_a_frame_that_moves_away():
    """F_0 random, the final frame F_0 + 10 D: the final frame is mostly D, so the initial frame's overlap
    with it is far below the ceiling (C / n = 4), and the verdict does not say 'carried'."""
    steps = [100, 200, 400]
    F0, frames = frames_moving(steps, lambda s: 10.0 * min(1.0, s / 200))
    c = formation.frame_change(steps, frames, [0.4, 0.2, 0.1], F0, [], 2, 16)
    ceiling = formation.ceiling(4, 2, 16)
    assert ceiling == pytest.approx(4.0) and c["init_ratio"] < 0.5 * ceiling


# ----------------------------------------------------------------------------
# several seeds

def test_combine_states_agreement_and_refuses_other_commands():
    a, b = geometry(train_seed=0), geometry(train_seed=1)
    out = vd.combine([a, b])
    assert set(out) == set(vd.CLAIMS)
    assert out["key_frame"]["outcome"] == "supported" and out["key_frame"]["agreement"] == "all 2 seeds agree"
    assert set(out["key_frame"]["per_seed"]) == {"seed 0", "seed 1"}
    b["authors"]["key_frame"] = key_frame_part(mean=0.30)
    out = vd.combine([a, b])
    assert out["key_frame"]["outcome"] == "undecided"
    assert out["key_frame"]["agreement"] == "the seeds disagree: seed 0 supported, seed 1 not supported"
    assert out["frame_head"]["outcome"] == "supported"               # the other claims still agree
    c = geometry(train_seed=1, kl=0.5)                                # uncalibrated: not judged, so they disagree
    assert vd.combine([a, c])["manifold"]["outcome"] == "undecided"
    with pytest.raises(ValueError, match="differ in config"):
        vd.combine([a, geometry(train_seed=1, config={"d_model": 16})])
    with pytest.raises(ValueError, match="training seeds 0, 0"):
        vd.combine([a, geometry(train_seed=0)])
    with pytest.raises(ValueError, match="1 run given"):
        vd.combine([a])
    # a family without attention judged the manifold alone (and the state clusters): only those combine
    a, b = geometry(train_seed=0), geometry(train_seed=1)
    for g in (a, b):
        g["verdicts"] = {"manifold": {}, "state_clusters": {}}          # what its geometry.json judged
    out = vd.combine([a, b])
    assert set(out) == {"manifold", "state_clusters"} and out["state_clusters"]["agreement"] == "all 2 seeds agree"
    b["verdicts"] = {"manifold": {}}
    with pytest.raises(ValueError, match="judged different claims"):
        vd.combine([a, b])


def test_every_claim_gives_its_default_outcome_and_each_one_moves():
    """The defaults of geometry() judge to known outcomes; changing one part changes that claim only."""
    base = vd.judge(geometry())
    assert {c: d["outcome"] for c, d in base.items()} == {
        "key_frame": "supported", "sharpening": "supported", "manifold": "elsewhere", "frame_head": "supported",
        "frame_precision": "supported", "state_clusters": "supported"}
    g = geometry()
    g2 = copy.deepcopy(g)
    g2["frame_precision"] = frame_part(stillness=2.0)
    moved = vd.judge(g2)
    assert moved["frame_precision"]["outcome"] == "not supported"
    assert all(moved[c]["outcome"] == base[c]["outcome"] for c in vd.CLAIMS if c != "frame_precision")


def test_geometry_combine_prints_one_verdict_per_claim_and_refuses_in_one_line(tmp_path, capsys):
    import json
    from geometry import run as geometry_py
    paths = []
    for seed in (0, 1):
        paths.append(str(tmp_path / f"s{seed}.json"))
        with open(paths[-1], "w") as f:
            json.dump(geometry(train_seed=seed), f)
    out = geometry_py.main(["--combine", *paths])
    text = capsys.readouterr().out
    assert out["frame_head"]["outcome"] == "supported"
    assert "frame_head: supported (all 2 seeds agree)" in text and "  seed 1: supported: L0H0 +1 bits (0.545 asked)\n" in text
    for args, expected in (([paths[0]], "1 run given"), ([paths[0], paths[0]], "training seeds 0, 0"),
                           ([paths[0], str(tmp_path / "missing.json")], "missing.json' cannot be read")):
        with pytest.raises(SystemExit) as e:
            geometry_py.main(["--combine", *args])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err


def test_the_gate_reads_the_calibration_of_a_family_without_ablations():
    """A family without attention has no ablations: the gate reads its own KL against a uniform guess's
    (0.05 of 1.0 passes the 10% gate, 0.2 does not; the ablations' numbers are read only when there is no
    calibration block), and judge() judges only the claims it is asked for."""
    g = {"calibration": {"kl_bits": 0.05, "uniform_kl_bits": 1.0},
         "ablations": {"baseline": {"kl_bits": 0.9}, "uniform_kl_bits": 1.0}}
    assert vd.calibration_gate(g) == (True, 0.05, 1.0)
    assert vd.calibration_gate({**g, "calibration": {"kl_bits": 0.2, "uniform_kl_bits": 1.0}})[0] is False
    assert vd.calibration_gate({"ablations": g["ablations"]}) == (False, 0.9, 1.0)



def test_judge_judges_the_claims_it_is_asked_for(monkeypatch):
    """judge(g, claims): only those claims, each through the gate (here the uncalibrated run's 'not judged')."""
    called = []
    fake = {c: (lambda g, c=c: called.append(c) or dict(headline=None, controls={}, verdict="x", outcome="supported",
                                                        margin=None, decided_by="y")) for c in vd.CLAIMS}
    monkeypatch.setattr(vd, "CLAIMS", fake)
    out = vd.judge({"calibration": {"kl_bits": 0.2, "uniform_kl_bits": 1.0}}, claims=("manifold",))
    assert list(out) == ["manifold"] and called == ["manifold"] and out["manifold"]["outcome"] == "not judged"
    out = vd.judge({"calibration": {"kl_bits": 0.01, "uniform_kl_bits": 1.0}})     # no clusters measured
    assert list(out) == [c for c in fake if c != "state_clusters"] and all(v["outcome"] == "supported" for v in out.values())
    out = vd.judge({"calibration": {"kl_bits": 0.01, "uniform_kl_bits": 1.0}, "clusters": {}})
    assert list(out) == list(fake)
