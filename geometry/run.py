"""The geometry of one trained checkpoint: runs the probes of manifold.py (and geometry/formation.py's probe 6 over
the run's snapshots), writes every number with its definition into runs/<name>/geometry.json and the figures
runs/<name>/geometry_<name>_*.png, and prints a summary.

    python -m geometry.run runs/<name>/checkpoint.npz [--figures DIR] [--n-seqs 500] [--seed 0]

`analyze(checkpoint_path, fig_dir, n_seqs, seed) -> dict` does the same from Python (train.py calls it
after training).
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("geometry/run.py: run it as python -m geometry.run, from the repository's folder")

import dataclasses
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see bayesattn.py: BLAS threads fight Numba's

import argparse  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import bayesattn as ba  # noqa: E402
from geometry import formation  # noqa: E402
from layers import softmax  # noqa: E402
import models  # noqa: E402
from geometry import plots_geometry  # noqa: E402
from harness import runs  # noqa: E402
from tunnels import tasks  # noqa: E402
from harness.checkpoints import load_checkpoint, plain, versions, write_json  # noqa: E402
from geometry import state_clusters  # noqa: E402
from geometry import verdicts  # noqa: E402
from tunnels import windtunnels as wt  # noqa: E402
from manifold import (AUTHORS_DEFINITIONS, AUTHORS_FRAME_RANK, AUTHORS_NUMBERS, DEFINITIONS,  # noqa: E402
                      RANDOM_INIT_SEEDS, ablations, attention_probe, authors_key_frame, frame_matrix, key_frame_probe,
                      calibration, logit_lens, manifold_probe, probe_batch, probe_settings, query_swap, snapshot_state,
                      supervised_columns, uniform_kl_bits,
                      task_of, token_names)

PROBE_DEFINITIONS = {**DEFINITIONS, "state_clusters": state_clusters.__doc__}   # every probe's, into geometry.json
SNAPSHOT_SEQS = 200         # probe sequences per training snapshot (probe 6) ...
SNAPSHOT_FLOATS = 2e7       # ... fewer if one snapshot's attention (n L NH T T floats) would exceed this


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


# the task hooks each probe reads (manifold.PROBE_HOOKS); a task without them has those probes skipped, in one
# line each, and the others run
NEEDS = {"key_frame": ("hypothesis_tokens", "token_groups"), "sharpening": ("evidence_masks", "swap_query"),
         "manifold": ("row_split", "graded_rows"), "frame_precision": ("hypothesis_tokens", "evidence_masks"),
         "attention_maps": ("token_names",)}


def lacking(task):
    """-> {probe: 'the task provides no <hooks>'} for each probe of NEEDS the task cannot feed."""
    mod = tasks.task(task)
    missing = {probe: [h for h in hooks if not hasattr(mod, h)] for probe, hooks in NEEDS.items()}
    return {probe: f"the task provides no {', '.join(m)}" for probe, m in missing.items() if m}


def _analyze(checkpoint_path, fig_dir, n_seqs, seed):
    params, cfg, meta, _ = load_checkpoint(checkpoint_path)
    attention = getattr(models.module(meta["model"]), "PROBES", False)
    task = task_of(cfg, meta)
    skip = lacking(task)
    run_dir = os.path.dirname(os.path.abspath(checkpoint_path))
    run = os.path.basename(run_dir)
    title = f"{run} ({task})"
    fig_dir = fig_dir or run_dir
    os.makedirs(fig_dir, exist_ok=True)
    fig = lambda name: os.path.join(fig_dir, f"geometry_{run}_{name}.png")

    settings = probe_settings(task, cfg, meta)
    batch = probe_batch(task, cfg, n_seqs, seed, settings)
    supervised_columns(batch)                           # one line if the rows have their answers at other positions
    if not attention:
        return _state_probes(checkpoint_path, params, cfg, meta, task, settings, batch, n_seqs, seed, title, fig,
                             run_dir, skip)
    logits, cache = ba.forward(params, batch["tokens"], cfg)
    ran = lambda probe: probe not in skip

    frame, matrices = key_frame_probe(params, cfg, task, batch["tokens"]) if ran("key_frame") else (None, None)
    att = None
    if ran("sharpening"):
        att = attention_probe(cache, batch, task, cfg)
        att["query_swap"] = query_swap(params, cfg, batch, task, seed=seed)
    man, xy = (manifold_probe(cache, batch, task, proba=softmax(logits.astype(np.float64)))
               if ran("manifold") else (None, None))
    lens = logit_lens(params, cache, batch)
    abl = ablations(params, cfg, batch, clean=cache)
    T = batch["tokens"].shape[1]
    n_snap = min(SNAPSHOT_SEQS, max(16, int(SNAPSHOT_FLOATS / (cfg.n_layers * cfg.n_heads * T * T))))
    small = wt.rows_of(batch, slice(0, n_snap))
    fp = None
    if ran("frame_precision"):
        snaps = [(step, load_checkpoint(path)[0]) for step, path in formation.snapshot_paths(run_dir)]
        init = models.init_params(meta["model"], cfg, meta.get("seed", 0))      # the run's own initialisation
        fp = formation.frame_precision(snaps, lambda p: snapshot_state(p, cfg, small, task),
                                       lambda p: frame_matrix(p, task, cfg), AUTHORS_FRAME_RANK, cfg.d_model, init=init,
                                       other_inits=[models.init_params(meta["model"], cfg, s) for s in RANDOM_INIT_SEEDS])
    if fp is not None:
        fp["probe_sequences"] = n_snap
        fp["init_seed"] = meta.get("seed", 0)

    authors = {"key_frame": authors_key_frame(params, cfg, task) if ran("key_frame") else None,
               "manifold": man["authors"] if man else None,
               "frame_head": abl["authors_frame_head"], "frame_precision": fp["authors"] if fp else None}

    if fp is not None:
        fp["authors_number"] = AUTHORS_NUMBERS["frame_precision"]
    out = plain({
        "checkpoint": os.path.abspath(checkpoint_path), "task": task, "settings": settings,
        "step": meta.get("step"), "train_seed": meta.get("seed"), "config": dataclasses.asdict(cfg), "probe_sequences": n_seqs, "probe_seed": seed,
        "versions": versions(),
        "authors": authors, "authors_definitions": AUTHORS_DEFINITIONS, "authors_numbers": AUTHORS_NUMBERS,
        "definitions": PROBE_DEFINITIONS,
        "key_frame": frame, "attention": att, "manifold": man, "logit_lens": lens, "ablations": abl,
        "frame_precision": fp, "clusters": cluster_probe_of(meta["model"], cfg, batch, task, cache, seed),
        **({"skipped_probes": skip} if skip else {})})
    claims = [c for c in verdicts.CLAIMS if c not in skip and (c != "state_clusters" or out["clusters"] is not None)]
    out["verdicts"] = v = plain(verdicts.judge(out, claims=claims))
    # every figure draws the controls that decide its claim and prints the verdict of the same probes
    rules = dict(sharp=verdicts.SHARP, sink_share=verdicts.SINK_SHARE, aligned=verdicts.SWAP_ALIGNED,
                 independent=verdicts.SWAP_INDEPENDENT, noise_z=verdicts.NOISE_Z)
    out["figures"] = []
    if frame is not None:
        out["figures"].append(plots_geometry.plot_key_frame(frame, matrices, cfg, title, fig("key_frame"), authors["key_frame"],
                                                   v["key_frame"], verdicts.NOISE_Z))
    if ran("attention_maps"):
        out["figures"].append(plots_geometry.plot_attention_maps(cache, batch["tokens"][0],
                                                        token_names(task, cfg, batch["tokens"][0]), cfg, title,
                                                        fig("attention_maps")))
    if att is not None:
        out["figures"].append(plots_geometry.plot_attention_entropy(att, task, cfg, title, fig("attention_entropy"),
                                                           v["sharpening"], **rules))
    if man is not None:
        out["figures"].append(plots_geometry.plot_manifold(man, xy, title, fig("value_manifold"), v["manifold"]))
    out["figures"] += [plots_geometry.plot_logit_lens(lens, title, fig("logit_lens")),
                       plots_geometry.plot_ablations(abl, title, fig("ablations"), v["frame_head"], verdicts.ESSENTIAL,
                                            verdicts.IN_DISTRIBUTION, verdicts.NOISE_Z)]
    if fp is not None:
        out["figures"].append(plots_geometry.plot_frame_precision(fp, title, fig("frame_precision"), v["frame_precision"]))
    write_json(os.path.join(run_dir, "geometry.json"), out)
    return out


def cluster_probe_of(name, cfg, batch, task, cache, seed):
    """Probe 7 where the task names hidden states (its CLUSTERS; else None): the final residual stream at the
    answer rows, of the trained model (cache) and of randomly initialised models of the same family
    (RANDOM_INIT_SEEDS), clustered against the exact posterior (state_clusters.cluster_probe)."""
    if getattr(tasks.task(task), "CLUSTERS", None) is None:
        return None
    cols = supervised_columns(batch)
    rows = lambda a: a[:, cols].reshape(-1, a.shape[-1])                   # (n, T, C) -> (N, C)
    init = [rows(models.forward(name, models.init_params(name, cfg, s), batch["tokens"], cfg)[1]["resid"][-1])
            for s in RANDOM_INIT_SEEDS]
    seq = np.repeat(np.arange(len(batch["tokens"])), len(cols))
    return state_clusters.cluster_probe(rows(cache["resid"][-1]), rows(batch["posterior"]), seq, init, seed,
                                        batch["tokens"][:, cols].reshape(-1))


STATE_PROBES = ("the final state's PCA with its controls, the cross-validated entropy readout, the state clusters "
                "(where the task names hidden states), the logit lens")
SKIPPED = "the key frame, attention entropy and query swap, head ablations, frame-precision (they read attention)"


def _state_probes(checkpoint_path, params, cfg, meta, task, settings, batch, n_seqs, seed, title, fig, run_dir,
                  skip=None):
    """The probes that read no attention, for a family without it: the manifold probe on the streams its
    forward keeps (cache["resid"], the final state cache["xf"]), the logit lens where it has the shared
    head (lnf.g, lnf.b, unembed.w, unembed.b), the calibration gate, the manifold verdict."""
    name = meta["model"]
    logits, cache = models.forward(name, params, batch["tokens"], cfg)
    if not isinstance(cache, dict) or "resid" not in cache or "xf" not in cache:
        raise ValueError(f"the probes read the streams cache['resid'] and cache['xf'], which --model {name}'s "
                         f"forward does not keep")
    proba = softmax(logits.astype(np.float64))
    cols = supervised_columns(batch)
    calibration_now = calibration(proba[:, cols], batch["posterior"][:, cols])
    skip = skip or {}
    man, xy = manifold_probe(cache, batch, task, proba=proba) if "manifold" not in skip else (None, None)
    lens = logit_lens(params, cache, batch) if {"lnf.g", "lnf.b", "unembed.w", "unembed.b"} <= set(params) else None
    out = plain({
        "checkpoint": os.path.abspath(checkpoint_path), "task": task, "settings": settings, "model": name,
        "step": meta.get("step"), "train_seed": meta.get("seed"), "config": dataclasses.asdict(cfg),
        "probe_sequences": n_seqs, "probe_seed": seed, "versions": versions(),
        "definitions": PROBE_DEFINITIONS,
        "probes": STATE_PROBES if lens is not None else STATE_PROBES.replace(", the logit lens", ""),
        "skipped": SKIPPED + ("" if lens is not None else "; the logit lens (no shared head)"),
        "calibration": {**calibration_now, "uniform_kl_bits": uniform_kl_bits(batch)},
        "authors": {"manifold": man["authors"] if man else None}, "manifold": man, "logit_lens": lens,
        "clusters": cluster_probe_of(name, cfg, batch, task, cache, seed),
        **({"skipped_probes": {p: r for p, r in skip.items() if p == "manifold"}} if "manifold" in skip else {})})
    out["verdicts"] = v = plain(verdicts.judge(out, claims=[c for c in ("manifold", "state_clusters") if c not in skip]))
    out["figures"] = [plots_geometry.plot_manifold(man, xy, title, fig("value_manifold"), v["manifold"])] if man else []
    if lens is not None:
        out["figures"].append(plots_geometry.plot_logit_lens(lens, title, fig("logit_lens")))
    write_json(os.path.join(run_dir, "geometry.json"), out)
    return out


def probe_memory_bytes(cfg, meta, n_seqs):
    """About how many bytes the probes of n_seqs sequences hold at their peak: the probe set, and the model's
    forward over all of it at once with its cache (as a training step's, models.step_memory_bytes) twice
    (the clean run and an ablated one). An estimate to refuse what cannot fit, not a measurement."""
    task = task_of(cfg, meta)
    s = probe_settings(task, cfg, meta)
    T = tasks.sizes(task, s)["max_len"]
    return 6 * tasks.held_out_bytes(task, s, n_seqs) + 2 * models.step_memory_bytes(meta["model"], cfg, n_seqs, T)


def summary(g):
    """A few lines for the terminal: the verdicts, the probes a task could not feed, the authors' definitions,
    then ours (a family without attention: what was skipped, the manifold and the lens)."""
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"
    lines = ["verdicts (each claim's word and deciding number; the full verdict, its rule and controls: "
             "geometry.json, under verdicts):",
             *("  " + v for v in verdicts.lines(g["verdicts"]))]
    lines += [f"skipped: {probe}: {why}" for probe, why in g.get("skipped_probes", {}).items()]
    if "skipped" in g:
        lines.append(f"probes run on --model {g['model']}: {g['probes']}; skipped: {g['skipped']}")
        if g["manifold"] is not None:
            m = g["manifold"]["residual_final"]
            lines.append(f"final state: PC1 {m['pc1_variance']:.3f} of the variance, Spearman(PC1, H) "
                         f"{fmt(m['spearman_pc1_entropy'])}, within a position {fmt(m['mean_within_position_spearman'])}")
        if g["logit_lens"] is not None:
            lines.append("logit-lens KL by layer (bits): " + ", ".join(f"{k:.3g}" for k in g["logit_lens"]["kl_bits"]))
        return "\n".join(lines)
    a = g["authors"]
    lines.append("the authors' definitions:")
    k = a["key_frame"]
    if k is not None:
        lines.append(f"  layer-0 keys of the {k['hypotheses']} hypotheses, mean|cos| per head "
                     f"{', '.join(f'{c:.3f}' for c in k['per_head'])} (random init {k['random_init_mean']:.3f}; "
                     f"head size {k['head_size']}, Welch RMS bound {k['welch_rms_lower_bound']:.3f})")
    m = a["manifold"]
    if m is not None:
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
    for recipe, groups in (g["key_frame"] or {}).items():
        for name, s in groups.items():
            lines.append(f"layer-0 frame {recipe:>10} {name:>13}: mean|cos| trained {s['mean_abs_offdiag']:.3f}, "
                         f"random init {s['random_init_mean_abs_offdiag']:.3f}, "
                         f"Gaussian {s['gaussian_mean_abs_offdiag']:.3f}")
    if g["attention"] is not None:
        lines.append("attention entropy by layer (bits): " + ", ".join(
            f"{l['entropy_bits_mean']:.2f}" for l in g["attention"]["layers"])
                     + f" (uniform {g['attention']['uniform_entropy_bits']:.2f})")
    for key in ("attn_out_last", "residual_final") if g["manifold"] is not None else ():
        m = g["manifold"][key]
        lines.append(f"manifold {key}: PC1 {m['pc1_variance']:.3f}, PC1+2 {m['pc12_variance']:.3f}, "
                     f"Spearman(PC1, H) {fmt(m['spearman_pc1_entropy'])}")
    lines.append("logit-lens KL by layer (bits): " + ", ".join(f"{k:.3g}" for k in g["logit_lens"]["kl_bits"]))
    a = g["ablations"]
    worst = next(h for h in a["heads"] if f"L{h['layer']}H{h['head']}" == a["hypothesis_frame_head"]["name"])
    lines.append(f"ablation: the head whose removal costs most, {a['hypothesis_frame_head']['name']}: KL "
                 f"{a['baseline']['kl_bits']:.3g} -> {worst['kl_bits']:.3g} bits, entropy MAE "
                 f"{a['baseline']['entropy_mae_bits']:.3g} -> {worst['entropy_mae_bits']:.3g} bits")
    fp = g["frame_precision"]
    if fp:
        at = lambda s: "never" if s is None else f"step {s}"
        lines.append(f"frame settles at {at(fp['frame_settle_step'])} (per layer "
                     f"{', '.join(at(s) for s in fp['frame_settle_step_per_layer'])}), precision at "
                     f"{at(fp['precision_settle_step'])}; 90% progress: frame {at(fp['frame_90pct_step'])}, "
                     f"precision {at(fp['precision_90pct_step'])}")
    return "\n".join(lines)


def print_combined(paths, fail):
    """geometry/run.py --combine: each claim's verdict over the seeds (verdicts.combine), each seed's beside it."""
    import json
    gs = []
    for path in paths:
        try:
            with open(path) as f:
                gs.append(json.load(f))
        except OSError as e:
            fail(f"{path!r} cannot be read ({e.strerror})")
        except ValueError:
            fail(f"{path!r} is not a geometry.json")
    try:
        combined = verdicts.combine(gs)
    except (ValueError, KeyError) as e:
        fail(str(e) if isinstance(e, ValueError) else f"a geometry.json lacks {e}: re-run python -m geometry.run on its checkpoint")
    print(f"{len(gs)} runs of one command ({gs[0]['task']}, step {gs[0]['step']}), seeds "
          f"{', '.join(str(g['train_seed']) for g in gs)}; the rules: python -m geometry.run --definitions; "
          f"each seed's full verdict and margin: its geometry.json, under verdicts")
    for claim, c in combined.items():
        print(f"{claim}: {c['outcome']} ({c['agreement']})")
        for seed, v in c["per_seed"].items():
            print(f"  {seed}: {v['label']}")
    return combined


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m geometry.run", description=__doc__.split("\n\n")[0])

    def fail(msg):                                   # one clear line, exit code 2, no usage dump
        print(f"python -m geometry.run: error: {msg}", file=sys.stderr)
        sys.exit(2)
    p.error = fail
    p.add_argument("checkpoint", nargs="?", help="runs/<name>/checkpoint.npz")
    p.add_argument("--definitions", action="store_true", help="print every probe's and control's definition, "
                   "and the verdicts' rules, then exit")
    p.add_argument("--combine", nargs="+", metavar="GEOMETRY_JSON", help="combine the geometry.json of two or "
                   "more runs of the same command with different seeds into one verdict per claim, then exit")
    p.add_argument("--figures", help="where the geometry_*.png figures go (default: the run directory)")
    p.add_argument("--n-seqs", type=int, default=500, help="held-out probe sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe sequences")
    args = p.parse_args(argv)
    if args.definitions:
        for title, d in (("ours", PROBE_DEFINITIONS), ("the authors'", AUTHORS_DEFINITIONS),
                         ("verdict rules", verdicts.RULES)):
            print(f"# {title}")
            for k, v in d.items():
                print(f"{k}: {v}")
        return None
    if args.combine:
        return print_combined(args.combine, fail)
    if args.checkpoint is None:
        p.error("give a checkpoint (runs/<name>/checkpoint.npz), or --definitions")
    if args.n_seqs < 2:
        p.error(f"--n-seqs {args.n_seqs}: must be at least 2")
    if not 0 <= args.seed < 2 ** 63:
        p.error(f"--seed {args.seed}: must be an integer in 0..2^63-1")
    for flag, path in (("checkpoint", args.checkpoint), ("--figures", args.figures)):
        if path is not None and runs.name_problem(path):
            p.error(f"{flag} {path!r}: {runs.name_problem(path)}")
    try:                                             # the checkpoint, read and judged before anything is written
        params, cfg, meta, _ = load_checkpoint(args.checkpoint)
        need, have = probe_memory_bytes(cfg, meta, args.n_seqs), models.available_memory_bytes()
    except ValueError as e:
        p.error(str(e))
    if need > 0.8 * have:
        p.error(f"--n-seqs {args.n_seqs}: the probes would need about {need / 2**30:.1f} GiB, and "
                f"{have / 2**30:.1f} GiB are available")
    run_dir = os.path.dirname(os.path.abspath(args.checkpoint))
    problem = args.figures and runs.writable(args.figures)
    if problem:
        p.error(f"--figures {args.figures!r} {problem}")
    try:                                             # its run directory: one owner at a time
        runs.take(run_dir, f"checkpoint {args.checkpoint!r}: its run directory", "python -m geometry.run " + " ".join(
            sys.argv[1:] if argv is None else argv), instead="")
    except runs.Refused as e:
        p.error(str(e))
    import kernels
    try:
        with kernels.enabled():                      # the fast path (its numbers: docs/USAGE.md says how close)
            g = analyze(args.checkpoint, args.figures, args.n_seqs, args.seed)
    except ValueError as e:
        p.error(str(e))
    except OSError as e:
        p.error(f"{e.filename or args.figures!r} cannot be written ({e.strerror})")
    finally:
        runs.release(run_dir)
    print(summary(g))
    print(f"wrote {os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), 'geometry.json')} "
          f"and {len(g['figures'])} figures in {os.path.dirname(g['figures'][0])}/")
    return g


if __name__ == "__main__":
    main()
