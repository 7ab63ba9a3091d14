"""The geometry of one trained checkpoint: runs the probes of manifold.py (and formation.py's probe 6 over
the run's snapshots), writes every number with its definition into runs/<name>/geometry.json and the figures
runs/<name>/geometry_<name>_*.png, and prints a summary.

    python geometry.py runs/<name>/checkpoint.npz [--figures DIR] [--n-seqs 500] [--seed 0]

`analyze(checkpoint_path, fig_dir, n_seqs, seed) -> dict` does the same from Python (train.py calls it
after training).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see bayesattn.py: BLAS threads fight Numba's
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import sys  # noqa: E402

import bayesattn as ba  # noqa: E402
import formation  # noqa: E402
import plots  # noqa: E402
from checkpoints import load_checkpoint, plain, write_json  # noqa: E402
from manifold import (AUTHORS_FRAME_RANK, GAUSSIAN_DRAWS, RANDOM_INIT_SEEDS, ablations, attention_probe,  # noqa: E402
                      authors_key_frame, frame_basis, key_frame_probe, logit_lens, manifold_probe, probe_batch,
                      snapshot_state, task_of, token_names)

SNAPSHOT_SEQS = 200         # probe sequences per training snapshot (probe 6) ...
SNAPSHOT_FLOATS = 2e7       # ... fewer if one snapshot's attention (n L NH T T floats) would exceed this


DEFINITIONS = {
    "key_frame": "layer 0, per head: key_tok = LN1(wte[tok] + p) @ W_K[:, head] + b_K[head], p = the mean "
                 "positional term over the positions where tokens of that type occur ('ln'); 'ln_centred': the "
                 "same minus its mean over the type's tokens (softmax ignores a shift shared by all keys); "
                 "'authors': the authors' LN1(wte[tok]) @ W_K[:, head] (no position, no bias); 'value_ln': the value vectors "
                 "LN1(wte[tok] + p) @ W_V[:, head] + b_V[head]. Statistic: mean |cosine| over off-diagonal "
                 "token pairs, mean over heads. Baselines: the same recipe on init_params of the same config "
                 f"(seeds {RANDOM_INIT_SEEDS}), and iid N(0, I_hs) vectors ({GAUSSIAN_DRAWS} draws). HMM "
                 "probability tokens: those occurring in the probe headers. Welch bound: the least possible RMS "
                 "off-diagonal cosine of n unit vectors in R^hs.",
    "attention_entropy": "entropy (bits) of attention rows at supervised positions, mean over sequences and rows; "
                         "uniform = log2(i + 1) at query position i (0-based); reduction = 1 - H / H_uniform.",
    "consistent_mass": "bijection: at a key, the attention on the value positions right after earlier occurrences "
                       "of the same key (they hold the answer) if the key repeats, else on every earlier value "
                       "position (each holds an eliminated value); rows without such positions (the first key) "
                       "are excluded. HMM: at observation o_t, the mass on the five header positions of "
                       "E[s, o_t], s = 0..4 (the likelihood column of the current observation); "
                       "observation_mass: on positions 52..t; transition_mass: on the T entries.",
    "manifold": "PCA (centred, SVD) of the rows at supervised positions; Spearman of PC1 with the exact posterior "
                "entropy; controls: Spearman with the position, mean within-position Spearman where H varies.",
    "logit_lens": "final LayerNorm + unembedding applied to the residual stream before block 0 (embedding) and "
                  "after every block; KL(posterior || lens) in bits.",
    "ablations": "a head's output (before W_o, so b_o stays) set to zero via forward's head_mask; the hypothesis-"
                 "frame head is the single head whose removal raises the KL most.",
    "frame_precision": f"snapshots runs/<name>/snapshots/step_*.npz on the first {SNAPSHOT_SEQS} probe sequences "
                       "(fewer for long sequences: see probe_sequences). Frame change = mean TV distance between "
                       "attention rows (all query rows) of consecutive snapshots, per layer, divided by the steps "
                       "between them. A series settles at the first snapshot step after which its per-step change "
                       f"stays below {formation.SETTLE_FRACTION:g} x its maximum; frame series = mean over layers, precision "
                       "series = |change of log10 entropy MAE| per step. Second rule (90pct): progress from the "
                       "first to the last snapshot (frame: 1 - TV to the last attention / the same at the first "
                       "snapshot; precision: fraction of the log10 entropy-MAE drop) stays >= 0.9 from then on.",
}


AUTHORS_DEFINITIONS = {
    "key_frame": "layer 0, each head separately: key_h = LN1(wte[h]) @ W_K[:, head] for the hypothesis tokens h "
                 "(bijection: the value tokens; sawtooth: all V tokens; HMM: the 5 observation tokens), no "
                 "positional term and no bias b_K; statistic: mean |off-diagonal cosine| per head; beside it the "
                 f"same at random initialisation (init_params, seeds {RANDOM_INIT_SEEDS}) and the Welch bound on "
                 "the RMS cosine (orthogonality needs head size >= number of hypotheses).",
    "manifold": "the final hidden state after the final LayerNorm at the positions that predict a value (the "
                "sawtooth's query left out); centred PCA; Pearson r of PC1..PC5 with H_Bayes (best |r|); R^2 of "
                "the least-squares fit of H_Bayes on the top 5 PC scores (in sample); PC1's share of the "
                "variance. Controls (ours): R^2 of H_Bayes on the position alone, and the mean within-position "
                "R^2 of the same fit over positions where H_Bayes varies.",
    "frame_head": "the single head (any layer) whose zero-ablation raises the paper's entropy MAE most, and the "
                  "ratio of its increase to the second-largest.",
    "frame_precision": "frame = span of LN1(wte[h]) over the hypotheses (the authors' 'embedding' frame) of each "
                       f"snapshot, its top {AUTHORS_FRAME_RANK} directions; overlap with the last snapshot's "
                       "whole frame W = ||U^T W||_F^2 / min(rank U, rank W); ratio to chance = overlap / "
                       "the expected overlap of a uniformly random subspace of the same rank (rank W / C). The "
                       "authors compare their Jacobian-lens subspaces (not computed here) with the final frame "
                       "the same way. Plateau: the first snapshot from which the ratio stays >= 90% of its last "
                       "value; calibration gain after it: entropy MAE at the plateau / at the last snapshot.",
}
AUTHORS_NUMBERS = {   # what the authors report (shared/PAPERS.md), for the side-by-side table
    "key_frame": "their checkpoint (format a, head size 32): 0.43-0.49 trained, 0.13-0.17 at random init",
    "manifold": "PC1 above 80% of the variance expected; strong |r| with H_Bayes",
    "frame_head": "removing layer 0 or a single hypothesis-frame head collapses calibration",
    "frame_precision": "2.3x chance by step 300, a plateau near 6x by step 2,500, while calibration improves "
                       "about 40x (0.03 -> 0.0008 bits)",
}


def analyze(checkpoint_path, fig_dir=None, n_seqs=500, seed=0, threads=1):
    """All six probes of one checkpoint: numbers into geometry.json beside the checkpoint, figures into
    fig_dir (default: that run directory); returns the same dict. threads: Numba threads while it runs
    (restored after)."""
    import numba
    prev_threads = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, prev_threads)))
    try:
        return _analyze(checkpoint_path, fig_dir, n_seqs, seed)
    finally:
        numba.set_num_threads(prev_threads)


def _analyze(checkpoint_path, fig_dir, n_seqs, seed):
    params, cfg, meta, _ = load_checkpoint(checkpoint_path)
    if not isinstance(cfg, ba.Config):
        raise ValueError(f"{checkpoint_path!r} is not a transformer checkpoint")
    task = task_of(cfg, meta)
    run_dir = os.path.dirname(os.path.abspath(checkpoint_path))
    run = os.path.basename(run_dir)
    title = f"{run} ({task})"
    fig_dir = fig_dir or run_dir
    os.makedirs(fig_dir, exist_ok=True)
    fig = lambda name: os.path.join(fig_dir, f"geometry_{run}_{name}.png")

    batch = probe_batch(task, cfg, n_seqs, seed)
    _, cache = ba.forward(params, batch["tokens"], cfg)

    frame, matrices = key_frame_probe(params, cfg, task, batch["tokens"])
    att = attention_probe(cache, batch, task, cfg)
    man, xy = manifold_probe(cache, batch)
    lens = logit_lens(params, cache, batch)
    abl = ablations(params, cfg, batch)
    T = batch["tokens"].shape[1]
    n_snap = min(SNAPSHOT_SEQS, max(16, int(SNAPSHOT_FLOATS / (cfg.n_layers * cfg.n_heads * T * T))))
    small = {k: v[:n_snap] for k, v in batch.items()}
    snaps = [(step, load_checkpoint(path)[0]) for step, path in formation.snapshot_paths(run_dir)]
    fp = formation.frame_precision(snaps, lambda p: snapshot_state(p, cfg, small, task),
                                   lambda p, rank: frame_basis(p, task, cfg, rank), AUTHORS_FRAME_RANK, cfg.d_model)
    if fp is not None:
        fp["probe_sequences"] = n_snap

    figures = [plots.plot_key_frame(frame, matrices, cfg, title, fig("key_frame")),
               plots.plot_attention_maps(cache, batch["tokens"][0], token_names(task, cfg, batch["tokens"][0]),
                                         cfg, title, fig("attention_maps")),
               plots.plot_attention_entropy(att, task, cfg, title, fig("attention_entropy")),
               plots.plot_manifold(man, xy, title, fig("value_manifold")),
               plots.plot_logit_lens(lens, title, fig("logit_lens")),
               plots.plot_ablations(abl, title, fig("ablations"))]
    if fp is not None:
        fp["authors_number"] = AUTHORS_NUMBERS["frame_precision"]
        figures.append(plots.plot_frame_precision(fp, title, fig("frame_precision")))

    authors = {"key_frame": authors_key_frame(params, cfg, task), "manifold": man["authors"],
               "frame_head": abl["authors_frame_head"], "frame_precision": fp["authors"] if fp else None}
    out = plain({
        "checkpoint": os.path.abspath(checkpoint_path), "task": task,
        "step": meta.get("step"), "config": cfg.to_dict(), "probe_sequences": n_seqs, "probe_seed": seed,
        "authors": authors, "authors_definitions": AUTHORS_DEFINITIONS, "authors_numbers": AUTHORS_NUMBERS,
        "definitions": DEFINITIONS,
        "key_frame": frame, "attention": att, "manifold": man, "logit_lens": lens, "ablations": abl,
        "frame_precision": fp, "figures": figures})
    write_json(os.path.join(run_dir, "geometry.json"), out)
    return out


def summary(g):
    """A few lines for the terminal: the authors' definitions first, then ours."""
    a, lines = g["authors"], ["the authors' definitions:"]
    k = a["key_frame"]
    lines.append(f"  layer-0 keys of the {k['hypotheses']} hypotheses, mean|cos| per head "
                 f"{', '.join(f'{c:.3f}' for c in k['per_head'])} (random init {k['random_init_mean']:.3f}; "
                 f"head size {k['head_size']}, Welch RMS bound {k['welch_rms_lower_bound']:.3f})")
    m = a["manifold"]
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    lines.append(f"  final hidden state: PC1 {m['pc1_variance']:.3f} of the variance, best |Pearson| "
                 f"{fmt(m['best_abs_pearson'])} (PC{m['best_pc']}), R^2 top-5 PCs {fmt(m['r2_top5'])}; position "
                 f"alone R^2 {fmt(m['r2_position_only'])}, within-position R^2 {fmt(m['mean_within_position_r2_top5'])}")
    h = a["frame_head"]
    lines.append(f"  frame head by entropy MAE: {h['name']} (+{h['delta_entropy_mae_bits']:.3g} bits), "
                 f"{fmt(h['ratio_to_second'])}x the second ({h['second']})")
    f = a["frame_precision"]
    if f:
        lines.append(f"  frame overlap with its final version: {f['ratio_nearest_300']:.2f}x chance at step "
                     f"{f['step_nearest_300']}, plateau at step {f['frame_plateau_step']} "
                     f"({fmt(f['ratio_at_plateau'])}x, ceiling {f['ratio_ceiling']:.2f}x); calibration improves "
                     f"{fmt(f['calibration_gain_after_plateau'])}x after it")
    lines.append("ours:")
    for recipe, groups in g["key_frame"].items():
        for name, s in groups.items():
            lines.append(f"layer-0 frame {recipe:>10} {name:>13}: mean|cos| trained {s['mean_abs_offdiag']:.3f}, "
                         f"random init {s['random_init_mean_abs_offdiag']:.3f}, "
                         f"Gaussian {s['gaussian_mean_abs_offdiag']:.3f}")
    lines.append("attention entropy by layer (bits): " + ", ".join(
        f"{l['entropy_bits_mean']:.2f}" for l in g["attention"]["layers"])
                 + f" (uniform {g['attention']['uniform_entropy_bits']:.2f})")
    for key in ("attn_out_last", "residual_final"):
        m = g["manifold"][key]
        lines.append(f"manifold {key}: PC1 {m['pc1_variance']:.3f}, PC1+2 {m['pc12_variance']:.3f}, "
                     f"Spearman(PC1, H) {m['spearman_pc1_entropy']}")
    lines.append("logit-lens KL by layer (bits): " + ", ".join(f"{k:.3g}" for k in g["logit_lens"]["kl_bits"]))
    a = g["ablations"]
    worst = next(h for h in a["heads"] if f"L{h['layer']}H{h['head']}" == a["hypothesis_frame_head"]["name"])
    lines.append(f"ablation: hypothesis-frame head {a['hypothesis_frame_head']['name']}: KL "
                 f"{a['baseline']['kl_bits']:.3g} -> {worst['kl_bits']:.3g} bits, entropy MAE "
                 f"{a['baseline']['entropy_mae_bits']:.3g} -> {worst['entropy_mae_bits']:.3g} bits")
    fp = g["frame_precision"]
    if fp:
        lines.append(f"frame settles at step {fp['frame_settle_step']} (per layer {fp['frame_settle_step_per_layer']}), "
                     f"precision at step {fp['precision_settle_step']}; 90% progress: frame {fp['frame_90pct_step']}, "
                     f"precision {fp['precision_90pct_step']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    def fail(msg):                                   # one clear line, exit code 2, no usage dump
        print(f"geometry.py: error: {msg}", file=sys.stderr)
        sys.exit(2)
    p.error = fail
    p.add_argument("checkpoint", help="runs/<name>/checkpoint.npz")
    p.add_argument("--figures", help="where the geometry_*.png figures go (default: the run directory)")
    p.add_argument("--n-seqs", type=int, default=500, help="held-out probe sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe sequences")
    args = p.parse_args(argv)
    if args.n_seqs < 2:
        p.error(f"--n-seqs {args.n_seqs}: must be at least 2")
    import kernels
    kernels.enable()                                 # the fast path (the same numbers as the NumPy one)
    try:
        g = analyze(args.checkpoint, args.figures, args.n_seqs, args.seed)
    except ValueError as e:
        p.error(str(e))
    except OSError as e:
        p.error(f"{e.filename or args.figures!r} cannot be written ({e.strerror})")
    print(summary(g))
    print(f"wrote {os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), 'geometry.json')} "
          f"and {len(g['figures'])} figures in {os.path.dirname(g['figures'][0])}/")
    return g


if __name__ == "__main__":
    main()
