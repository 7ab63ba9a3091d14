"""plots: every figure of the project, drawn from the numbers the probes and runs computed.

Each function takes what it draws (metrics, probe results, loss curves) and a path, writes one
PNG there and returns the path. Nothing here computes a reported number.
"""

import math

import numpy as np

LN2 = math.log(2.0)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path, dpi=120):
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    return path


def _verdict(fig, title, what, verdict):
    """The suptitle of a geometry figure: the run, what a student should see, and the verdict of the claim
    that this figure's controls decide (verdicts.judge on the same probes), so that figure and verdict agree."""
    import textwrap
    line = "" if verdict is None else "\nverdict: " + textwrap.shorten(verdict["verdict"], 190, placeholder=" ...")
    fig.suptitle(f"{title}: {what}{line}", fontsize=9)


# ----------------------------------------------------------------------------
# training runs: calibration, single sequences, length generalisation (train.py)

def plot_calibration(results, task, label, path):
    """Every model's entropy by answer index against the exact posterior's (top), and its error |H_model - H_Bayes|
    on a log scale (bottom), so that 0.002 and 0.02 bits look different; label: the task's ANSWER_LABEL."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    fig, (ax, err) = plt.subplots(2, 1, figsize=(6.4, 6.4), sharex=True,
                                  gridspec_kw={"height_ratios": (3, 2)})
    first = next(iter(results.values()))
    pos = [r["position"] for r in first["per_position"]]
    ax.plot(pos, [r["H_bayes"] for r in first["per_position"]], "k-", lw=3, alpha=0.35, label="exact Bayes")
    for name, m in results.items():
        line, = ax.plot(pos, [r["H_model"] for r in m["per_position"]], "o-", ms=3,
                        label=f"{name} (paper metric {m['entropy_mae_bits']:.3g} bits)")
        gap = [max(abs(r["H_model"] - r["H_bayes"]), 1e-6) for r in m["per_position"]]
        err.semilogy(pos, gap, "o-", ms=3, color=line.get_color(), label=name)
    ax.set_ylabel("predictive entropy (bits)\n(mean over held-out sequences)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{task}: model entropy against the exact posterior")
    if len(results) <= 2:                                    # one row below the panel
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(results) + 1, fontsize=8)
    else:                                                    # more runs (compare.py): inside, where the curves fall
        ax.legend(frameon=False, loc="lower left", fontsize=7)
    err.set_ylabel("|H_model - H_Bayes| (bits)")
    err.set_xlabel(label)
    err.grid(alpha=0.3, which="major")
    err.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return _save(fig, path)


def plot_groups(results, task, path):
    """Each model's answer groups (evaluation.group_metrics): its mean entropy against the exact posterior's
    (left) and its KL (right, log scale), one bar per model in each group, the accuracy on one-hot answers
    printed where the group has them."""
    plt = _plt()
    groups = list(next(iter(results.values()))["groups"])
    fig, (ax, kl) = plt.subplots(1, 2, figsize=(8.4, 3.6))
    width = 0.8 / (len(results) + 1)
    x = np.arange(len(groups))
    exact = [next(iter(results.values()))["groups"][g]["h_bayes_bits"] for g in groups]
    ax.bar(x, exact, width, color="k", alpha=0.35, label="exact Bayes")
    for i, (name, m) in enumerate(results.items()):
        g = [m["groups"][k] for k in groups]
        ax.bar(x + (i + 1) * width, [v["h_model_bits"] for v in g], width, color=f"C{i}", label=name)
        bars = kl.bar(x + i * width, [max(v["kl_bits"], 1e-6) for v in g], width, color=f"C{i}", label=name)
        for b, v in zip(bars, g):
            if "accuracy" in v:
                kl.annotate(f"acc. {v['accuracy']:.3f}", (b.get_x() + b.get_width() / 2, b.get_height()), fontsize=6,
                            ha="center", va="bottom")
    ax.set_xticks(x + width * len(results) / 2, groups)
    kl.set_xticks(x + width * (len(results) - 1) / 2, groups)
    ax.set_ylabel("mean predictive entropy (bits)")
    kl.set_yscale("log")
    kl.set_ylabel("KL(posterior || model) (bits)")
    ax.legend(frameon=False, fontsize=7)
    fig.suptitle(f"{task}: the answers by group", fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def plot_traces(traces, task, label, path):
    """Four held-out sequences: the model's entropy at each answer against that sequence's own posterior. Where
    every sequence has the same posterior entropies (a function of the position alone, as in format a), the
    title says the panels differ only in the model."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(2, 2, figsize=(8, 5), sharex=True, sharey=True)
    for s, ax in enumerate(axes.ravel()):
        x = np.arange(1, traces["h_bayes"].shape[1] + 1)
        ax.plot(x, traces["h_bayes"][s], "k-", lw=3, alpha=0.35, label="this sequence's posterior")
        ax.plot(x, traces["h_model"][s], "o-", ms=3, label="model")
        ax.set_title(f"held-out sequence {s}", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=2, frameon=False, fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel(label)
    for ax in axes[:, 0]:
        ax.set_ylabel("entropy (bits)")
    same = np.allclose(traces["h_bayes"][:4], traces["h_bayes"][0])
    fig.suptitle(f"{task}: single sequences" + ("\nevery sequence has the same posterior entropy at each position (a "
                                                "function of the position alone),\nso the panels differ only in the "
                                                "model" if same else ""), fontsize=10 if same else 12)
    fig.tight_layout(rect=(0, 0.05, 1, 1))                   # the legend below the panels, off the data
    return _save(fig, path)


def variant_curves(metrics, key):
    """A run's metrics and its task's VARIANTS key -> {label: dict(per_position, kl_bits)}, what plot_variants
    draws (the first label: the run's own settings)."""
    return {label: dict(per_position=v, kl_bits=metrics[key][label]) for label, v in metrics[key + "_curves"].items()}


def plot_variants(curves, path, label_format="{}", xlabel="answer index i", title="held-out variants"):
    """KL by answer index on each held-out variant of a task (log scale; the HMM: each length K), the last
    answer of the first (the run's own settings: for the HMM, its training length) marked."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, m in curves.items():
        ax.semilogy([r["position"] for r in m["per_position"]], [max(r["kl"], 1e-7) for r in m["per_position"]],
                    "o-", ms=3, label=f"{label_format.format(label)} (mean {m['kl_bits']:.2g} bits)")
    first = next(iter(curves))
    ax.axvline(len(curves[first]["per_position"]), color="gray", ls=":",
               label=f"the run's own setting ({label_format.format(first)})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("KL(posterior || model) (bits)")
    ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, loc="lower right", fontsize=8)
    ax.grid(alpha=0.3, which="major")
    fig.tight_layout()
    return _save(fig, path)


def plot_primitives(rows, path, good, partial, primitive=None, floors=None):
    """The measured matrix (matrix.table rows): families (and the transformer's depth rows) down, tasks across,
    each cell coloured by its score (mean over seeds), the scores per seed and the mark printed; the authors'
    hand-drawn mark beside it where their figure has the cell; primitive: {task: what it exercises}; floors:
    {task: its shortcut's score}, under the task's name."""
    plt = _plt()
    task_names = list(dict.fromkeys(r["task"] for r in rows))
    fams = list(dict.fromkeys((r["family"], r["layers"]) for r in rows))
    grid = np.full((len(fams), len(task_names)), np.nan)
    fig, ax = plt.subplots(figsize=(2.2 + 2.3 * len(task_names), 1.2 + 0.62 * len(fams)))
    for r in rows:
        i, j = fams.index((r["family"], r["layers"])), task_names.index(r["task"])
        grid[i, j] = np.mean(r["score"]) if r["score"] else np.nan      # a cell sitting out: blank
        authors = "" if r.get("authors") is None else f"\nauthors: {r['authors']}"
        ax.text(j, i, " / ".join(f"{np.floor(s * 100) / 100:.2f}" for s in r["score"]) + f"  {r['verdict']}{authors}",
                ha="center",
                va="center", fontsize=7)
    im = ax.imshow(np.clip(grid, 0, 1), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    floor = lambda t: "" if not floors or floors.get(t) is None else f"; shortcut {np.floor(floors[t] * 100) / 100:.2f}"
    ax.set_xticks(range(len(task_names)), [t + (f"\n({primitive[t]}{floor(t)})" if primitive and t in primitive else "")
                                           for t in task_names])
    ax.set_yticks(range(len(fams)), [f + (f", {L} layers" if L else "") for f, L in fams])
    fig.colorbar(im, ax=ax, label="score: 1 - KL(model) / KL(uniform)")
    ax.set_title(f"the primitives, measured (per seed; mark: {good:g} and above, ~ from {partial:g}, "
                 f"below it a cross)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_variants_across(runs, path, label_format="{}", xlabel="answer index i", title="held-out variants"):
    """runs {label: variant_curves(...)}: KL by answer index, one colour per run, one line style per variant
    (the HMM: K = 20 solid, 30 dashed, 50 dotted), the first variant's last answer marked."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    styles = ["-", "--", ":", "-."]
    for c, (name, curves) in enumerate(runs.items()):
        for s, (label, m) in enumerate(curves.items()):
            ax.semilogy([r["position"] for r in m["per_position"]], [max(r["kl"], 1e-7) for r in m["per_position"]],
                        styles[s % len(styles)], color=f"C{c}", lw=1.5,
                        label=f"{name}, {label_format.format(label)} (mean {m['kl_bits']:.2g} bits)")
    first = next(iter(next(iter(runs.values())).values()))
    ax.axvline(len(first["per_position"]), color="gray", ls=":", lw=1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("KL(posterior || model) (bits)")
    ax.set_title(title, fontsize=10)
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3, which="major")
    fig.tight_layout()
    return _save(fig, path)


def plot_learning_curves(curves, path):
    """matrix.learning_curves: one panel per task, each family's KL estimate (training loss above the exact
    posterior's) against the sequences it has seen, log scales: how fast each family learns, not only where
    it ends."""
    plt = _plt()
    fig, axes = plt.subplots(1, max(1, len(curves)), figsize=(3.6 * max(1, len(curves)), 3.4), squeeze=False)
    for ax, (task, fams) in zip(axes[0], curves.items()):
        for c, (label, (seen, kl)) in enumerate(fams.items()):
            ax.loglog(seen, np.maximum(kl, 1e-4), "-", color=f"C{c}", lw=1.2, label=label)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("sequences seen")
        ax.grid(alpha=0.3, which="major")
    axes[0][0].set_ylabel("training loss above exact Bayes (bits):\nthe KL, estimated on each batch")
    axes[0][-1].legend(frameon=False, fontsize=6, loc="lower left")
    fig.tight_layout()
    return _save(fig, path)


def plot_sweep(rows, path, sweep):
    """A recall sweep (matrix.sweep_table rows): each family's score against the stored pairs (capacity) or the
    filler (distance), a hollow marker where its training loss was not flat (matrix.flat), each point labelled with the floats
    its family carries from step to step; the families that sit a point out named in the legend."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.6, 4.6))
    key = "pairs" if sweep == "capacity" else "filler"
    x_of = lambda r: int(r["point"][len(key):])
    for c, fam in enumerate(dict.fromkeys(r["family"] for r in rows)):
        mine = sorted((r for r in rows if r["family"] == fam), key=x_of)
        ran = [r for r in mine if "sits_out" not in r and "failed" not in r]
        out = [x_of(r) for r in mine if "sits_out" in r or "failed" in r]
        label = fam + (f" (sits out at {', '.join(map(str, out))})" if out else "")
        ax.plot([x_of(r) for r in ran], [r["score"] for r in ran], "-", color=f"C{c}", label=label)
        for r in ran:
            ax.plot(x_of(r), r["score"], "o", color=f"C{c}", mfc=f"C{c}" if r["flat"] else "white")
            if r["state_floats"] is not None:
                ax.annotate(f"{r['state_floats']:,}", (x_of(r), r["score"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points", color=f"C{c}")
    ax.set_xscale("symlog" if key == "filler" else "log", base=2)
    ax.set_xlabel("stored pairs" if key == "pairs" else "longest filler run (8 pairs)")
    ax.set_ylabel("score: 1 - KL(model) / KL(uniform)")
    ax.set_title(f"recall: {'capacity' if key == 'pairs' else 'distance'} (numbers: floats carried from step to "
                 f"step; hollow: not flat at the end)", fontsize=9)
    ax.legend(frameon=False, fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


# ----------------------------------------------------------------------------
# the geometry probes (manifold.py)

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
    a.loglog(mid, np.maximum(fp["attention_tv_rate"], 1e-12), "k-", lw=2, label="mean over layers")
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


# ----------------------------------------------------------------------------
# Paper II on the sticky chain (dynamics.py)

ARMS = {"sgd": ("SGD (lr 0.01)", "tab:red"), "em": ("EM-like (W_V lr 0.1)", "tab:blue"),
        "mstep": ("true M-step + routing SGD", "tab:green")}
LONG = ("SGD lr 0.3, long horizon", "tab:orange")


def _band(ax, xs, ys, label, color):
    """Mean line and a +-1 std band over the first axis of ys (seeds, steps)."""
    m, s = ys.mean(0), ys.std(0)
    ax.plot(xs, m, color=color, label=label, lw=1.8)
    ax.fill_between(xs, m - s, m + s, color=color, alpha=0.2)


def _legend_below(ax, ncol=2):
    """The legend under the panel, where it covers no data."""
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=ncol, frameon=False)


def _integer_steps(axes):
    """Integer ticks on every panel whose x axis counts training steps."""
    from matplotlib.ticker import MaxNLocator
    for ax in np.ravel(axes):
        if "step" in ax.get_xlabel():
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_em_vs_sgd(out, path):
    """Loss against steps and seconds, steps to threshold, held-out loss against exact Bayes, a table."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    fig, axes = plt.subplots(2, 3, figsize=(19, 13.5))
    cfg = out["config"]
    bound = cfg["conditional_entropy_bound_bits"]
    settings = {"long_chain": f"one chain of T = {cfg['T']}",
                "short_sequences": f"{cfg['short_batch'][0]} chains of T = {cfg['short_batch'][1]}"}
    for ax, (setting, title) in zip((axes[0, 0], axes[1, 0]), settings.items()):
        summ = out[setting]
        for m, (label, color) in ARMS.items():
            loss = np.array([r["loss"] for r in out["curves"][setting][m]]) / LN2
            s = summ[m]
            _band(ax, np.arange(loss.shape[1]), loss, f"{label}: {s['steps_to_threshold_mean']:.3g} ± "
                  f"{s['steps_to_threshold_std']:.2g} steps to threshold ({s['reached']}/{len(loss)} reached)", color)
        ax.axhline(summ["threshold_bits"], color="k", ls="--", lw=1,
                   label=f"threshold = SGD's mean final loss, {summ['threshold_bits']:.4f}")
        ax.axhline(np.mean(summ["train_bayes_loss_bits"]), color="tab:purple", ls=":", lw=1.5,
                   label=f"exact Bayes predictor on these chains, {np.mean(summ['train_bayes_loss_bits']):.4f}")
        ax.axhline(bound, color="tab:gray", ls="-.", lw=1, label=f"H(Y_t+1 | Y_t) = {bound:.4f}")
        ax.set(xlabel="training step (full batch)", ylabel="training cross-entropy (bits / token)",
               title=f"One head, {title}: mean ± std, {len(summ['per_seed'])} seeds")
        _legend_below(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax = axes[0, 1]
    for m, (label, color) in ARMS.items():
        for k, r in enumerate(out["curves"]["long_chain"][m]):
            ax.plot(r["seconds"], np.asarray(r["loss"]) / LN2, color=color, lw=1, alpha=0.7,
                    label=f"{label}, {out['long_chain'][m]['seconds_per_step_median'] * 1e3:.2g} ms / step" if k == 0 else None)
    ax.axhline(out["long_chain"]["threshold_bits"], color="k", ls="--", lw=1, label="threshold")
    ax.set(xlabel="compute seconds (logging excluded; a shared 2-core CPU)", ylabel="training cross-entropy (bits / token)",
           title="Long chain against compute time (one line per seed)")
    _legend_below(ax)
    ax.grid(alpha=0.3)
    ax = axes[1, 1]
    width = 0.13
    seeds = [row["seed"] for row in out["long_chain"]["per_seed"]]
    xs = np.arange(len(seeds))
    k = 0
    for setting, hatch in (("long_chain", None), ("short_sequences", "//")):
        for m in ("em", "mstep", "sgd"):
            label, color = ARMS[m]
            rows = out[setting]["per_seed"]
            vals = [row[m]["steps_to_threshold"] for row in rows]
            pos = xs + (k - 2.5) * width
            ax.bar(pos, vals, width, color=color, hatch=hatch, alpha=0.85 if hatch is None else 0.4, edgecolor="k",
                   lw=0.5, label=f"{label.split(' (')[0]}, {'long chain' if hatch is None else 'short sequences'}")
            for p, row, v in zip(pos, rows, vals):
                if not row[m]["reached"] or v < 50:
                    ax.text(p, v, "x" if not row[m]["reached"] else str(v), ha="center", va="bottom", fontsize=8)
            k += 1
    ax.set_xticks(xs, [str(s) for s in seeds])
    ax.set(xlabel="seed", ylabel="steps until the training loss is below the threshold",
           title="Steps to threshold per seed (x: not reached, bar = steps run)",
           ylim=(0, 1.35 * ax.get_ylim()[1]))
    _legend_below(ax)
    ax.grid(alpha=0.3, axis="y")
    ax = axes[0, 2]
    top = min(5.0, max(3.6, max(row[m]["heldout_loss_bits"] for s in settings for row in out[s]["per_seed"]
                                for m in ARMS) + 0.05))          # an overfitting model can be far above: clipped at 5
    for j, setting in enumerate(settings):
        ref = out[setting]["heldout_reference"]
        for i, m in enumerate(ARMS):
            label, color = ARMS[m]
            vals = [row[m]["heldout_loss_bits"] for row in out[setting]["per_seed"]]
            p = 4 * j + i
            ax.bar(p, min(np.mean(vals), top), 0.8, color=color, alpha=0.6, edgecolor="k", lw=0.5,
                   label=label if j == 0 else None)
            ax.plot([p] * len(vals), vals, "k.", ms=4)
            ax.text(p, min(np.mean(vals), top) + 0.01, f"{np.mean(vals):.3f}", ha="center", va="bottom", fontsize=8)
        ax.hlines(ref["bayes_loss_bits"], 4 * j - 0.5, 4 * j + 2.5, color="tab:purple", lw=2,
                  label="exact Bayes predictor" if j == 0 else None)
        ax.hlines(ref["conditional_entropy_bound_bits"], 4 * j - 0.5, 4 * j + 2.5, color="tab:gray", ls="-.",
                  label="H(Y_t+1 | Y_t)" if j == 0 else None)
    ax.axhline(3.0, color="k", lw=0.5, ls=":")
    ax.set_xticks([1, 5], ["long chain", "short sequences"])
    ax.set_ylim(2.6, top + 0.1 + 0.12 * (top - 2.6))                 # the legend's band, above every bar
    ax.set(ylabel="held-out cross-entropy (bits / token)",
           title=f"Held-out chains (seed {cfg['eval_seed']}) vs exact Bayes; dots: seeds; bars clipped at {top:g}")
    _legend_below(ax, ncol=3)
    ax.grid(alpha=0.3, axis="y")
    ax = axes[1, 2]
    ax.axis("off")
    lines = []
    for setting in settings:
        s = out[setting]
        lines.append(f"{setting.replace('_', ' ')}: threshold {s['threshold_bits']:.4f} bits")
        for m in ("em", "mstep"):
            t = s[m]
            p_steps = t["paired_steps_vs_sgd"]
            p_loss = t["paired_final_loss_vs_sgd"]
            lines.append(f"  {m:5s} steps {t['steps_to_threshold_mean']:.3g} ± {t['steps_to_threshold_std']:.2g}"
                         f"  {t['speedup_steps']:.3g}x sooner in steps, {t['speedup_seconds']:.3g}x in seconds")
            lines.append(f"        paired t on final loss p = {p_loss['ttest_rel'].get('p', float('nan')):.2g},"
                         f" on steps p = {p_steps['ttest_rel'].get('p', float('nan')):.2g}"
                         f" (Wilcoxon {p_steps['wilcoxon'].get('p', float('nan')):.2g})")
    lines.append("")
    lines.append("exact Bayes vs H(Y_t+1 | Y_t), held-out, bits:")
    for sig, r in out["exact_bayes_reference"].items():
        lines.append(f"  sigma {float(sig):.0f}: Bayes CE {r['bayes_loss_bits']:.4f} (entropy {r['bayes_entropy_bits']:.4f}),"
                     f" bound {r['conditional_entropy_bound_bits']:.4f}, gap {r['bound_gap_entropy_bits']:.4f}")
    s3 = out["sigma3_sgd"]
    lines.append(f"  SGD at sigma 3: {s3['loss_bits']:.4f} (Bayes {s3['bayes_loss_bits']:.4f}, KL {s3['kl_bits']:.4f})")
    ax.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=8.5, transform=ax.transAxes)
    ax.set_title("Summary (steps not reached count as the steps run)")
    fig.suptitle("Paper II, sticky Markov chain: SGD against the EM-like schedule and a true M-step", fontsize=13)
    _integer_steps(axes)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_two_timescales(out, path):
    """Routing vs value gradients, advantages, the frame, prototypes (one head); the same for the transformer."""
    plt = _plt()
    fig, axes = plt.subplots(3, 3, figsize=(19, 20))
    curves = out["curves"]["long_chain"]
    lh = out["long_horizon_sgd"]
    tsum = out["two_timescales_one_head"]
    runs = [(m, np.mean([c["routing_norm"] for c in curves[m]], 0), np.mean([c["value_norm"] for c in curves[m]], 0),
             ARMS[m]) for m in ARMS] + [("long", np.asarray(lh["routing_norm"]), np.asarray(lh["value_norm"]), LONG)]
    logged = [(tsum[m]["log_steps"], tsum[m], ARMS[m]) for m in ARMS if tsum[m]["log_steps"]]
    logged.append(([l["step"] for l in lh["logs"]], {k: [l.get(k) for l in lh["logs"]] for k in lh["logs"][-1]}, LONG))

    ax = axes[0, 0]
    for m, r, v, (label, color) in runs:
        if m != "mstep":                                         # the M-step arm's value gradient is ~0 by design
            ax.plot(r, color=color, lw=1.8, label=f"{label}: routing")
            ax.plot(v, color=color, lw=1.8, ls="--", label=f"{label}: value")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="gradient norm",
           title="One head: routing |(dW_Q, dW_K)| solid, value |(dW_V, dW_O)| dashed")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")

    ax = axes[0, 1]
    for m, r, v, (label, color) in runs:
        if m != "mstep":
            ax.plot(r / v, color=color, lw=1.8, label=label)
    ax.set(xlabel="training step", ylabel="routing / value gradient norm", ylim=(0, None),
           title="One head: routing / value ratio (lr 0.01 arms: seed mean)")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")

    ax = axes[0, 2]
    for run, (label, color) in ((curves["sgd"][0], ARMS["sgd"]), (curves["em"][0], ARMS["em"]), (lh, LONG)):
        st = [l["step"] for l in run["logs"]]
        qs = np.array([l["adv_quantiles"] for l in run["logs"]])
        ax.plot(st, qs[:, 4] - qs[:, 0], color=color, ls=":", lw=1.5, label=f"{label}: 5-95% range")
        ax.plot(st, qs[:, 3] - qs[:, 1], color=color, ls="--", lw=1.5, label=f"{label}: 25-75% range")
        ax.plot(st, [l["adv_weighted_std"] for l in run["logs"]], color=color, lw=1.8,
                label=f"{label}: alpha-weighted std")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="spread of the advantage b_ij - b_bar_i (nats)",
           title=f"Spread of advantages b_ij - b_bar_i (seed {curves['sgd'][0]['seed']})")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")

    ax = axes[1, 0]
    for st, s, (label, color) in logged:
        ax.plot(st, s["attn_entropy_frac"], color=color, lw=1.8, marker=".", label=label)
    ax.set(xlabel="training step", ylabel="mean_i H(alpha_i) / log2(i + 1)", ylim=(0, 1.05),
           title="The frame: attention entropy / uniform's")
    _legend_below(ax)
    ax.grid(alpha=0.3)

    ax = axes[1, 1]
    for st, s, (label, color) in logged:
        ax.plot(st[1:], s["frame_drift"][1:], color=color, ls=":", lw=1.8, marker=".", label=f"{label}: frame")
        ax.plot(st[1:], s["value_drift"][1:], color=color, ls="--", lw=1.5, label=f"{label}: values")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="change since the previous log",
           title="Drift per log interval: frame (TV of alpha rows) vs values")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")

    ax = axes[1, 2]
    for st, s, (label, color) in logged:
        ax.plot(st, s["prototype_cos"], color=color, lw=1.8, marker=".", label=f"{label}: mean {np.mean(s['prototype_cos']):.3f}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="training step", ylabel="mean_j cos(change of v_j, -sum_i alpha_ij u_i)", ylim=(-1.05, 1.05),
           title="Values become prototypes? v_j's step vs its M-step signal")
    _legend_below(ax)
    ax.grid(alpha=0.3)

    tr = out["transformer"]
    routing, value = np.array(tr["routing_norm"]), np.array(tr["value_norm"])
    n_layers = routing.shape[1]
    colors = plt.cm.viridis(np.linspace(0, 0.85, n_layers))
    smooth = lambda a: np.convolve(a, np.ones(10) / 10, mode="valid") if len(a) >= 10 else a
    name = f"Bijection transformer, {n_layers} layers, width {tr['config']['d_model']}"
    ax = axes[2, 0]
    for l in range(n_layers):
        ax.plot(smooth(routing[:, l]), color=colors[l], lw=1.6, label=f"layer {l}: routing |(wq, wk)|")
        ax.plot(smooth(value[:, l]), color=colors[l], lw=1.6, ls="--", label=f"layer {l}: value |(wv, wo)|")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="gradient norm (10-step running mean)",
           title=f"{name}: gradient norms\nprobe loss {tr['probe_loss_bits']:.3f} bits, exact Bayes "
                 f"{tr['probe_bayes_loss_bits']:.3f}, KL {tr['probe_kl_bits']:.3f}")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")
    ax = axes[2, 1]
    for l in range(n_layers):
        ax.plot(smooth(routing[:, l] / value[:, l]), color=colors[l], lw=1.6, label=f"layer {l}")
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="routing / value gradient norm (10-step running mean)",
           title="Transformer: the ratio per layer")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")
    ax = axes[2, 2]
    probes = tr["probes"][1:]
    st = [p["step"] for p in probes]
    for l in range(n_layers):
        ax.plot(st, [p["frame_drift"][l] for p in probes], color=colors[l], ls=":", lw=1.8, marker=".",
                label=f"layer {l}: frame (TV of attention rows)")
        ax.plot(st, [p["value_drift"][l] for p in probes], color=colors[l], ls="--", lw=1.5,
                label=f"layer {l}: values (relative change)")
    ax.set_yscale("log")
    ax.set(xlabel="training step (the learning rate decays, cosine, to 0)", ylabel="change between probes",
           title="Transformer: frame vs value drift (fixed probe batch)")
    _legend_below(ax)
    ax.grid(alpha=0.3, which="both")
    fig.suptitle("Two timescales: routing (the frame) against values (the precision)", fontsize=14)
    _integer_steps(axes)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_deep_variant(out, path):
    """Paper II's deep variant, one line per seed: the training loss over the steps against the exact Bayes
    predictor's loss on the held-out chains and the bound H(Y_t+1 | Y_t); then per seed the held-out loss
    beside exact Bayes on the same chain, with the KL between them."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    cfg, rows = out["config"], out["per_seed"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw=dict(width_ratios=(3, 2)))
    ax = axes[0]
    for k, r in enumerate(rows):
        ax.plot(np.arange(1, len(r["train_loss_bits"]) + 1), r["train_loss_bits"], lw=1, color=f"C{k}",
                label=f"seed {r['seed']}: training chain")
    ax.axhline(out["test_bayes_loss_bits_mean"], color="tab:purple", ls=":", lw=1.5,
               label=f"exact Bayes on the held-out chains, {out['test_bayes_loss_bits_mean']:.4f} (mean)")
    ax.axhline(cfg["bound_bits"], color="tab:gray", ls="-.", lw=1, label=f"H(Y_t+1 | Y_t) = {cfg['bound_bits']:.4f}")
    ax.set(xlabel="training step (full batch, one chain)", ylabel="cross-entropy (bits / token)",
           title=f"{cfg['n_layers']} pre-LN blocks of width {cfg['d_model']}, AdamW at {cfg['lr']:g}, cosine to 0; "
                 f"T = {cfg['T']:,}", xscale="log")
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    ax.grid(alpha=0.3)
    ax = axes[1]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["test_loss_bits"] for r in rows], width=0.4, color="C0", label="the deep variant, held-out")
    ax.bar(x + 0.2, [r["test_bayes_loss_bits"] for r in rows], width=0.4, color="tab:purple", alpha=0.6,
           label="exact Bayes, the same chain")
    for k, r in enumerate(rows):
        ax.text(k, max(r["test_loss_bits"], r["test_bayes_loss_bits"]) + 0.02, f"KL {r['test_kl_bits']:.3f}",
                ha="center", fontsize=7)
    ax.axhline(cfg["bound_bits"], color="tab:gray", ls="-.", lw=1, label="H(Y_t+1 | Y_t)")
    ax.set_xticks(x)
    ax.set_xticklabels([f"seed {r['seed']}" for r in rows], fontsize=8)
    ax.set_ylim(0, 1.08 * max(r["test_loss_bits"] for r in rows))    # bars from 0: their lengths compare
    ax.set(ylabel="held-out cross-entropy (bits / token)", title="held-out chain (seed + 10000) of each seed")
    ax.yaxis.set_major_locator(MaxNLocator(6))
    ax.legend(fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.suptitle(f"Paper II's deep variant on the sticky chain ({cfg['chain']}): held-out "
                 f"{out['test_loss_bits_mean']:.4f} bits against exact Bayes's {out['test_bayes_loss_bits_mean']:.4f} "
                 f"(KL {out['test_kl_bits_mean']:.4f}), {len(rows)} seeds. What to see: how far each held-out bar "
                 f"stands above exact Bayes's", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
