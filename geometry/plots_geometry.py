"""plots_geometry: the figures of the geometry probes (geometry/run.py), each drawing the controls that decide its
claim and printing the verdict of the same probes; harness/plots.py has the training runs' figures, dynamics/plots_dynamics.py
Paper II's."""

import numpy as np

from harness.plots import _plt, _save


def _verdict(fig, title, what, verdict):
    """The suptitle of a geometry figure: the run, what a student should see, and the verdict's label (its word
    and deciding number, verdicts.judge on the same probes), so that figure and verdict agree; the full verdict
    and its rule are in geometry.json."""
    import textwrap
    line = "" if verdict is None else f"\nverdict: {verdict['label']}"
    width = int(fig.get_figwidth() * 12)          # characters of 9-point text across the figure, with room
    fig.suptitle("\n".join(textwrap.wrap(f"{title}: {what}", width)) + line, fontsize=9)


GROUP_LABELS = {"keys": "key", "values": "value", "tokens": "key or value", "observations": "observation",
                "probabilities": "probability"}
RECIPE_LABELS = {"ln": "LN1 W_K", "ln_centred": "LN1 W_K,\ncentred", "authors": "LN1(wte) W_K\n(authors')",
                 "value_ln": "LN1 W_V\n(values)"}


def plot_key_frame(stats, matrices, cfg, title, path, authors=None, verdict=None, noise_z=2.0):
    """Probe 1: the cosine matrices of the layer-0 keys per head (as they are and centred over the tokens)
    and, beside them, mean |cos| against its baselines. The bars the verdict reads come first: the authors'
    keys, as they are and centred, against the random initialisations (error bar: noise_z x their sd over
    seeds, the rule's margin); the other recipes follow, reported."""
    plt = _plt()
    RECIPES = list(stats)
    groups, NH = list(stats["ln"]), cfg.n_heads
    fig = plt.figure(figsize=(2.3 * NH + 7.0, 4.4 * len(groups) + 1.4), layout="constrained")
    grid = fig.add_gridspec(2 * len(groups), NH + 2)
    heat = []
    for g, name in enumerate(groups):
        for r, recipe in enumerate(("ln", "ln_centred")):
            for h in range(NH):
                ax = fig.add_subplot(grid[2 * g + r, h])
                im = ax.imshow(matrices[(recipe, name)][h], cmap="RdBu_r", vmin=-1, vmax=1)
                ax.set_title(f"{GROUP_LABELS[name]} tokens, head {h}{', centred' if r else ''}\n"
                             f"mean|cos| {stats[recipe][name]['mean_abs_offdiag_per_head'][h]:.3f}", fontsize=7)
                ax.set_xlabel(f"{GROUP_LABELS[name]} token index", fontsize=6)
                if h == 0:
                    ax.set_ylabel(f"{GROUP_LABELS[name]} token index", fontsize=6)
                ax.xaxis.set_major_locator(plt.MaxNLocator(5, integer=True))
                ax.yaxis.set_major_locator(plt.MaxNLocator(5, integer=True))
                ax.tick_params(labelsize=5)
                heat.append(ax)
        ax = fig.add_subplot(grid[2 * g:2 * g + 2, NH:])
        bars = [(RECIPE_LABELS[r], stats[r][name]["mean_abs_offdiag"], stats[r][name]["random_init_mean_abs_offdiag"],
                 _sd(stats[r][name].get("random_init_per_seed")), stats[r][name]["gaussian_mean_abs_offdiag"])
                for r in RECIPES]
        read = 0
        if authors is not None and g == 0:                      # what the verdict compares, first
            read = 2
            bars = [("authors' keys\n(read)", authors["mean"], authors["random_init_mean"],
                     _sd(authors.get("random_init_per_seed")), None),
                    ("authors' keys,\ncentred (read)", authors["centred_mean"], authors["random_init_centred_mean"],
                     _sd(authors.get("random_init_centred_per_seed")), None)] + bars
        x = np.arange(len(bars))
        ax.bar(x - 0.27, [b[1] for b in bars], width=0.27, color="C0", label="trained")
        ax.bar(x, [b[2] for b in bars], width=0.27, color="C1",
               yerr=[noise_z * b[3] for b in bars], capsize=2,
               label=f"random init, 5 seeds (bar: {noise_z:g} sd over seeds)")
        ax.bar(x + 0.27, [np.nan if b[4] is None else b[4] for b in bars], width=0.27, color="C7",
               label="random Gaussian vectors")
        if read:
            ax.axvspan(-0.5, read - 0.5, color="C2", alpha=0.08, lw=0, label="what the verdict reads: the "
                       "hypothesis keys")
        welch = stats["ln"][name]["welch_rms_lower_bound"]
        ax.axhline(welch, color="k", ls=":", lw=1.5, label=f"Welch bound on the RMS cosine: {welch:.3f}"
                   + (" (no more tokens than dimensions:\nexactly orthogonal keys are possible)" if welch < 1e-9 else ""))
        ax.set_xticks(x)
        ax.set_xticklabels([b[0] for b in bars], fontsize=6)
        ax.set_ylabel("mean |off-diagonal cosine|")
        ax.set_ylim(0, 1.05)
        s = stats["ln"][name]
        ax.set_title(f"{GROUP_LABELS[name]} tokens: {s['n_tokens']} vectors in R^{s['head_size']} per head, mean "
                     f"over heads", fontsize=8)
        ax.legend(fontsize=6, frameon=False, loc="upper right")
    fig.colorbar(im, ax=heat, shrink=0.5, label="cosine similarity")
    _verdict(fig, title, "are the layer-0 keys more orthogonal than at initialisation? Compare the blue bar with "
             "the orange one and its spread.\nKeys = LN1(wte[tok] + p) W_K + b_K, p = mean position of the type; "
             "authors' = LN1(wte[tok]) W_K; values = LN1(wte[tok] + p) W_V + b_V", verdict)
    return _save(fig, path)


def _sd(values):
    """Sample sd over seeds (ddof 1), 0 for fewer than two."""
    return float(np.std(values, ddof=1)) if values is not None and len(values) > 1 else 0.0


def plot_attention_maps(cache, tokens, names, cfg, title, path):
    from matplotlib.colors import PowerNorm
    plt = _plt()
    NH, L = cfg.n_heads, cfg.n_layers
    layers = list(range(L)) if L <= 4 else [0, L // 2, L - 1]      # always the first and the last layer
    T = len(tokens)
    fig, axes = plt.subplots(len(layers), NH, figsize=(3.6 * NH + 1.2, 3.7 * len(layers) + 0.6),
                             squeeze=False, layout="constrained")
    ticks = np.arange(0, T, max(1, -(-T // 40)))                   # every position up to T = 40
    fs = 5 if len(ticks) > 24 else 6
    for r, l in enumerate(layers):
        for h in range(NH):
            ax = axes[r, h]
            im = ax.imshow(cache["layers"][l]["alpha"][0, h], cmap="magma", norm=PowerNorm(0.5, vmin=0, vmax=1))
            ax.set_title(f"layer {l}, head {h}", fontsize=9)
            ax.set_xticks(ticks)
            ax.set_xticklabels([names[t] for t in ticks], rotation=90, fontsize=fs)
            ax.set_yticks(ticks)
            ax.set_yticklabels([names[t] for t in ticks], fontsize=fs)
            ax.set_xlabel("attended position j", fontsize=7)
            if h == 0:
                ax.set_ylabel("query position i", fontsize=7)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight alpha_ij (square-root scale)")
    fig.suptitle(f"{title}: attention of one held-out sequence, layers {', '.join(map(str, layers))}")
    return _save(fig, path)


def plot_attention_entropy(att, task, cfg, title, path, verdict=None, sharp=0.5, sink_share=0.5, aligned=0.25,
                           independent=0.1, noise_z=2.0):
    """Probe 2, head by head, with the controls that decide the sharpening verdict: the entropy drop below
    uniform with the sink rows left out (threshold sharp), the sink rows' share of the drop (sink_share),
    how far a head's rows move when only the query changes, as a fraction of the between-sequence TV
    (aligned / independent), and the attention mass on the evidence. Error bars: noise_z standard errors
    over the probe sequences. Each head is labelled with the kind the verdict gives it."""
    plt = _plt()
    layers, swap = att["layers"], att["query_swap"]["layers"]
    L, NH = len(layers), len(layers[0]["entropy_bits"])
    kinds = (verdict or {}).get("controls", {})
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.2))
    x = np.arange(L)
    width = 0.8 / NH
    series = ((axes[0, 0], "entropy_reduction_without_sink_rows_per_head", "entropy_reduction_without_sink_rows_se_per_head",
               "entropy drop below uniform, sink rows left out", sharp, f"sharp: {sharp:.0%} below uniform"),
              (axes[0, 1], "sink_share_of_entropy_drop_per_head", None, "share of the drop carried by sink rows",
               sink_share, f"a sink's drop: {sink_share:.0%} or more"))
    for ax, key, se, label, line, line_label in series:
        for h in range(NH):
            ax.bar(x + (h - (NH - 1) / 2) * width, [l[key][h] for l in layers], width=width, color=f"C{h % 10}",
                   yerr=None if se is None else [noise_z * l[se][h] for l in layers], capsize=2, label=f"head {h}")
        ax.axhline(line, color="k", ls="--", lw=1, label=line_label)
        ax.set_ylabel(label)
    axes[0, 0].plot(x, [l["entropy_reduction"] for l in layers], "k^", ms=7, label="pooled over heads, sink rows in")
    ax = axes[1, 0]
    for h in range(NH):
        ax.bar(x + (h - (NH - 1) / 2) * width, [s["ratio"][h] for s in swap], width=width, color=f"C{h % 10}",
               yerr=[noise_z * s["ratio_se"][h] for s in swap], capsize=2, label=f"head {h}")
        for l in range(L):
            kind = kinds.get(f"L{l}H{h}", {}).get("kind")
            if kind:
                ax.text(l + (h - (NH - 1) / 2) * width, 0.02, kind, rotation=90, fontsize=6, ha="center", va="bottom")
    ax.axhline(aligned, color="k", ls="--", lw=1, label=f"follows its query: {aligned:g}x or more")
    ax.axhline(independent, color="k", ls=":", lw=1, label=f"ignores its query: below {independent:g}x")
    ax.set_ylabel("row change when only the query changes\n/ change between sequences (TV)")
    ax.set_title("query swap (text in a bar: the kind the verdict gives the head)", fontsize=8)
    ax = axes[1, 1]
    for h in range(NH):
        ax.bar(x + (h - (NH - 1) / 2) * width, [l["consistent_mass"][h] for l in layers], width=width,
               color=f"C{h % 10}", label=f"head {h}")
    ax.axhline(att["uniform_consistent_mass"], color="gray", ls="--", label="uniform causal attention")
    evidence = ("earlier values (eliminated) / the answer if the key repeats" if task != "hmm"
                else "emission column E[:, o_t] of the current observation")
    ax.set_ylabel("attention mass on evidence positions")
    ax.set_title(f"evidence: {evidence}", fontsize=8)
    axes[0, 0].set_title(f"uniform causal attention: {att['uniform_entropy_bits']:.2f} bits at these rows", fontsize=8)
    axes[0, 1].set_title("sink rows: rows whose largest weight is on position 0", fontsize=8)
    for ax in axes.ravel():
        ax.set_xlabel("layer")
        ax.set_xticks(x)
        ax.set_ylim(min(0.0, ax.get_ylim()[0]), max(1.02, ax.get_ylim()[1]))
    axes[0, 0].legend(fontsize=6, frameon=False, loc="upper left", ncol=2)
    axes[1, 0].legend(fontsize=6, frameon=False, loc="upper right")
    for ax in (axes[0, 1], axes[1, 1]):
        ax.legend(fontsize=6, frameon=False, loc="upper right", ncol=2)
    _verdict(fig, title, "does attention sharpen because keys meet their query, layer by layer? A head counts when "
             "it is sharp without sink rows and follows its query", verdict)
    fig.tight_layout()
    return _save(fig, path)


def plot_manifold(man, xy, title, path, verdict=None, max_points=4000):
    """Probe 3 on the answer rows, coloured by the exact posterior entropy H_Bayes: the final residual stream
    (before the final LayerNorm) on its first two PCs, the positions that dominate it drawn apart and named;
    the graded rows without them (PCA refit), where the verdict looks; and the authors' view, after the
    final LayerNorm. Each title names its numbers: the share of variance on PC1, Spearman(PC1, H) within a
    position, and the held-out readout R^2 of H beyond the position."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    fmt = lambda r: "n/a" if r is None else f"{r:+.2f}"
    m, ln = man["residual_final"], man["after_final_ln"]
    dropped = list(xy["dominant"])
    g = m.get("graded_refit") or {}
    panels = ((axes[0], xy["all"], np.isin(xy["position"], dropped),
               f"all answer rows, before the final LayerNorm\nPC1 {100 * m['pc1_variance']:.0f}% of the variance"
               + (f" ({100 * m['pc1_variance_without_dominant']:.0f}% without position"
                  f"{'s' if len(dropped) > 1 else ''} {', '.join(map(str, dropped))})" if dropped else "")
               + f"; Spearman(PC1, H) within a position {fmt(m['mean_within_position_spearman'])}"),
              (axes[1], xy["graded"], None,
               f"graded rows ({man['graded_rows']}), dominant positions out, PCA refit\nPC1 "
               f"{'n/a' if g.get('pc1_variance') is None else format(100 * g['pc1_variance'], '.0f') + '%'} of the "
               f"variance; within a position Spearman {fmt(m.get('within_position_spearman_graded'))}; held-out "
               f"R^2 of H beyond the position {fmt(m.get('readout_partial_r2_graded'))}"
               + ("" if m.get("readout_partial_r2_graded_se") is None
                  else f" ± {m['readout_partial_r2_graded_se']:.2f} (SE over folds)")),
              (axes[2], xy["after_final_ln"], np.isin(xy["position"], dropped),
               f"all answer rows, after the final LayerNorm (the authors' view)\nPC1 {100 * ln['pc1_variance']:.0f}% "
               f"of the variance; Spearman(PC1, H) within a position {fmt(ln['mean_within_position_spearman'])}"))
    for ax, (pts, h), apart, label in panels:
        idx = np.random.default_rng(0).permutation(len(h))[:max_points]
        rest = idx if apart is None else idx[~apart[idx]]
        sc = ax.scatter(pts[rest, 0], pts[rest, 1], c=h[rest], s=5, cmap="viridis", alpha=0.7)
        if apart is not None and apart[idx].any():
            sel = idx[apart[idx]]
            ax.scatter(pts[sel, 0], pts[sel, 1], c=h[sel], s=22, marker="x", cmap="viridis", lw=0.8,
                       vmin=sc.get_clim()[0], vmax=sc.get_clim()[1],
                       label=f"position{'s' if len(dropped) > 1 else ''} {', '.join(map(str, dropped))} (dominates the PCA)")
            ax.legend(fontsize=7, frameon=False, loc="best")
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("PC1")
        ax.set_ylabel("PC2")
        ax.xaxis.set_major_locator(plt.MaxNLocator(5))
        fig.colorbar(sc, ax=ax, label="posterior entropy H_Bayes (bits)")
    _verdict(fig, title, "is the posterior entropy laid out along one direction of the representation? Look for a "
             "colour gradient along PC1 inside the middle panel", verdict)
    fig.tight_layout()
    return _save(fig, path)


def plot_logit_lens(lens, title, path):
    plt = _plt()
    n = len(lens["kl_bits"])
    labels = ["embedding"] + [f"after block {l}" for l in range(n - 1)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].semilogy(np.arange(n), np.maximum(lens["kl_bits"], 1e-6), "o-")
    axes[0].set_xticks(np.arange(n))
    axes[0].set_xticklabels(labels, fontsize=8)
    axes[0].set_ylabel("mean KL(posterior || lens) (bits)")
    axes[0].set_xlabel("residual stream read by the lens")
    axes[0].set_title("KL of the lens prediction by layer", fontsize=9)
    pos = np.arange(1, len(lens["bayes_entropy_by_position_bits"]) + 1)
    axes[1].plot(pos, lens["bayes_entropy_by_position_bits"], "k-", lw=3, alpha=0.35, label="exact Bayes")
    for l, hs in enumerate(lens["entropy_by_position_bits"]):
        axes[1].plot(pos, hs, "o-", ms=2.5, lw=1, label=labels[l])
    axes[1].set_xlabel("supervised position (1 = first)")
    axes[1].set_ylabel("predictive entropy, mean over sequences (bits)")
    axes[1].set_title("lens entropy by position", fontsize=9)
    axes[1].legend(fontsize=7, frameon=False)
    fig.suptitle(f"{title}: logit lens (final LayerNorm + unembedding on each residual stream)")
    fig.tight_layout()
    return _save(fig, path)


def plot_ablations(abl, title, path, verdict=None, essential=0.5, read=("position_mean", "resample"), noise_z=2.0):
    """Probe 5, as the frame-head verdict reads it: for each head, the KL it adds when removed, under every
    ablation method (the in-distribution ones the rule reads, hatched: the others, reported), against the
    threshold (essential x the gap between a uniform guess and the model) and the gap itself; error bars
    noise_z standard errors over the probe sequences. Right: the KL of the ablated model itself, whole
    layers included, with the model and a uniform guess marked."""
    plt = _plt()
    methods = abl["methods"]
    heads = [f"L{r['layer']}H{r['head']}" for r in abl["heads"]]
    gap = abl["uniform_kl_bits"] - abl["baseline"]["kl_bits"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw=dict(width_ratios=(3, 2)))
    ax = axes[0]
    names = list(methods)
    width = 0.8 / len(names)
    x = np.arange(len(heads))
    for k, mth in enumerate(names):
        rows = methods[mth]["heads"]
        ax.bar(x + (k - (len(names) - 1) / 2) * width, [r["delta_kl_bits"] for r in rows], width=width,
               color=f"C{k}", hatch=None if mth in read else "//", alpha=1.0 if mth in read else 0.45,
               yerr=[noise_z * (r.get("delta_kl_se_bits") or 0.0) for r in rows], capsize=1.5,
               label=mth.replace("_", " ") + (" (read by the rule)" if mth in read else " (reported)"))
    ax.axhline(essential * gap, color="k", ls="--", lw=1,
               label=f"threshold: {essential:.0%} of the gap to a uniform guess ({essential * gap:.3g} bits)")
    ax.axhline(gap, color="gray", ls=":", lw=1, label=f"the whole gap: as bad as a uniform guess ({gap:.3g} bits)")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(x)
    ax.set_xticklabels(heads, fontsize=7, rotation=90 if len(heads) > 16 else 0)
    if verdict is not None and gap > 0 and verdict["outcome"] not in ("not judged", "not measured"):
        above = lambda mth: set((verdict["controls"].get(mth) or {}).get("heads above the threshold", []))
        essential = set.intersection(*[above(mth) for mth in read if mth in methods])
        for tick in ax.get_xticklabels():
            if tick.get_text() in essential:
                tick.set_color("C3")
                tick.set_fontweight("bold")
    ax.set_ylabel("KL added by removing the head (bits)")
    ax.set_xlabel("head removed (red: essential under every method the rule reads)")
    ax.legend(fontsize=6.5, frameon=False, loc="upper left")
    ax = axes[1]
    main = read[0] if read[0] in methods else names[0]
    rows = ([(h, r["kl_bits"]) for h, r in zip(heads, methods[main]["heads"])]
            + [(f"L{r['layer']} all", r["kl_bits"]) for r in methods[main]["layers"]])
    ax.bar(np.arange(len(rows)), [max(v, 1e-6) for _, v in rows],
           color=["C0"] * len(heads) + ["C1"] * (len(rows) - len(heads)))
    ax.axhline(max(abl["baseline"]["kl_bits"], 1e-6), color="k", ls="--", lw=1,
               label=f"the model, nothing removed ({abl['baseline']['kl_bits']:.3g} bits)")
    ax.axhline(abl["uniform_kl_bits"], color="gray", ls=":", lw=1.2,
               label=f"a uniform guess ({abl['uniform_kl_bits']:.3g} bits)")
    values = [max(v, 1e-6) for _, v in rows] + [max(abl["baseline"]["kl_bits"], 1e-6), abl["uniform_kl_bits"]]
    if max(values) > 20 * min(values):                           # a log scale only where it spans decades
        ax.set_yscale("log")
    ax.set_xticks(np.arange(len(rows)))
    ax.set_xticklabels([n for n, _ in rows], rotation=90, fontsize=7)
    ax.set_ylabel("KL(posterior || ablated model) (bits)")
    ax.set_title(f"{main.replace('_', ' ')} ablation; orange: a whole layer's attention", fontsize=8)
    ax.legend(fontsize=7, frameon=True, framealpha=0.85, loc="lower left")
    _verdict(fig, title, "which heads does calibration need? A head is essential when removing it adds more than "
             "the dashed line under every method the rule reads", verdict)
    fig.tight_layout()
    return _save(fig, path)


def plot_frame_precision(fp, title, path, verdict=None):
    """Probe 6 over the run's snapshots. Top: how fast the attention rows move, the calibration (KL, the
    paper metric), and the frame the verdict reads: the change of the hypothesis-token frame since
    initialisation, as overlap with the final change over chance, its plateau and the KL gain after it,
    beside the authors' raw reading and what the initialisation alone already has. Bottom: the
    specificity control (every 2-D weight block's change measured the same way: where it settles),
    the progress of frame and precision, and the attention mass on the evidence."""
    import textwrap
    plt = _plt()
    steps = np.asarray(fp["steps"])
    mid = np.sqrt(steps[1:] * steps[:-1])                           # geometric midpoints of the intervals
    tv = np.asarray(fp["attention_tv_per_layer"])                    # (S-1, L)
    gaps = np.diff(steps)
    fig, axes = plt.subplots(2, 3, figsize=(19, 9))
    (a, b, e), (f, d, c) = axes
    for l in range(tv.shape[1]):
        a.loglog(mid, np.maximum(tv[:, l] / gaps, 1e-12), "o-", ms=3, label=f"layer {l}")
    a.loglog(mid, np.maximum(fp["attention_tv_rate"], 1e-12), "k-" if len(mid) > 1 else "ko", lw=2, label="mean over layers")
    a.set_ylabel("attention change per step (TV distance / step)")
    a.set_title("attention: how fast the rows move between snapshots", fontsize=9)
    b.loglog(steps, fp["entropy_mae_bits"], "o-", color="C3", ms=3, label="entropy MAE, paper metric (bits)")
    b.loglog(steps, fp["kl_bits"], "s-", color="C4", ms=3, label="KL (bits), what the verdict reads")
    b.set_ylabel("calibration error (bits)")
    b.set_title("precision: calibration against the exact posterior", fontsize=9)
    au, ch = fp["authors"], fp.get("frame_change") or {}
    if ch:
        e.semilogx(steps, ch["change_ratio_to_chance"], "o-", color="k", ms=3,
                   label="change since init: overlap with the final change, x chance (read)")
        if ch.get("change_plateau_step") is not None:
            gain = ch.get("calibration_gain_kl_after_change_plateau")
            e.axvline(ch["change_plateau_step"], color="C2", ls="--", lw=1.2,
                      label=f"its plateau ({ch['change_plateau_step']}); KL x{'n/a' if gain is None else f'{gain:.3g}'} after")
    e.semilogx(steps, au["ratio_to_chance"], "o-", color="C0", ms=3, alpha=0.6,
               label="the authors' raw frame: overlap with the final frame, x chance")
    if ch:
        e.axhline(ch["init_ratio"], color="C1", ls="-.", lw=1.2,
                  label=f"the initialisation alone (step 0): {ch['init_ratio']:.2f}x")
        if ch.get("other_init_ratio"):
            lo, hi = min(ch["other_init_ratio"]), max(ch["other_init_ratio"])
            e.axhspan(lo, hi, color="C1", alpha=0.12, lw=0, label=f"other seeds' initialisations: {lo:.2f}-{hi:.2f}x")
    e.axhline(au["ratio_ceiling"], color="gray", ls=":", lw=1, label=f"ceiling {au['ratio_ceiling']:.2f}x (= C / rank)")
    e.axhline(1.0, color="gray", lw=0.8)
    e.set_ylabel("projection overlap / a random subspace's")
    e.set_title(textwrap.fill(f"frame: span of LN1(wte[h]), h the hypotheses (the authors' run: "
                              f"{fp.get('authors_number', '')})", 80), fontsize=7.5)
    e.legend(fontsize=6.5, frameon=False, loc="lower right")
    blocks = fp.get("blocks") or {}
    if blocks and ch:
        names = list(blocks)
        index = lambda s: len(steps) if s is None else list(steps).index(s)
        at = [index(blocks[n]["plateau_step"]) for n in names] + [index(ch.get("change_plateau_step"))]
        labels = names + ["the frame (hypothesis tokens)"]
        order = np.argsort(at, kind="stable")
        f.barh(np.arange(len(at)), [at[i] for i in order],
               color=["C3" if labels[i].startswith("the frame") else "C7" for i in order])
        f.set_yticks(np.arange(len(at)))
        f.set_yticklabels([labels[i] for i in order], fontsize=6.5 if len(at) <= 24 else 4.5)   # 39 blocks at 6 layers
        f.axvline(np.median(at[:-1]), color="k", ls="--", lw=1, label="the other blocks' median")
        f.set_xlabel(f"snapshot at which the change since init settles (of {len(steps)}; {len(steps)}: never)")
        f.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        f.set_title("specificity: does the frame settle before the other weight blocks?", fontsize=9)
        f.legend(fontsize=7, frameon=False, loc="lower right")
    else:
        f.axis("off")
    mass = np.asarray(fp["consistent_mass"])                        # (S, L)
    for l in range(mass.shape[1]):
        c.semilogx(steps, mass[:, l], "o-", ms=3, label=f"layer {l}")
    c.set_ylabel("attention mass on evidence positions (mean over heads)")
    c.set_title("routing onto the evidence", fontsize=9)
    d.semilogx(steps, fp["frame_progress"], "o-", color="k", ms=3,
               label="attention: 1 - TV(attention, last) / TV(first, last)")
    d.semilogx(steps, fp["precision_progress"], "o-", color="C3", ms=3,
               label="precision: fraction of the log10 entropy-MAE drop")
    d.axhline(0.9, color="gray", lw=0.8)
    d.set_ylabel("progress from first to last snapshot")
    d.set_title("progress (0 = first snapshot, 1 = last)", fontsize=9)
    for ax in (a, b, c, d, e):
        ax.set_xlabel("training step")
        for key, ls, name in (("frame_settle_step", "--", "attention settles"),
                              ("precision_settle_step", ":", "precision settles")):
            if fp[key] is not None and ax is not e:
                ax.axvline(fp[key], color="k", ls=ls, lw=1, label=f"{name} ({fp[key]})")
    for ax in (a, b, c, d):
        ax.legend(fontsize=7, frameon=False, loc="best")
    _verdict(fig, title, "is the frame fixed early while calibration keeps improving? Top right: the change since "
             f"initialisation and its plateau; bottom left: whether other weights settle as early (a series settles "
             f"at the first snapshot after which its change per step stays < {fp['settle_fraction']:g} x its maximum)",
             verdict)
    fig.tight_layout()
    return _save(fig, path)

