"""plots_dynamics: Paper II's figures on the sticky chain (dynamics/experiments.py): SGD against the EM-like schedule, the
two timescales, the deep variant; harness/plots.py has the training runs' figures."""

import math

import numpy as np

from harness.plots import _plt, _save

LN2 = math.log(2.0)


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
    return _save(fig, path, dpi=100)


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
    return _save(fig, path, dpi=90)


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
