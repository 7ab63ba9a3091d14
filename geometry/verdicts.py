"""verdicts: each geometric claim of Paper I judged from one geometry.json, by a stated rule; and the
verdicts of several seeds of the same command combined into one per claim.

A verdict is a dict: the claim, its headline number (what the paper would quote), the controls that could
carry that number instead of the claim, the verdict (a sentence), its outcome (one word or two: supported,
partly, weak, elsewhere, not supported, undecided, marginal, cannot be told, not judged, not measured), the
margin of the deciding comparison to its threshold, the control that decided it, and the rule (RULES).
geometry/run.py calls judge() on what the probes measured and writes each rule beside its verdict.

When the thresholds were fixed, truthfully: SINK_SHARE, SWAP_INDEPENDENT, SWAP_ALIGNED, SHARP, PC1_SHARE,
WITHIN_RHO, READOUT_PARTIAL, GAIN and INIT_CARRIES were set (commit d65afdb) after a first review had read
the same kind of models they judge, and the sharpening rule was revised once after a run was read (commit
c5785ed: a sink no longer vetoes an aligned layer). CALIBRATED, NOISE_Z, MARGINAL, WEAK_GAIN, READOUT_BEYOND,
ESSENTIAL, IN_DISTRIBUTION, STILL and the per-head, specificity, stillness and several-seed rules were set for
issue 27 after a second review had read the earlier runs (the results' numbers at that time: e.g. the HMM
default's KL at 48% of a uniform guess's, the first sawtooth preset's at 5%), and committed before the
two-seed runs geometry/README.md judges with them were probed. None of them was tuned on those runs. The manifold
rule's two readout comparisons gained their noise (the standard error over the readout's folds) later, with
no threshold changed, before the runs geometry/README.md now judges were probed again.

Every comparison with a threshold goes through compare(): within NOISE_Z x the noise of the quantity (the
spread of the baseline over its seeds, or the standard error over the probe sequences or the readout's
folds) it is 'undecided';
beyond that but within MARGINAL x the threshold, 'marginal'; only then above or below.
"""

from geometry import measures as ms

CALIBRATED = 0.1            # a run is judged only when its KL is below 10% of a uniform guess's KL
NOISE_Z = 2.0               # a comparison within 2 standard errors (or seed sd) of its threshold is undecided
MARGINAL = 0.1              # ... and beyond that, within 10% of the threshold, marginal
SINK_SHARE = 0.5            # a head's entropy drop is a sink's when sink rows carry half of it or more
SWAP_INDEPENDENT = 0.1      # a row that moves less than 0.1x the between-sequence TV ignores its query
SWAP_ALIGNED = 0.25         # ... and one that moves 0.25x or more follows it
SHARP = 0.5                 # a sharp head: entropy at least 50% below uniform, sink rows left out
PC1_SHARE = 0.5             # an entropy axis holds at least half the variance without a dominating position
WITHIN_RHO = 0.5            # ... and orders H within a position, on the graded rows, with Spearman >= 0.5
READOUT_PARTIAL = 0.2       # graded H is readable when the best held-out partial R^2 beyond the position is >= 0.2
READOUT_BEYOND = 0.1        # ... and it counts as geometry when it beats the output's own readout by 0.1 or more
ESSENTIAL = 0.5             # a head is essential when removing it adds half the gap (uniform KL - model KL)
IN_DISTRIBUTION = ("position_mean", "resample")   # the ablations that keep the rest of the network in distribution
GAIN = 10.0                 # the precision "keeps improving": KL 10x or more lower after the frame's plateau
WEAK_GAIN = 2.0             # ... weak from 2x
STILL = 0.5                 # the frame is still when it moves at most half as far after its plateau as before
INIT_CARRIES = 0.5          # the initialisation carries the frame overlap when it already has half the final
CLUSTER_NMI = 0.5           # the final states cluster by hidden state when NMI(k-means, MAP state) >= 0.5
CLUSTER_BEYOND = 0.1        # ... discretely when their between-cluster share beats the posterior's own by 0.1

RULES = {
    "calibration_gate": f"a run is judged only when its KL is below {CALIBRATED:.0%} of a uniform guess's KL on the "
                        f"same rows; otherwise every claim is 'not judged: not calibrated'.",
    "margins": f"every comparison with a threshold is undecided within {NOISE_Z:g}x the noise of what it compares "
               "(the baseline's sd over seeds, or a standard error over the probe sequences or folds), marginal beyond that "
               f"but within {MARGINAL:.0%} of the threshold; only then above or below.",
    "key_frame": "supported when the trained hypothesis keys (the authors' recipe) have a lower mean |cos| than "
                 "the random initialisations (five seeds), both as they are and centred over the tokens; not "
                 "supported when either is higher; the noise is the initialisations' sd over seeds.",
    "sharpening": f"per head: query-key alignment when its entropy, sink rows left out, is at least {SHARP:.0%} "
                  f"below uniform and its rows move at least {SWAP_ALIGNED:g}x the between-sequence TV when only "
                  f"the query changes ('beside a sink' when its sink rows carry {SINK_SHARE:.0%} or more of its "
                  f"drop); else a sink's drop when sink rows carry {SINK_SHARE:.0%} or more, a fixed preference "
                  f"when its rows move less than {SWAP_INDEPENDENT:g}x, weak otherwise (noise: standard errors over "
                  f"the probe sequences). 'Layer by layer' when the layers' entropy reductions never "
                  f"fall from one layer to the next and at least two layers hold an aligned head. Supported when "
                  f"layer by layer; partly when some head aligns but not layer by layer; otherwise not supported.",
    "manifold": f"supported when PC1 (before the final LayerNorm) holds at least {PC1_SHARE:.0%} of the variance "
                f"without a dominating position and orders H_Bayes within a position on the graded rows "
                f"(Spearman >= {WITHIN_RHO:g}); where H_Bayes is a function of the position the claim cannot be "
                f"told from the position; otherwise 'elsewhere' (graded entropy linearly readable) when the best "
                f"held-out partial R^2 beyond the position (graded rows, any layer) is at least "
                f"{READOUT_PARTIAL:g} and beats the same readout from the model's own output distribution (its "
                f"entropy, or its log-probabilities) by {READOUT_BEYOND:g} or more; else not supported. Noise of "
                f"the readout comparisons: the standard error over the readout's {ms.READOUT_FOLDS} folds (paired "
                f"fold by fold for the difference from the output's readout).",
    "frame_head": f"a head is essential when removing it adds more KL than {ESSENTIAL:.0%} of the gap between a "
                  f"uniform guess and the model (uniform KL - model KL), under every ablation that keeps the rest "
                  f"of the network in distribution: {', '.join(IN_DISTRIBUTION)} (the head's mean at each "
                  f"position, another sequence's output; zeroing it or its overall mean feed later layers values "
                  f"the head never produces, and are reported, not read). Noise: the standard error of the KL "
                  f"change over the probe sequences. Supported when some head is essential; the verdict "
                  f"names heads, not a frame: no probe ties a head to a hypothesis frame.",
    "frame_precision": f"on the change since initialisation: supported when the KL improves {GAIN:g}x or more after "
                       f"the change's plateau (weak from {WEAK_GAIN:g}x; the paper metric's gain reported beside), "
                       f"the frame is still after its plateau (it moves at most {STILL:g}x as far after it as "
                       f"before), and it is specific to the frame (the frame settles at an earlier snapshot than "
                       f"the median of every other 2-D weight block, measured the same way); not supported when "
                       f"any fails. The authors' raw reading is carried by the initialisation when the "
                       f"initial frame already has {INIT_CARRIES:.0%} or more of the final overlap ratio.",
    "state_clusters": f"on a task whose posterior's classes are hidden states: the final states cluster by hidden "
                      f"state when the NMI between their k-means clusters (k = the number of states) and the MAP "
                      f"state is at least {CLUSTER_NMI:g} and above both the same clustering of randomly initialised "
                      f"models of the family (noise: their sd over seeds) and the labels shuffled (noise: the "
                      f"shuffles' sd); supported (discrete clusters, one per state) when, besides, the share of the "
                      f"state's variance between its clusters beats the exact posterior's own share by "
                      f"{CLUSTER_BEYOND:g} or more (noise: the standard error over folds of the sequences); 'partly' "
                      f"when they cluster by state but no more discretely than the posterior itself (the task's "
                      f"clusters, read through); not supported when they do not cluster by state.",
}


LABEL_MAX = 80              # a verdict's label (figures, the terminal): its word and deciding number, this long at most


def label(outcome, deciding):
    """The short form of a verdict, for a figure's title and the terminal: the outcome and the number that decided
    it; the full sentence stays in the verdict (geometry.json, the results documents)."""
    return f"{outcome}: {deciding}" if deciding else outcome


def fmt(x, spec=".3g"):
    return "n/a" if x is None else format(x, spec)


def compare(value, threshold, noise=0.0):
    """'above' or 'below' threshold; 'undecided' when |value - threshold| <= NOISE_Z x noise, 'marginal' when
    beyond that but within MARGINAL x |threshold|."""
    d = value - threshold
    if abs(d) <= NOISE_Z * (noise or 0.0):
        return "undecided"
    if abs(d) <= MARGINAL * abs(threshold):
        return "marginal"
    return "above" if d > 0 else "below"


def unsettled(results):
    """'undecided' if any comparison is, else 'marginal' (for comparisons none of which decided)."""
    return "undecided" if "undecided" in results else "marginal"


def key_frame(g):
    a = g["authors"]["key_frame"]
    tests = {"as they are": (a["mean"], a["random_init_mean"], ms.seed_sd(a.get("random_init_per_seed", []))),
             "centred": (a["centred_mean"], a["random_init_centred_mean"],
                         ms.seed_sd(a.get("random_init_centred_per_seed", [])))}
    res = {k: compare(*t) for k, t in tests.items()}
    margin = "; ".join(f"{k}: {t[0]:.3f} against {t[1]:.3f} ({t[0] - t[1]:+.3f}, init sd {t[2]:.3f})"
                       for k, t in tests.items())
    if "above" in res.values():
        outcome = "not supported"
        verdict = (f"not supported: the trained keys are less orthogonal than at random initialisation "
                   f"({', '.join(k for k, r in res.items() if r == 'above')})")
    elif all(r == "below" for r in res.values()):
        outcome, verdict = "supported", "supported: more orthogonal than at random initialisation, as they are and centred"
    else:
        outcome = unsettled(res.values())
        verdict = f"{outcome}: the trained keys are within the random initialisations' spread or near their mean"
    return dict(
        headline=f"mean |cos| of the {a['hypotheses']} hypothesis keys per head {', '.join(fmt(c) for c in a['per_head'])} "
                 f"(random init {fmt(a['random_init_mean'])})",
        controls={"centred, trained": a["centred_mean"], "centred, random init": a["random_init_centred_mean"],
                  "random init per seed": a.get("random_init_per_seed"),
                  "centred random init per seed": a.get("random_init_centred_per_seed"),
                  "offset norm": a["offset_norm"], "deviation norm": a["deviation_norm"],
                  "participation ratio": a["participation_ratio"],
                  "participation ratio, centred": a["participation_ratio_centred"],
                  "Welch RMS bound": a["welch_rms_lower_bound"]},
        verdict=f"{verdict} [{margin}]", outcome=outcome, margin=margin,
        label=label(outcome, f"mean |cos| {a['mean']:.3f} (init {a['random_init_mean']:.3f}), centred "
                             f"{a['centred_mean']:.3f} ({a['random_init_centred_mean']:.3f})"),
        decided_by="the random-initialisation baseline and its spread, raw and centred")


def head_kind(layer, swap, h):
    """'query-key alignment' (or '... beside a sink'), 'sink', 'fixed preference', 'weak', 'undecided' or
    'marginal' for head h of one layer. The sink qualifies an aligned head rather than vetoing it."""
    red = layer["entropy_reduction_without_sink_rows_per_head"][h]
    sharp = "below" if red is None else compare(red, SHARP, layer["entropy_reduction_without_sink_rows_se_per_head"][h])
    follows = compare(swap["ratio"][h], SWAP_ALIGNED, swap["ratio_se"][h])
    sink = (layer["sink_share_of_entropy_drop_per_head"][h] or 0.0) >= SINK_SHARE
    if sharp == "above" and follows == "above":
        return "query-key alignment beside a sink" if sink else "query-key alignment"
    if "below" not in (sharp, follows):
        return unsettled((sharp, follows))
    if sink:
        return "sink"
    if swap["ratio"][h] < SWAP_INDEPENDENT:
        return "fixed preference"
    return "weak"


def sharpening(g):
    att = g["attention"]
    layers, swaps = att["layers"], att["query_swap"]["layers"]
    kinds = {(i, h): head_kind(l, s, h) for i, (l, s) in enumerate(zip(layers, swaps)) for h in range(len(s["ratio"]))}
    name = lambda i, h: f"L{i}H{h}"
    aligned = [k for k, v in kinds.items() if v.startswith("query-key alignment")]
    aligned_layers = sorted({i for i, _ in aligned})
    reductions = [l["entropy_reduction"] for l in layers]
    rising = all(b >= a for a, b in zip(reductions, reductions[1:]))
    by_layer = rising and len(aligned_layers) >= 2
    controls = {name(i, h): {"reduction": layers[i]["entropy_reduction_per_head"][h],
                             "reduction without sink rows": layers[i]["entropy_reduction_without_sink_rows_per_head"][h],
                             "its SE": layers[i]["entropy_reduction_without_sink_rows_se_per_head"][h],
                             "sink share of the drop": layers[i]["sink_share_of_entropy_drop_per_head"][h],
                             "query swap / between sequences": swaps[i]["ratio"][h],
                             "swap SE": swaps[i]["ratio_se"][h], "kind": k}
                for (i, h), k in kinds.items()}
    margin = "; ".join(f"{n}: {fmt(c['reduction without sink rows'], '.0%')} without sink rows "
                       f"({SHARP:.0%} asked), swap {c['query swap / between sequences']:.2f}x ({SWAP_ALIGNED:g}x asked)"
                       for n, c in controls.items() if c["kind"].startswith("query-key") or c["kind"] in ("undecided", "marginal"))
    detail = "; ".join(f"{n}: {c['kind']} ({fmt(c['reduction without sink rows'], '.0%')} below uniform without sink "
                       f"rows, which carry {fmt(c['sink share of the drop'], '.0%')} of its drop; rows move "
                       f"{c['query swap / between sequences']:.2f}x the between-sequence TV)"
                       for n, c in controls.items())
    why = (f"the reductions {'rise' if rising else 'do not rise'} from layer to layer "
           f"({', '.join(f'{r:.0%}' for r in reductions)}) and {len(aligned_layers)} layer"
           f"{'' if len(aligned_layers) == 1 else 's'} hold an aligned head")
    if aligned:
        outcome = "supported" if by_layer else "partly"
        verdict = (f"{'supported' if by_layer else 'partly'}: query-key alignment in {', '.join(name(*k) for k in aligned)}; "
                   f"layer by layer: {'yes' if by_layer else 'no'} ({why})")
    elif any(v in ("undecided", "marginal") for v in kinds.values()):
        outcome = unsettled(kinds.values())
        verdict = f"{outcome}: no head aligns beyond the noise; layer by layer: no ({why})"
    else:
        outcome, verdict = "not supported", f"not supported: no head's sharpness follows its query; layer by layer: no ({why})"
    heads = ", ".join(name(*k) for k in aligned) if len(aligned) <= 3 else f"{len(aligned)} heads"
    short = f"aligned: {heads or 'none'} of {len(kinds)}; by layer {'yes' if by_layer else 'no'}"
    return dict(headline="attention entropy below uniform by layer: " + ", ".join(f"{r:.0%}" for r in reductions),
                controls=controls, verdict=f"{verdict}. {detail}", outcome=outcome, margin=margin or None,
                label=label(outcome, short),
                layer_by_layer=by_layer, decided_by="per head: the sink rows and the query swap")


def manifold(g):
    m, a, base = g["manifold"]["residual_final"], g["authors"]["manifold"], g["manifold"]["readout_baselines"]
    graded_all = g["manifold"]["graded_rows"] == "every row"
    within = m["mean_within_position_spearman"] if graded_all else m.get("within_position_spearman_graded")
    layers = g["manifold"]["by_layer"]["residual"] + [g["manifold"]["after_final_ln"]]
    key = "readout_partial_r2" if graded_all else "readout_partial_r2_graded"
    scores = [l.get(key) for l in layers]
    best = max(range(len(scores)), key=lambda i: -9.0 if scores[i] is None else scores[i])
    pos_r2 = base["position"] if graded_all else base.get("position_graded")
    suffix = "" if graded_all else "_graded"
    outputs = [base.get(f"output_{k}_partial{suffix}") for k in ("entropy", "log_probs")]
    output = max((o for o in outputs if o is not None), default=None)
    names = ["embedding"] + [f"after block {i}" for i in range(len(layers) - 2)] + ["after the final LayerNorm"]
    controls = {"PC1 without the dominating positions": m["pc1_variance_without_dominant"],
                "dominating positions": m["dominant_positions"], "PC1, unit rows": m["pc1_variance_unit_rows"],
                "within-position Spearman, all rows": m["mean_within_position_spearman"],
                "within-position Spearman, graded rows": within,
                "partial readout R^2 beyond the position (held out), best layer": scores[best],
                "its standard error over the folds": None,
                "the same beyond the output's readout, standard error over the folds (paired)": None,
                "best layer": names[best],
                "the same from the model's output: its entropy, its log-probabilities": outputs,
                "readout R^2 from the position alone": pos_r2,
                "readout R^2 from the split alone": base.get("split"),
                "within-position R^2 of H by the split": base.get("within_position_r2_h_by_split"),
                "authors (after the final LayerNorm): PC1": a["pc1_variance"], "authors: R^2 top 5": a["r2_top5"],
                "authors: within-position R^2 top 5, graded rows": a.get("mean_within_position_r2_top5_graded",
                                                                         a["mean_within_position_r2_top5"])}
    if within is None or scores[best] is None:
        return dict(headline=None, controls=controls, outcome="cannot be told", margin=None,
                    label=label("cannot be told", f"the position alone reads H_Bayes, R^2 {fmt(pos_r2)}"),
                    verdict=f"cannot be told from the position: H_Bayes is a function of the position (readout R^2 "
                            f"from the position alone {fmt(pos_r2)})", decided_by="the position control")
    pc1, rho = compare(m["pc1_variance_without_dominant"], PC1_SHARE), compare(within, WITHIN_RHO)
    margin = (f"PC1 {m['pc1_variance_without_dominant']:.0%} ({PC1_SHARE:.0%} asked), within-position Spearman "
              f"{within:.2f} ({WITHIN_RHO:g} asked)")
    best_folds = layers[best].get(key + "_folds")
    if best_folds is None:
        raise ValueError(f"the manifold verdict needs the readout's folds ({key}_folds), which this geometry.json "
                         f"lacks (probed before they were kept): probe the checkpoint again")
    _, readable_se = ms.partial_from_folds(best_folds)
    out_folds = [base.get(f"output_{k}_partial{suffix}_folds") for k in ("entropy", "log_probs")]
    out_folds = out_folds[outputs.index(output)] if output is not None else None
    _, beyond_se = ms.partial_difference(best_folds, out_folds)
    controls["its standard error over the folds"] = readable_se
    controls["the same beyond the output's readout, standard error over the folds (paired)"] = beyond_se
    readable = compare(scores[best], READOUT_PARTIAL, readable_se)
    beyond = "undecided" if output is None else compare(scores[best] - output, READOUT_BEYOND, beyond_se)
    pc1_text = (f"without the dominating position{'s' if len(m['dominant_positions']) > 1 else ''} "
                f"{', '.join(map(str, m['dominant_positions']))} PC1 holds" if m["dominant_positions"] else "PC1 holds")
    readout = (f"a held-out readout explains {scores[best]:.0%} of what the position leaves of H_Bayes "
               f"({names[best]}); the model's own output {fmt(output, '.0%')}")
    short = f"PC1 {m['pc1_variance_without_dominant']:.0%} ({PC1_SHARE:.0%} asked), within-position rho {within:.2f}"
    if pc1 == "above" and rho == "above":
        outcome, verdict = "supported", "supported: PC1 orders H_Bayes within a position on the graded rows"
        decided = "the dominating position and the graded rows"
    elif "below" not in (pc1, rho):
        outcome = unsettled((pc1, rho))
        verdict, decided = f"{outcome}: PC1 near its thresholds", "the dominating position and the graded rows"
    else:
        margin += (f"; readout {scores[best]:.2f} (SE {fmt(readable_se, '.2f')} over the folds; {READOUT_PARTIAL:g} "
                   f"asked), beyond the output {fmt(None if output is None else scores[best] - output, '.2f')} (SE "
                   f"{fmt(beyond_se, '.2f')}; {READOUT_BEYOND:g} asked)")
        decided = "the graded rows, the held-out readout and the output's own readout"
        short = (f"PC1 {m['pc1_variance_without_dominant']:.0%}, rho {within:.2f}; readout {scores[best]:.2f}, beyond "
                 f"the output {fmt(None if output is None else scores[best] - output, '.2f')}")
        not_pc1 = f"not on PC1 ({pc1_text} {m['pc1_variance_without_dominant']:.0%}; within a position on the graded " \
                  f"rows Spearman {within:.2f})"
        if readable == "above" and beyond == "above":
            outcome, verdict = "elsewhere", f"{not_pc1}; graded entropy lies elsewhere, linearly readable: {readout}"
        elif readable == "below":
            outcome, verdict = "not supported", f"not supported: {not_pc1}; {readout}"
        elif beyond == "below":
            outcome = "not supported"
            verdict = f"not supported: {not_pc1}; readable, but no more than from the model's own output: {readout}"
        else:
            outcome = unsettled((readable, beyond))
            verdict = f"{outcome}: {not_pc1}; {readout}"
    return dict(headline=f"PC1 holds {m['pc1_variance']:.0%} of the final residual stream (before the final "
                         f"LayerNorm), Spearman(PC1, H) {fmt(m['spearman_pc1_entropy'], '.2f')}; after it (the "
                         f"authors') {a['pc1_variance']:.1%}, R^2 top 5 {fmt(a['r2_top5'], '.2f')}",
                controls=controls, verdict=verdict, outcome=outcome, margin=margin, decided_by=decided,
                label=label(outcome, short))


def frame_head(g):
    abl = g["ablations"]
    a, methods = abl["authors_frame_head"], abl["methods"]
    gap = abl["uniform_kl_bits"] - abl["baseline"]["kl_bits"]
    threshold = ESSENTIAL * gap
    name = lambda r: f"L{r['layer']}H{r['head']}"
    results = {m: {name(r): compare(r["delta_kl_bits"], threshold, r.get("delta_kl_se_bits")) for r in d["heads"]}
               for m, d in methods.items()}
    rises = {m: {name(r): r["delta_kl_bits"] for r in d["heads"]} for m, d in methods.items()}
    controls = {"uniform guess KL": abl["uniform_kl_bits"], "model KL": abl["baseline"]["kl_bits"],
                f"threshold ({ESSENTIAL:.0%} of the gap)": threshold}
    for m, d in methods.items():
        controls[m] = {"heads above the threshold": [h for h, r in results[m].items() if r == "above"],
                       "largest KL rise": f"{d['by_kl']['name']} (+{d['by_kl']['delta']:.3g} bits)",
                       "by the paper metric": f"{d['by_entropy_mae']['name']} (+{d['by_entropy_mae']['delta']:.3g} bits)",
                       "read by the rule": m in IN_DISTRIBUTION}
    read = [m for m in IN_DISTRIBUTION if m in methods]
    headline = (f"{a['name']}: entropy MAE +{a['delta_entropy_mae_bits']:.3g} bits when zeroed, "
                f"{fmt(a['ratio_to_second'])}x the next head ({a['second']})")
    if not read or gap <= 0:
        why = "no in-distribution ablation" if not read else f"the model (KL {abl['baseline']['kl_bits']:.3g}) is " \
              f"no better than a uniform guess ({abl['uniform_kl_bits']:.3g})"
        return dict(headline=headline, controls=controls, verdict=f"not judged: {why}", outcome="not judged",
                    margin=None, decided_by="the gap to a uniform guess",
                    label=label("not judged", "no in-distribution ablation" if not read else
                                f"KL {abl['baseline']['kl_bits']:.3g}, uniform {abl['uniform_kl_bits']:.3g}"))
    heads = list(results[read[0]])
    essential = [h for h in heads if all(results[m][h] == "above" for m in read)]
    near = [h for h in heads if h not in essential and all(results[m][h] != "below" for m in read)]
    rise = lambda h: ", ".join(f"+{rises[m][h]:.3g} ({m})" for m in read)
    margin = "; ".join(f"{h}: {rise(h)} bits against {threshold:.3g}" for h in (essential or near or
                                                                                [max(heads, key=lambda h: min(rises[m][h] for m in read))]))
    others = "; ".join(f"{m}: {', '.join(controls[m]['heads above the threshold']) or 'none'}"
                       for m in methods if m not in read)
    if essential:
        outcome = "supported"
        verdict = (f"supported by KL: removing {'; '.join(f'{h} adds {rise(h)} bits' for h in essential)}, each "
                   f"more than {ESSENTIAL:.0%} of the gap to a uniform guess ({threshold:.3g} bits); no probe ties "
                   f"{'these heads' if len(essential) > 1 else 'this head'} to a hypothesis frame")
    elif near:
        outcome = unsettled([results[m][h] for m in read for h in near])
        verdict = f"{outcome}: {', '.join(near)} near the threshold ({threshold:.3g} bits)"
    else:
        outcome = "not supported"
        verdict = (f"not supported: no head's removal adds {ESSENTIAL:.0%} of the gap to a uniform guess "
                   f"({threshold:.3g} bits) under {' and '.join(read)}")
    if others:
        verdict += f" (not read by the rule, heads above it: {others})"
    least = lambda h: min(rises[m][h] for m in read)       # a head's smallest rise over the methods the rule reads
    pool = essential or near or [max(heads, key=least)]     # the heads the outcome names, else the nearest one
    shown = pool if len(pool) <= 2 else [max(pool, key=least)]
    short = (f"{', '.join(shown)} +{min(least(h) for h in shown):.3g} bits"
             f"{'' if len(shown) == len(pool) else f' (the largest of {len(pool)})'} ({threshold:.3g} asked)")
    return dict(headline=headline, controls=controls, verdict=verdict, outcome=outcome, margin=margin,
                label=label(outcome, short),
                decided_by=f"the KL rise under {' and '.join(read)} against the gap to a uniform guess")


def frame_precision(g):
    fp = g["frame_precision"]
    if not fp or "frame_change" not in fp:
        return dict(headline=None, controls={}, verdict="not measured (no snapshots)", outcome="not measured",
                    margin=None, decided_by=None, label=label("not measured", "no snapshots"))
    a, c = fp["authors"], fp["frame_change"]
    last = a["ratio_to_chance"][-1]
    others = c["other_init_ratio"]
    plateau, gain_kl, still = c["change_plateau_step"], c.get("calibration_gain_kl_after_change_plateau"), c.get("stillness")
    blocks = fp.get("blocks") or {}
    steps = fp["steps"]
    index = lambda s: len(steps) if s is None else steps.index(s)           # never settling: after the last
    block_index = sorted(index(b["plateau_step"]) for b in blocks.values())
    median = None if not block_index else block_index[len(block_index) // 2] if len(block_index) % 2 else \
        (block_index[len(block_index) // 2 - 1] + block_index[len(block_index) // 2]) / 2
    as_early = [n for n, b in blocks.items() if index(b["plateau_step"]) <= index(plateau)]
    controls = {"initialisation's overlap ratio": c["init_ratio"],
                "other seeds' initialisations": sum(others) / len(others) if others else None,
                "final frame energy in the initial span": c["final_energy_in_init_span"],
                "its chance level": c["chance_energy_in_init_span"],
                "change since init: plateau step": plateau,
                "calibration gain after it, KL": gain_kl,
                "calibration gain after it, paper metric": c["calibration_gain_after_change_plateau"],
                "moved before the plateau, after it (Frobenius)": [c.get("moved_before_change_plateau"),
                                                                   c.get("moved_after_change_plateau")],
                "stillness (after / before)": still,
                "other weight blocks settling as early or earlier": f"{len(as_early)} of {len(blocks)}",
                "other weight blocks": {n: {"plateau step": b["plateau_step"], "gain, KL": b["gain_kl"],
                                            "stillness": b["stillness"]} for n, b in blocks.items()}}
    headline = (f"{a['ratio_nearest_300']:.2f}x chance at step {a['step_nearest_300']}, plateau at step "
                f"{a['frame_plateau_step']}, calibration {fmt(a['calibration_gain_after_plateau'])}x after it")
    if plateau is None or gain_kl is None or still is None or median is None:
        missing = "the change since initialisation never settles" if plateau is None else \
            "the gain by KL, the stillness or the other blocks were not measured"
        outcome = "not supported" if plateau is None else "not measured"
        return dict(headline=headline, controls=controls, verdict=f"{outcome}: {missing}", outcome=outcome,
                    margin=None, decided_by="the change since initialisation",
                    label=label(outcome, "the frame never settles" if plateau is None else "gains not measured"))
    gain = "below" if gain_kl < WEAK_GAIN else compare(gain_kl, GAIN)
    moving = compare(still, STILL)
    specific = index(plateau) < median
    margin = (f"KL gain {gain_kl:.3g}x ({GAIN:g}x asked; paper metric {fmt(c['calibration_gain_after_change_plateau'])}x); "
              f"stillness {still:.3g} ({STILL:g} asked); settles at snapshot {index(plateau)} of {len(steps)} "
              f"(step {plateau}), the other blocks' median at {median:g}")
    fails = ([f"the KL improves only {gain_kl:.3g}x after the plateau"] if gain_kl < WEAK_GAIN else []) + \
        ([f"the frame still moves after its plateau ({still:.3g}x as far as before)"] if moving == "above" else []) + \
        ([f"not specific to the frame: {len(as_early)} of {len(blocks)} other weight blocks settle as early or "
          f"earlier"] if not specific else [])
    if fails:
        outcome, verdict = "not supported", "not supported: " + "; ".join(fails)
    elif "undecided" in (gain, moving) or "marginal" in (gain, moving):
        outcome = unsettled((gain, moving))
        verdict = f"{outcome}: settles at step {plateau}, KL {gain_kl:.3g}x after, stillness {still:.3g}"
    else:
        outcome = "supported" if gain == "above" else "weak"
        verdict = (f"{outcome}: the change since initialisation settles at step {plateau} (before the other "
                   f"blocks' median), stays still ({still:.3g}x), and the KL improves {gain_kl:.3g}x after")
    if c["init_ratio"] >= INIT_CARRIES * last:
        verdict += (f"; the authors' raw reading ({fmt(a['calibration_gain_after_plateau'])}x after step "
                    f"{a['frame_plateau_step']}) is carried by the initialisation ({c['init_ratio']:.2f}x of "
                    f"{last:.2f}x already at step 0)")
    return dict(headline=headline, controls=controls, verdict=verdict, outcome=outcome, margin=margin,
                label=label(outcome, f"KL {gain_kl:.3g}x after step {plateau}, still {still:.2g}, "
                                     f"{len(as_early)}/{len(blocks)} blocks earlier"),
                decided_by="the change since initialisation, its stillness and the other weight blocks")


def state_clusters(g):
    c = g.get("clusters")
    if c is None:
        return dict(headline=None, controls={}, outcome="not measured", margin=None, decided_by="the task",
                    label=label("not measured", "no hidden state"),
                    verdict="not measured: the task names no hidden state to cluster by")
    init_mean = sum(c["nmi_init_per_seed"]) / len(c["nmi_init_per_seed"]) if c["nmi_init_per_seed"] else None
    controls = {"NMI with the MAP state": c["nmi"], "its standard error over folds": c["nmi_se"],
                "random initialisations, per seed": c["nmi_init_per_seed"],
                "shuffled labels: mean, sd": [c["nmi_shuffled_mean"], c["nmi_shuffled_sd"]],
                "between-cluster share: the state, the exact posterior": [c["share"], c["posterior_share"]],
                "the state's share beyond the posterior's (per fold), its SE": [c["share_beyond_posterior"],
                                                                              c["share_beyond_posterior_se"]],
                "MAP states' shares of the rows": c["label_shares"],
                "NMI with the row's input token (outside the rule)": c.get("nmi_token")}
    headline = f"k-means on the final state (k = {c['k']}): NMI {fmt(c['nmi'], '.2f')} with the MAP hidden state"
    if c["nmi"] is None or init_mean is None:
        return dict(headline=headline, controls=controls, outcome="cannot be told", margin=None,
                    decided_by="the labels", label=label("cannot be told", "no labels or no initialisation"), verdict="cannot be told: one MAP state on every row, or no "
                                                     "initialisation to compare with")
    tests = {"threshold": compare(c["nmi"], CLUSTER_NMI, c["nmi_se"]),
             "random initialisation": compare(c["nmi"], init_mean, ms.seed_sd(c["nmi_init_per_seed"])),
             "shuffled labels": compare(c["nmi"], c["nmi_shuffled_mean"], c["nmi_shuffled_sd"])}
    nmi = f"NMI {c['nmi']:.2f} ({CLUSTER_NMI:g} asked; init {init_mean:.2f}, shuffled {c['nmi_shuffled_mean']:.2f})"
    margin = (f"NMI {c['nmi']:.2f} ± {fmt(c['nmi_se'], '.2f')} ({CLUSTER_NMI:g} asked), random initialisation "
              f"{init_mean:.2f} (sd {ms.seed_sd(c['nmi_init_per_seed']):.2f}), shuffled {c['nmi_shuffled_mean']:.2f}")
    if "below" in tests.values():
        failed = ", ".join(k for k, r in tests.items() if r == "below")
        return dict(headline=headline, controls=controls, outcome="not supported", margin=margin,
                    decided_by="the NMI against " + failed, label=label("not supported", nmi),
                    verdict=f"not supported: the final states do not cluster by hidden state (NMI {c['nmi']:.2f}; "
                            f"fails against the {failed})")
    if any(r != "above" for r in tests.values()):
        outcome = unsettled(tests.values())
        return dict(headline=headline, controls=controls, outcome=outcome, margin=margin, label=label(outcome, nmi),
                    decided_by="the NMI's controls", verdict=f"{outcome}: NMI {c['nmi']:.2f} near a control")
    beyond, se = c["share_beyond_posterior"], c["share_beyond_posterior_se"]
    discrete = "undecided" if beyond is None else compare(beyond, CLUSTER_BEYOND, se)
    margin += f"; share beyond the posterior's {fmt(beyond, '.2f')} ± {fmt(se, '.2f')} ({CLUSTER_BEYOND:g} asked)"
    shares = f"between-cluster share {fmt(c['share'], '.2f')} against the posterior's own {fmt(c['posterior_share'], '.2f')}"
    if discrete == "above":
        outcome, verdict = "supported", f"supported: one discrete cluster per hidden state (NMI {c['nmi']:.2f}; {shares})"
    elif discrete == "below":
        outcome = "partly"
        verdict = (f"partly: the final states cluster by hidden state (NMI {c['nmi']:.2f}), but no more discretely "
                   f"than the exact posterior itself ({shares}): the task's clusters, read through")
    else:
        outcome, verdict = discrete, f"{discrete}: clusters by hidden state; discreteness near its threshold ({shares})"
    return dict(headline=headline, controls=controls, outcome=outcome, margin=margin, verdict=verdict,
                label=label(outcome, f"NMI {c['nmi']:.2f}, beyond the posterior's share {fmt(beyond, '.2f')} "
                                     f"({CLUSTER_BEYOND:g} asked)"),
                decided_by="the random initialisation, the shuffled labels and the posterior's own clusters")


CLAIMS = {"key_frame": key_frame, "sharpening": sharpening, "manifold": manifold, "frame_head": frame_head,
          "frame_precision": frame_precision, "state_clusters": state_clusters}


def calibration_gate(g):
    """-> (judged, KL, uniform guess's KL): a run is judged when its KL < CALIBRATED x a uniform guess's."""
    c = g.get("calibration") or {"kl_bits": g["ablations"]["baseline"]["kl_bits"],
                                 "uniform_kl_bits": g["ablations"]["uniform_kl_bits"]}
    kl, uniform = c["kl_bits"], c["uniform_kl_bits"]
    return kl < CALIBRATED * uniform, kl, uniform


def judge(g, claims=None):
    """-> {claim: dict(headline, controls, verdict, outcome, margin, decided_by, rule)} for one geometry.json;
    claims: those its probes measured (default: all, the state clusters only where they were measured; a
    family without attention: the manifold and the state clusters)."""
    judged, kl, uniform = calibration_gate(g)
    out = {}
    claims = claims or [c for c in CLAIMS if c != "state_clusters" or g.get("clusters") is not None]
    for claim, f in ((c, CLAIMS[c]) for c in claims):
        v = f(g)
        if not judged:
            share = f"{kl / uniform:.0%} of a uniform guess's {uniform:.3g}" if uniform > 0 else \
                "where a uniform guess is exact: every answer's posterior is uniform"
            v = {**v, "outcome": "not judged", "decided_by": "the calibration gate",
                 "label": label("not judged", f"KL {kl:.3g} bits, " + (
                     f"{kl / uniform:.0%} of a uniform guess's ({CALIBRATED:.0%} asked)" if uniform > 0
                     else "a uniform guess is exact")),
                 "verdict": f"not judged: not calibrated (KL {kl:.3g} bits, {share}; the gate asks below "
                            f"{CALIBRATED:.0%} of the uniform guess's)"}
        out[claim] = {**v, "rule": RULES[claim]}
    return out


def same_command(gs):
    """ValueError in one line unless the geometry.json dicts gs come from runs of one command with different
    training seeds (same task, settings, config and step)."""
    if len(gs) < 2:
        raise ValueError(f"{len(gs)} run given: combining needs two or more runs of the same command")
    for key in ("task", "settings", "config", "step"):
        values = [g.get(key) for g in gs]
        if any(v != values[0] for v in values):
            raise ValueError(f"the runs differ in {key} ({values[0]!r} against {next(v for v in values if v != values[0])!r}): "
                             f"only runs of the same command with different seeds are combined")
    seeds = [g.get("train_seed") for g in gs]
    if None in seeds or len(set(seeds)) < len(seeds):
        raise ValueError(f"training seeds {', '.join(map(str, seeds))}: each run needs its own, recorded seed")


def combine(gs):
    """One verdict per claim from several seeds of one command (same_command): each run re-judged by the rules
    above, on the claims its geometry.json judged (a family without attention: the manifold and the state
    clusters); the outcome where every seed agrees, else 'undecided' with each seed's outcome."""
    same_command(gs)
    measured = [list(g["verdicts"]) if "verdicts" in g else None for g in gs]   # a family's own claims (judge)
    if any(m != measured[0] for m in measured):
        raise ValueError(f"the runs judged different claims ({measured[0]} against "
                         f"{next(m for m in measured if m != measured[0])}): re-run geometry/run.py on each checkpoint")
    each = [judge(g, measured[0]) for g in gs]
    out = {}
    for claim in each[0]:                                  # the same task: the same claims measured
        outcomes = [v[claim]["outcome"] for v in each]
        per_seed = {f"seed {g['train_seed']}": {"outcome": v[claim]["outcome"], "label": v[claim]["label"],
                                                 "verdict": v[claim]["verdict"],
                                                 "margin": v[claim]["margin"]} for g, v in zip(gs, each)}
        agree = len(set(outcomes)) == 1
        out[claim] = {"outcome": outcomes[0] if agree else "undecided",
                      "agreement": f"all {len(gs)} seeds agree" if agree else
                      "the seeds disagree: " + ", ".join(f"{k} {p['outcome']}" for k, p in per_seed.items()),
                      "per_seed": per_seed}
    return out


def lines(v):
    """The verdicts as a few lines for the terminal: each claim's label (the full verdict and its rule are in the
    json beside the figures)."""
    return [f"{claim}: {d['label']}" for claim, d in v.items()]
