"""plots: the figures of training runs and of the matrix, drawn from the numbers the runs computed (the geometry
probes' figures are geometry/plots_geometry.py's, Paper II's dynamics/plots_dynamics.py's).

Each function takes what it draws (metrics, probe results, loss curves) and a path, writes one
PNG there and returns the path. Nothing here computes a reported number.
"""

import os

import numpy as np


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


STRICT = False    # True (conftest.py sets it for the tests' own process): a figure that breaks a rule is an error


def figure_problems(fig):
    """The rules every saved figure keeps, checked from matplotlib's own text extents at the saved size: no text
    outside the image; no two texts drawn over each other (titles, labels, tick labels, legends, notes); no
    series of one point without a marker; no legend over a plotted point. -> [one line per problem]."""
    import matplotlib.text
    from matplotlib.lines import Line2D
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    W, H = fig.bbox.width, fig.bbox.height
    ticks, drawn = set(), set()               # a tick outside the axis' view keeps its label, not drawn
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            lo, hi = min(lo, hi), max(lo, hi)
            tol = 1e-9 * max(1.0, abs(hi - lo))
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                ticks.update((tick.label1, tick.label2))
            for locs, get in ((axis.get_majorticklocs(), axis.get_major_ticks),
                              (axis.get_minorticklocs(), axis.get_minor_ticks)):
                for tick, loc in zip(get(len(locs)), locs):
                    if lo - tol <= loc <= hi + tol:
                        drawn.update(t for t in (tick.label1, tick.label2) if t.get_visible())
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()
             and (t not in ticks or t in drawn)]
    boxes = []
    for t in texts:
        b = t.get_window_extent(renderer)
        if b.width <= 0 or b.height <= 0:
            continue
        boxes.append((t, b))
    problems = []
    name = lambda t: repr(t.get_text().replace("\n", " ")[:50])
    for t, b in boxes:
        if b.x0 < -1 or b.y0 < -1 or b.x1 > W + 1 or b.y1 > H + 1:
            problems.append(f"text {name(t)} runs outside the image")
    for i, (t1, b1) in enumerate(boxes):
        for t2, b2 in boxes[i + 1:]:
            w = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
            h = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
            if w > 1 and h > 1 and w * h > 0.1 * min(b1.width * b1.height, b2.width * b2.height):
                problems.append(f"texts {name(t1)} and {name(t2)} are drawn over each other")
    for ax in fig.axes:
        for line in ax.get_lines():
            x = np.asarray(line.get_xdata(), float)
            if line.get_visible() and np.isfinite(x).sum() == 1 and line.get_marker() in (None, "", "None", " "):
                problems.append(f"a series of one point without a marker ({line.get_label()!r})")
        legend = ax.get_legend()
        if legend is None or not legend.get_visible():
            continue
        lb = legend.get_window_extent(renderer)
        for line in ax.get_lines():
            if not isinstance(line, Line2D) or not line.get_visible() or line.get_label().startswith("_"):
                continue
            xy = np.column_stack([np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)])
            xy = xy[np.isfinite(xy).all(1)]
            if len(xy) and len(xy) < 10_000:
                pts = line.get_transform().transform(xy)           # axhline's x is in axes coordinates
                if np.any((pts[:, 0] > lb.x0) & (pts[:, 0] < lb.x1) & (pts[:, 1] > lb.y0) & (pts[:, 1] < lb.y1)):
                    problems.append(f"the legend sits on the points of {line.get_label()!r}")
                    break
    return list(dict.fromkeys(problems))


def _save(fig, path, dpi=120):
    """Save and close; under STRICT a figure breaking figure_problems' rules is a ValueError."""
    fig.set_dpi(dpi)
    if STRICT:
        problems = figure_problems(fig)
        if problems:
            _plt().close(fig)
            raise ValueError(f"{os.path.basename(path)}: " + "; ".join(problems[:6]))
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    return path


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
    ax.plot(pos, [r["H_bayes"] for r in first["per_position"]], "k-" if len(pos) > 1 else "ko", lw=3, alpha=0.35,
            label="exact Bayes")
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
    else:                                                    # more runs (harness/compare.py): inside, where the curves fall
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
    import textwrap
    names = [textwrap.fill(g, 10) for g in groups]        # a long name on lines of its own, not into the next
    ax.set_xticks(x + width * len(results) / 2, names)
    kl.set_xticks(x + width * (len(results) - 1) / 2, names)
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
        ax.plot(x, traces["h_bayes"][s], "k-" if len(x) > 1 else "ko", lw=3, alpha=0.35, label="this sequence's posterior")
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
    fig, ax = plt.subplots(figsize=(8.4, 4.2))
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
    ax.legend(frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)    # beside, off the data
    ax.grid(alpha=0.3, which="major")
    fig.tight_layout()
    return _save(fig, path)


def row_label(family, layers=None):
    """A matrix row's name: the family, and a depth row's layers ("transformer, 1 layer")."""
    return family + (f", {layers} layer{'s' if layers > 1 else ''}" if layers else "")


def plot_primitives(rows, path, good, partial, primitive=None, floors=None, depths=None):
    """The measured matrix (matrix.table rows): families (and the transformer's depth rows) down, tasks across,
    each cell coloured by the share of its shortcut's gap it closes (mean over seeds: the score the marks read,
    so a model at or below the shortcut is never green), that share per seed and the mark printed, the score
    against uniform under it; the effective memory where the task reads one; the authors' hand-drawn mark
    beside it where their figure has the cell, and a run of 4x the steps where one was trained
    (matrix.X4_RULE); primitive: {task: what it exercises}; floors: {task: its shortcut's score}, under the
    task's name; depths: {task: the transformer row's layers}, said in the depth row's cell that the
    transformer row already is."""
    plt = _plt()
    cut = lambda s: f"{np.floor(s * 100) / 100:.2f}"
    task_names = list(dict.fromkeys(r["task"] for r in rows))
    fams = list(dict.fromkeys((r["family"], r["layers"]) for r in rows))
    grid = np.full((len(fams), len(task_names)), np.nan)
    fig, ax = plt.subplots(figsize=(2.2 + 2.5 * len(task_names), 1.2 + 0.8 * len(fams)))
    for r in rows:
        i, j = fams.index((r["family"], r["layers"])), task_names.index(r["task"])
        grid[i, j] = np.mean(r["closed"]) if r["score"] else np.nan      # a cell sitting out: blank
        text = f"{' / '.join(cut(s) for s in r['closed'])}  {r['verdict']}" if r["score"] else r["verdict"]
        if r["score"] and r.get("floor") is not None:
            text += f"\n(vs uniform {' / '.join(cut(s) for s in r['score'])})"
        if r.get("memory"):
            text += "\nmemory k " + " / ".join("< 0" if w == "below" else f"{k:.1f}"
                                                for k, w in zip(r["memory"], r["memory_where"]))
        if r.get("authors") is not None:
            text += f"\nauthors: {r['authors']}"
        if "score_4x" in r:
            text += f"\n4x the steps: {cut(r['closed_4x'])} {r['mark_4x']}"
        ax.text(j, i, text, ha="center", va="center", fontsize=6.5)
    for j, t in enumerate(task_names):
        if depths and t in depths and ("transformer", depths[t]) in fams:
            ax.text(j, fams.index(("transformer", depths[t])), "the transformer row\n(its preset's depth)",
                    ha="center", va="center", fontsize=7, color="gray")
    im = ax.imshow(np.clip(grid, 0, 1), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    floor = lambda t: "" if not floors or floors.get(t) is None else f"; shortcut {cut(floors[t])}"
    ax.set_xticks(range(len(task_names)), [t + (f"\n({primitive[t]}{floor(t)})" if primitive and t in primitive else "")
                                           for t in task_names])
    ax.set_yticks(range(len(fams)), [row_label(f, L) for f, L in fams])
    fig.colorbar(im, ax=ax, label="share of the shortcut's gap closed")
    ax.set_title(f"the primitives, measured (per seed, against each task's shortcut; mark: {good:g} and above,\n"
                 f"~ from {partial:g}, below it a cross)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_memory(steps, rows, path, task):
    """Effective memory: the window filters' KL against the observations k they remember (steps {k: KL}, on a
    log2(1 + k) axis), each row's KL (matrix.table rows with memory) as a horizontal line per seed, and where
    it crosses the staircase marked: that seed's effective memory."""
    plt = _plt()
    ks = sorted(steps)
    x = lambda k: np.log2(1 + np.asarray(k, float))
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot(x(ks), [steps[k] for k in ks], "k-o", lw=2, ms=5, label="window filter of k observations", zorder=3)
    for c, r in enumerate(rows):
        for s, (kl, k, where) in enumerate(zip(r["kl"], r["memory"], r["memory_where"])):
            ax.axhline(kl, color=f"C{c}", lw=1, ls="-" if s == 0 else "--", alpha=0.8,
                       label=f"{row_label(r['family'], r['layers'])}: k " + " / ".join(
                           "< 0" if w == "below" else f"{m:.1f}" for m, w in zip(r["memory"], r["memory_where"]))
                       if s == 0 else None)
            if where == "within":
                ax.plot(x(k), kl, "o", color=f"C{c}", ms=7, mfc="none", mew=1.5, zorder=4)
    ax.set_xticks(x(ks), [str(k) for k in ks])
    ax.set_yscale("log")
    ax.set_xlabel("k, the observations a window filter remembers (log2(1 + k) axis)")
    ax.set_ylabel("KL(posterior || model) (bits)")
    ax.set_title(f"{task}: effective memory (a seed's line crosses the staircase at its k; one line a seed)",
                 fontsize=9)
    ax.legend(frameon=False, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.grid(alpha=0.3)
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
    fig, axes = plt.subplots(1, max(1, len(curves)), figsize=(3.6 * max(1, len(curves)) + 1.6, 3.4), squeeze=False)
    labels = list(dict.fromkeys(label for fams in curves.values() for label in fams))    # one colour a row, every panel
    for ax, (task, fams) in zip(axes[0], curves.items()):
        for label, (seen, kl) in fams.items():
            ax.loglog(seen, np.maximum(kl, 1e-4), "-", color=f"C{labels.index(label) % 10}", lw=1.2, label=label)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("sequences seen")
        ax.grid(alpha=0.3, which="major")
    axes[0][0].set_ylabel("training loss above exact Bayes (bits):\nthe KL, estimated on each batch")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    axes[0][-1].legend([handles[k] for k in labels], labels, frameon=False, fontsize=7, loc="upper left",
                       bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    return _save(fig, path)


def plot_sweep(rows, path, sweep, shortcut=None):
    """A recall sweep (matrix.sweep_table rows): each family's score against the stored pairs (capacity) or the
    filler (distance), a hollow marker where its training loss was not flat (matrix.flat), each point labelled
    with the floats its family carries from step to step; beside it the stored pairs it answers
    (matrix.pairs_answered) against every pair and, where given, the shortcut's ({point: pairs answered});
    the families that sit a point out named in the legend."""
    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    key = "pairs" if sweep == "capacity" else "filler"
    x_of = lambda r: int("".join(ch for ch in r["point"] if ch.isdigit()))     # "pairs16", "fixed32"
    for c, fam in enumerate(dict.fromkeys(r["family"] for r in rows)):
        mine = sorted((r for r in rows if r["family"] == fam), key=x_of)
        ran = [r for r in mine if "sits_out" not in r and "failed" not in r]
        out = [x_of(r) for r in mine if "sits_out" in r or "failed" in r]
        label = fam + (f" (sits out at {', '.join(map(str, out))})" if out else "")
        ax.plot([x_of(r) for r in ran], [r["score"] for r in ran], "-", color=f"C{c}", label=label)
        answered = [r for r in ran if r.get("answered") is not None]
        bx.plot([x_of(r) for r in answered], [r["answered"] for r in answered], "-", color=f"C{c}", label=label)
        for r in ran:
            fill = dict(color=f"C{c}", mfc=f"C{c}" if r["flat"] else "white")
            ax.plot(x_of(r), r["score"], "o", **fill)
            if r.get("answered") is not None:
                bx.plot(x_of(r), r["answered"], "o", **fill)
            if r["state_floats"] is not None:
                ax.annotate(f"{r['state_floats']:,}", (x_of(r), r["score"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points", color=f"C{c}")
    xs = sorted({x_of(r) for r in rows})
    pairs = sorted({r["pairs"] for r in rows if "pairs" in r})
    every = xs if key == "pairs" else [pairs[-1] if pairs else 0] * len(xs)
    bx.plot(xs, every, color="grey", ls="--", lw=0.8, label="every stored pair")
    if shortcut:
        bx.plot(xs, [shortcut[f"{key}{x}"] for x in xs], color="grey", ls=":", lw=0.8,
                label="the shortcut: the commonest stored value, not its key's")
    for a in (ax, bx):
        a.set_xscale("symlog" if key == "filler" else "log", base=2)
        a.set_xlabel("stored pairs" if key == "pairs" else "longest filler run (8 pairs)")
        a.grid(alpha=0.3)
    if key == "pairs":
        bx.set_yscale("log", base=2)
    ax.set_ylabel("score: 1 - KL(model) / KL(uniform)")
    bx.set_ylabel("stored pairs answered (accuracy x pairs)")
    ax.set_title(f"recall, {'capacity' if key == 'pairs' else 'distance'}: the score (numbers: floats carried "
                 f"from step to step;\nhollow: training loss not flat at the end)", fontsize=9)
    bx.set_title("the pairs held: accuracy on stored keys x the pairs", fontsize=9)
    bx.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return _save(fig, path)


def plot_layers(rows, path, max_hops):
    """The depth experiment (depth.verdicts rows): the KL of the answers of h hops against h, one line per model
    (the transformer by depth, the others by name), the direct models in one panel (a run of 4x the steps,
    depth.X4_RULE, dotted) beside the chains of thought running free; then the share hallucinated, direct
    solid and chain of thought dashed. Each point: the mean over the row's seeds."""
    plt = _plt()
    fig, (ax, cx, bx) = plt.subplots(1, 3, figsize=(15, 4.4))
    models_ = list(dict.fromkeys((r["family"], r["layers"]) for r in rows))
    for i, (family, layers) in enumerate(models_):
        for r in (r for r in rows if (r["family"], r["layers"]) == (family, layers)):
            hs = [h for h in range(1, max_hops + 1) if all(h in g for g in r["groups"])]
            mean = lambda f: [sum(f(g[h]) for g in r["groups"]) / len(r["groups"]) for h in hs]
            mode = ", 4x the steps" if r.get("x4") else ""
            style = dict(color=f"C{i}", marker="o", ms=3, label=row_label(family, layers) + mode)
            (cx if r["cot"] else ax).plot(hs, mean(lambda g: g["kl_bits"]), ls=":" if r.get("x4") else "-", **style)
            if not r.get("x4"):
                bx.plot(hs, mean(lambda g: g["hallucinated"]), ls="--" if r["cot"] else "-", **style)
    first = rows[0]["groups"][0]
    hs = sorted(first)
    for a in (ax, cx):
        a.plot(hs, [first[h]["prior_kl_bits"] for h in hs], color="grey", ls="--", lw=0.8, label="uniform guess")
        a.set_yscale("log")
        a.set_ylabel("KL(exact posterior || model), bits")
    ax.sharey(cx)
    ax.set_title("direct: the answer in one pass (4x the steps dotted)", fontsize=9)
    cx.set_title("chain of thought, running free: its own hops, then the answer", fontsize=9)
    bx.set_ylabel("share hallucinated")
    bx.set_title("confident and wrong: over 1/2 on an answer the posterior\ngives under 5% "
                 "(direct solid, chain of thought dashed)", fontsize=9)
    for a in (ax, cx, bx):
        a.set_xlabel("hops h")
        a.set_xticks(range(1, max_hops + 1))
        a.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=6, ncol=2)
    cx.legend(frameon=False, fontsize=6, ncol=2)
    fig.tight_layout()
    return _save(fig, path)


def plot_free(ex, task, path):
    """A chain of thought running free on a few held-out sequences (cot.examples): the distribution of the
    answer it ends on, against the exact posterior of that answer given the context alone."""
    plt = _plt()
    k, K = ex["posterior"].shape
    fig, axes = plt.subplots(1, k, figsize=(3.2 * k, 3.0), squeeze=False)
    x = np.arange(K)
    for i, ax in enumerate(axes[0]):
        ax.bar(x - 0.2, ex["posterior"][i], 0.4, color="black", label="exact posterior")
        ax.bar(x + 0.2, ex["p_free"][i], 0.4, color="C1", label="model, running free")
        ax.set_title(f"sequence {ex['rows'][i]}, h = {ex['hops'][i]} (dropped {ex['dropped'][i]:.1g})", fontsize=8)
        ax.set_xlabel("final answer")
        ax.set_ylim(0, 1.05)
    axes[0][0].set_ylabel("probability")
    axes[0][0].legend(frameon=False, fontsize=7)
    fig.suptitle(f"{task}: the answer a chain of thought ends on when it writes its own hops", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)



def plot_depth_sweep(summary, path):
    """The depth sweep (primitives/depth_sweep.py's summary): for each depth (a colour) and seed (a marker), the
    chosen direct run's two readings by h: the lookup's accuracy on the answers whose posterior is one-hot
    (chance 1 / symbols dashed), and the elimination's KL on the uncertain ones, beside the lookup-only
    predictor's KL there (no elimination, dotted) and one elimination step a hop's (dash-dot); each seed its
    own line, so a seed that learned nothing shows."""
    plt = _plt()
    g, readings = summary["grid"], summary["readings"]
    seeds, markers = list(g["seeds"]), "osD^v<>"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    floors = {}
    for i, L in enumerate(g["depths"]):
        for k, seed in enumerate(seeds):
            name = summary["chosen"].get(f"L{L}-direct-s{seed}")
            r = readings.get(name) if name else None
            if not r:
                continue
            hs = sorted(int(h) for h in r)
            acc = [r[str(h)]["lookup"]["accuracy"] for h in hs]
            kl = [r[str(h)]["elimination"]["kl_bits"] for h in hs]
            style = dict(color=f"C{i}", marker=markers[k % len(markers)], ms=5, lw=1.2, alpha=0.85)
            a1.plot(hs, [np.nan if v is None else v for v in acc], label=row_label("transformer", L).split(", ")[1]
                    if k == 0 else None, **style)
            a2.plot(hs, [np.nan if v is None else v for v in kl], **style)
            for h in hs:
                for pred in ("follow_shown", "eliminate_each_hop"):
                    v = r[str(h)][pred]["elimination_kl_bits"]
                    if v is not None:
                        floors.setdefault((pred, h), []).append(v)
    V = summary.get("n_symbols")
    if V:
        a1.axhline(1 / V, color="gray", ls="--", lw=1, label=f"chance (1/{V})")
    a1.axhline(summary.get("does", 0.9), color="black", ls=":", lw=1, label="does h hops")
    for pred, ls, label in (("follow_shown", ":", "lookup only"), ("eliminate_each_hop", "-.", "one elimination a hop")):
        hs = sorted(h for p, h in floors if p == pred)
        if hs:
            a2.plot(hs, [np.mean(floors[pred, h]) for h in hs], color="black", ls=ls, lw=1.5, label=label)
    for ax in (a1, a2):
        ax.set_xticks(range(1, g["max_hops"] + 1))
        ax.set_xlabel("hops h")
        ax.grid(alpha=0.3)
    a1.set_ylim(-0.02, 1.02)
    a1.set_ylabel("lookup: accuracy on one-hot answers")
    a2.set_ylabel("elimination: KL on uncertain answers (bits)")
    a1.set_title("the lookup (a marker per seed)", fontsize=10)
    a2.set_title("the elimination, beside two predictors", fontsize=10)
    for ax in (a1, a2):                                  # below each panel, off the data
        ax.legend(frameon=False, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    fig.tight_layout()
    return _save(fig, path)
