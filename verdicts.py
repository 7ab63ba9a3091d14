"""verdicts: each geometric claim of Paper I judged from one geometry.json, by a stated rule.

A verdict is a dict: the claim, its headline number (what the paper would quote), the controls that could
carry that number instead of the claim, the verdict, the control that decided it, and the rule. The rules
(RULES) are fixed here, before any run is read, and written into geometry.json with each verdict:
geometry.py calls judge() on what the probes measured; the documents quote its output.
"""

SINK_SHARE = 0.5            # a layer's entropy drop is a sink's when sink rows carry half of it or more
SWAP_INDEPENDENT = 0.1      # a row that moves less than 0.1x the between-sequence TV ignores its query
SWAP_ALIGNED = 0.25         # ... and one that moves 0.25x or more follows it
SHARP = 0.5                 # a sharp layer: entropy at least 50% below uniform, sink rows left out
PC1_SHARE = 0.5             # an entropy axis holds at least half the variance without a dominating position
WITHIN_RHO = 0.5            # ... and orders H within a position, on the graded rows, with Spearman >= 0.5
READOUT_PARTIAL = 0.2       # graded H is readable when the best held-out partial R^2 beyond the position is >= 0.2
GAIN = 10.0                 # the precision "keeps improving": 10x or more after the frame's plateau
INIT_CARRIES = 0.5          # the initialisation carries the frame overlap when it already has half the final

RULES = {
    "key_frame": "supported when the trained hypothesis keys (the authors' recipe) are more orthogonal than at "
                 "random initialisation, both as they are and centred over the tokens; otherwise not supported.",
    "sharpening": f"a layer sharpens by query-key alignment when its entropy, sink rows left out, is at least "
                  f"{SHARP:.0%} below uniform and its rows move at least {SWAP_ALIGNED:g}x the between-sequence TV "
                  f"when only the query changes ('beside a sink' when sink rows carry {SINK_SHARE:.0%} or more of "
                  f"its drop: the headline reduction then overstates it); otherwise its drop is a sink's when sink "
                  f"rows carry {SINK_SHARE:.0%} or more of it, a fixed preference when its rows move less than "
                  f"{SWAP_INDEPENDENT:g}x, else weak. Supported when some layer sharpens by alignment; 'layer by "
                  f"layer' needs the reductions monotone.",
    "manifold": f"supported when PC1 (before the final LayerNorm) holds at least {PC1_SHARE:.0%} of the variance "
                f"without a dominating position and orders H_Bayes within a position on the graded rows "
                f"(Spearman >= {WITHIN_RHO:g}); where H_Bayes is a function of the position the claim cannot be "
                f"told from the position; otherwise, graded entropy is 'elsewhere, linearly readable' when the "
                f"best held-out partial R^2 beyond the position (graded rows, any layer) is at least "
                f"{READOUT_PARTIAL:g}, else not supported.",
    "frame_head": "supported (by KL) when removing one head by its mean at each position costs more KL than a "
                  "uniform guess on the same rows; the head the paper metric names is reported for each way of "
                  "removing it.",
    "frame_precision": f"measured on the change since initialisation: supported when calibration improves "
                       f"{GAIN:g}x or more after the change's plateau, weak when 2x to {GAIN:g}x, otherwise not "
                       f"supported; the authors' raw reading is carried by the initialisation when the initial "
                       f"frame already has {INIT_CARRIES:.0%} or more of the final overlap ratio.",
}


def fmt(x, spec=".3g"):
    return "n/a" if x is None else format(x, spec)


def key_frame(g):
    a = g["authors"]["key_frame"]
    raw = a["mean"] < a["random_init_mean"]
    centred = a["centred_mean"] < a["random_init_centred_mean"]
    return dict(
        headline=f"mean |cos| of the {a['hypotheses']} hypothesis keys per head {', '.join(fmt(c) for c in a['per_head'])} "
                 f"(random init {fmt(a['random_init_mean'])})",
        controls={"centred, trained": a["centred_mean"], "centred, random init": a["random_init_centred_mean"],
                  "offset norm": a["offset_norm"], "deviation norm": a["deviation_norm"],
                  "participation ratio": a["participation_ratio"],
                  "participation ratio, centred": a["participation_ratio_centred"],
                  "Welch RMS bound": a["welch_rms_lower_bound"]},
        verdict="supported" if raw and centred else "not supported: the trained keys are less orthogonal than at "
                                                    "random initialisation" + ("" if raw or centred else
                                                                               ", as they are and centred"),
        decided_by="the random-initialisation baseline, raw and centred")


def layer_kind(layer, swap):
    """'query-key alignment' (or '... beside a sink'), 'sink', 'fixed preference' or 'weak' for one layer's
    attention. The sink qualifies an aligned layer rather than vetoing it: rows that are sharp without the
    sink rows and follow their query sharpen by alignment, however much of the headline drop the sink adds."""
    sink = (layer["sink_share_of_entropy_drop"] or 0.0) >= SINK_SHARE
    if (layer["entropy_reduction_without_sink_rows"] or 0.0) >= SHARP and swap["ratio_mean"] >= SWAP_ALIGNED:
        return "query-key alignment beside a sink" if sink else "query-key alignment"
    if sink:
        return "sink"
    if swap["ratio_mean"] < SWAP_INDEPENDENT:
        return "fixed preference"
    return "weak"


def sharpening(g):
    att = g["attention"]
    kinds = [layer_kind(l, s) for l, s in zip(att["layers"], att["query_swap"]["layers"])]
    aligned = [i for i, k in enumerate(kinds) if k.startswith("query-key alignment")]
    controls = {f"layer {i}": {"reduction": l["entropy_reduction"],
                               "reduction without sink rows": l["entropy_reduction_without_sink_rows"],
                               "sink row share": sum(l["sink_row_share"]) / len(l["sink_row_share"]),
                               "sink share of the drop": l["sink_share_of_entropy_drop"],
                               "query swap / between sequences": s["ratio_mean"], "kind": kinds[i]}
                for i, (l, s) in enumerate(zip(att["layers"], att["query_swap"]["layers"]))}
    detail = "; ".join(f"layer {i}: {c['kind']} ({c['reduction']:.0%} below uniform, {fmt(c['reduction without sink rows'], '.0%')} "
                       f"without sink rows, which carry {fmt(c['sink share of the drop'], '.0%')} of the drop; rows move "
                       f"{c['query swap / between sequences']:.2f}x the between-sequence TV when the query changes)"
                       for i, c in enumerate(controls.values()))
    if aligned:
        verdict = (f"supported in layer{'s' if len(aligned) > 1 else ''} {', '.join(map(str, aligned))}"
                   + ("" if att["monotone"] else ", but not layer by layer (the reductions are not monotone)")
                   + f". {detail}")
    else:
        verdict = f"not supported: no layer's sharpness follows its query. {detail}"
    return dict(headline="attention entropy below uniform by layer: " + ", ".join(
        f"{l['entropy_reduction']:.0%}" for l in att["layers"]), controls=controls, verdict=verdict,
        decided_by="the sink rows and the query swap")


def manifold(g):
    m, a, base = g["manifold"]["residual_final"], g["authors"]["manifold"], g["manifold"]["readout_baselines"]
    graded_all = g["manifold"]["graded_rows"] == "every row"
    within = m["mean_within_position_spearman"] if graded_all else m.get("within_position_spearman_graded")
    layers = g["manifold"]["by_layer"]["residual"] + [g["manifold"]["after_final_ln"]]
    key = "readout_partial_r2" if graded_all else "readout_partial_r2_graded"
    scores = [l.get(key) for l in layers]
    best = max(range(len(scores)), key=lambda i: -9.0 if scores[i] is None else scores[i])
    pos_r2 = base["position"] if graded_all else base.get("position_graded")
    names = ["embedding"] + [f"after block {i}" for i in range(len(layers) - 2)] + ["after the final LayerNorm"]
    controls = {"PC1 without the dominating positions": m["pc1_variance_without_dominant"],
                "dominating positions": m["dominant_positions"], "PC1, unit rows": m["pc1_variance_unit_rows"],
                "within-position Spearman, all rows": m["mean_within_position_spearman"],
                "within-position Spearman, graded rows": within,
                "partial readout R^2 beyond the position (held out), best layer": scores[best],
                "best layer": names[best],
                "readout R^2 from the position alone": pos_r2,
                "readout R^2 from the split alone": base.get("split"),
                "within-position R^2 of H by the split": base.get("within_position_r2_h_by_split"),
                "authors (after the final LayerNorm): PC1": a["pc1_variance"], "authors: R^2 top 5": a["r2_top5"],
                "authors: within-position R^2 top 5, graded rows": a.get("mean_within_position_r2_top5_graded",
                                                                         a["mean_within_position_r2_top5"])}
    if within is None or scores[best] is None:
        verdict = (f"cannot be told from the position: H_Bayes is a function of the position (readout R^2 from "
                   f"the position alone {fmt(pos_r2)})")
        decided = "the position control"
    elif m["pc1_variance_without_dominant"] >= PC1_SHARE and within >= WITHIN_RHO:
        verdict, decided = "supported: PC1 orders H_Bayes within a position on the graded rows", \
            "the dominating position and the graded rows"
    elif scores[best] >= READOUT_PARTIAL:
        pc1 = (f"without the dominating position{'s' if len(m['dominant_positions']) > 1 else ''} "
               f"{', '.join(map(str, m['dominant_positions']))} PC1 holds" if m["dominant_positions"] else "PC1 holds")
        verdict = (f"not on PC1 ({pc1} {m['pc1_variance_without_dominant']:.0%}; within a position on the graded "
                   f"rows Spearman {fmt(within, '.2f')}); graded entropy lies elsewhere, "
                   f"linearly readable: a held-out readout explains {scores[best]:.0%} of what the position "
                   f"leaves of H_Bayes ({names[best]})")
        decided = "the dominating position, the graded rows and the held-out readout"
    else:
        verdict = (f"not supported: within a position on the graded rows Spearman(PC1, H) {fmt(within, '.2f')}, and a "
                   f"held-out readout explains at most {scores[best]:.0%} of what the position leaves of H_Bayes")
        decided = "the graded rows and the held-out readout"
    return dict(headline=f"PC1 holds {m['pc1_variance']:.0%} of the final residual stream (before the final "
                         f"LayerNorm), Spearman(PC1, H) {fmt(m['spearman_pc1_entropy'], '.2f')}; after it (the "
                         f"authors') {a['pc1_variance']:.1%}, R^2 top 5 {fmt(a['r2_top5'], '.2f')}",
                controls=controls, verdict=verdict, decided_by=decided)


def frame_head(g):
    abl = g["ablations"]
    a = abl["authors_frame_head"]
    methods = abl["methods"]
    controls = {"uniform guess KL": abl["uniform_kl_bits"]}
    for name, m in methods.items():
        controls[name] = {"by KL": f"{m['by_kl']['name']} (+{m['by_kl']['delta']:.3g} bits)",
                          "by the paper metric": f"{m['by_entropy_mae']['name']} (+{m['by_entropy_mae']['delta']:.3g} "
                                                 f"bits, {fmt(m['by_entropy_mae']['ratio_to_second'])}x the second)",
                          "heads above the uniform guess": m["heads_above_uniform"]}
    named = sorted({m["by_entropy_mae"]["name"] for m in methods.values()})
    rule = methods.get("position_mean") or methods.get("zero")
    essential = rule["heads_above_uniform"]
    if essential:
        kl = {f"L{r['layer']}H{r['head']}": r["kl_bits"] for r in rule["heads"]}
        verdict = (f"supported by KL: removing {', '.join(essential)} (mean at each position) costs "
                   f"{', '.join(fmt(kl[h]) for h in essential)} bits, above a uniform guess's "
                   f"{abl['uniform_kl_bits']:.3g}")
    else:
        verdict = "not supported: no single head costs more KL than a uniform guess"
    if len(named) > 1:
        verdict += f"; the paper metric names {', '.join(named)} depending on how the head is removed"
    return dict(headline=f"{a['name']}: entropy MAE +{a['delta_entropy_mae_bits']:.3g} bits when zeroed, "
                         f"{fmt(a['ratio_to_second'])}x the next head ({a['second']})",
                controls=controls, verdict=verdict, decided_by="KL under mean ablation against a uniform guess")


def frame_precision(g):
    fp = g["frame_precision"]
    if not fp or "frame_change" not in fp:
        return dict(headline=None, controls={}, verdict="not measured (no snapshots)", decided_by=None)
    a, c = fp["authors"], fp["frame_change"]
    last = a["ratio_to_chance"][-1]
    others = c["other_init_ratio"]
    controls = {"initialisation's overlap ratio": c["init_ratio"],
                "other seeds' initialisations": sum(others) / len(others) if others else None,
                "final frame energy in the initial span": c["final_energy_in_init_span"],
                "its chance level": c["chance_energy_in_init_span"],
                "change since init: plateau step": c["change_plateau_step"],
                "change since init: calibration gain after it": c["calibration_gain_after_change_plateau"]}
    gain = c["calibration_gain_after_change_plateau"]
    if gain is not None and gain >= GAIN:
        verdict = f"supported on the change since initialisation: it settles at step {c['change_plateau_step']}, " \
                  f"calibration improves {gain:.0f}x after"
    elif gain is not None and gain >= 2:
        verdict = f"weak: the change since initialisation settles at step {c['change_plateau_step']}, " \
                  f"calibration improves {gain:.3g}x after (the rule asks {GAIN:g}x)"
    else:
        verdict = "not supported: calibration does not keep improving after the change since initialisation settles"
    if c["init_ratio"] >= INIT_CARRIES * last:
        verdict += (f"; the authors' raw reading ({fmt(a['calibration_gain_after_plateau'])}x after step "
                    f"{a['frame_plateau_step']}) is carried by the initialisation ({c['init_ratio']:.2f}x of "
                    f"{last:.2f}x already at step 0)")
    return dict(headline=f"{a['ratio_nearest_300']:.2f}x chance at step {a['step_nearest_300']}, plateau at step "
                         f"{a['frame_plateau_step']}, calibration {fmt(a['calibration_gain_after_plateau'])}x after it",
                controls=controls, verdict=verdict, decided_by="the change since initialisation")


CLAIMS = {"key_frame": key_frame, "sharpening": sharpening, "manifold": manifold, "frame_head": frame_head,
          "frame_precision": frame_precision}


def judge(g):
    """-> {claim: dict(headline, controls, verdict, decided_by, rule)} for one geometry.json's numbers."""
    return {claim: {**f(g), "rule": RULES[claim]} for claim, f in CLAIMS.items()}


def lines(v):
    """The verdicts as a few lines for the terminal."""
    return [f"{claim}: {d['verdict']}  [decided by {d['decided_by']}]" for claim, d in v.items()]
