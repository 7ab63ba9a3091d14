"""chainsteps: does a chain of thought move in short, confident steps? The geometric claim, measured.

    python -m primitives.chainsteps [--runs runs/depth] [--layers 4] [--seeds 0 1] [--seqs 500]
    python -m primitives.chainsteps --sweep runs/depth-sweep [--layers L] [--seeds ...]

With --sweep, the depth sweep's (primitives/depth_sweep.py) chosen direct and chain-of-thought runs of each
depth and seed, at each depth the sweep calls short (default) or --layers; the h the direct run fails are
those past its lookup reach (depth_rules.lookup_reach), not the older score's.

The papers say chain of thought extends a network's depth by letting it move in short, confident steps
along its entropy-ordered representation, instead of one long jump through low-confidence territory,
where it hallucinates. In the hops wind tunnel (tunnels/hops.py) both are on hand at one depth: a direct model,
which must carry the answer h hops in one pass, and a chain-of-thought model, which carries it one hop a
token. This module measures the final-layer representation (the final LayerNorm's output, what the
unembedding reads) of both, on the same held-out sequences (one generator: the direct and the chain
format of a sequence share its pairs, x and h).

DEFINITIONS, fixed here before the first run they judge (tests exercise every branch of the rule).
Amended after a referee's read and a development check on two probe runs (runs/hops/probe-default-*),
before any primitives/depth.py run: the first version measured the two models against scales taken over different
kinds of rows, compared the chain with random initialisations (which measure the position embedding),
shuffled chains partly left true, and took its margin from no measured noise.
  X            the final-layer representation at an answer row
  scale S      the median distance ||X_b - X_b'|| between the answers of the same index in neighbouring
               held-out sequences (b' = b + 1) where both are confident and predict different symbols: how
               far apart two confident answers lie (the same kind of rows in both models: a confident
               state is a class's; an unsure one sits nearer the centre)
  step         chain of thought: ||X at hop j - X at hop j - 1||, j = 2 .. h, teacher-forced (the true hops
               written); its ratio is the median step / S
  jump         direct: ||X at the answer - X at the answer of the same sequence with its query asking one
               hop (only the hop-count token changed)||, over the h >= 2 the direct run fails (its score below
               matrix.GOOD in metrics.json): how far the answer's state lies from where one hop puts it; its
               ratio is the median jump / S (also per h)
  controls     baseline: ||X at hop j of sequence b - X at hop j - 1 of sequence b + 1||, two states at
               neighbouring positions of unrelated sequences (what a step would be with no relation between
               its ends); shuffled: the same model with every written hop taken from another sequence's
               chain (the next with as many hops), its steps j >= 3 (both ends read a shuffled hop) against
               the true chain's j >= 3: whether a step follows the chain or any two lookups; random
               initialisations of the chain's config (RANDOM_INITS): reported, not judged (at
               initialisation a step mostly measures the position embedding)
  margin       of each comparison: max(MARGIN, 2 x the sd of the difference over BOOTSTRAP resamples of
               the sequences, paired: both sides from the same resampled sequences)
  readout      the entropy readout of the geometry probes: a ridge readout of the exact posterior's entropy
               from X, cross-validated by sequence, each fold's fit also applied to the one-hop twins of its
               sequences; reported as its held-out R^2 and as the median change of the readout per step
               (chain) or per jump (direct), in bits
  confident    the model puts more than evaluation.CONFIDENT of its mass on one answer; its share is taken
               over the answers whose exact posterior is one-hot (where confidence is right): the chain's
               hops 2 .. h, the direct model's answers of the h it fails
The rule, per seed (a direct run and a chain-of-thought run of the same depth and seed, on the same
held-out sequences; the seeds replicate the training, not the sequences):
  short        the step ratio is below the jump ratio and the baseline's, and (where chains of three hops
               or more exist) the steps j >= 3 below the shuffled chains', each by its margin
  confident    the chain's confident share is at least CONFIDENT_SHARE and the direct model's is below it by
               CONFIDENT_GAP
  supported    short and confident in every seed (two seeds at least); not supported: in every seed, not
               short or not confident; undecided: the seeds disagree, fewer than two seeds, or the direct
               model fails no h at this depth (it has not run out of layers)
What it cannot show: a path through the layers (it reads the last layer only; a jump compares two
queries' final states, not one pass's movement), and anything about depths other than the one judged.
At the last layer a state mostly says which answer it predicts (in the probe runs, two confident chain
states predicting the same symbol lay 0.2 S apart, different symbols 1.0 S), so a confident chain's
steps, each a change of answer, are expected near S.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("primitives/chainsteps.py: run it as python -m primitives.chainsteps, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's


import numpy as np  # noqa: E402

from tunnels import hops  # noqa: E402
from primitives import matrix  # noqa: E402
from geometry import measures as ms  # noqa: E402
import models  # noqa: E402
from tunnels import windtunnels as wt  # noqa: E402
from harness import drivers  # noqa: E402
from harness.checkpoints import load_checkpoint, write_json  # noqa: E402
from evaluation import CONFIDENT  # noqa: E402
from layers import softmax  # noqa: E402
from manifold import probe_batch, probe_settings  # noqa: E402

MARGIN = 0.05            # a ratio must clear its comparison by at least this, and by 2 bootstrap sd
BOOTSTRAP = 200          # resamples of the sequences for a difference's sd
CONFIDENT_SHARE = 0.9    # a chain is confident when this share of its one-hot hops is
CONFIDENT_GAP = 0.2      # and the direct model's share at its one-hot answers of the h it fails is lower by this
RANDOM_INITS = (101, 102, 103)
LAYERS = 4               # the depth judged: the hops preset's (its direct model ran out at h = 2 in the probe)
SUPPORTED, NOT_SUPPORTED, UNDECIDED = "supported", "not supported", "undecided"


def final_states(family, params, cfg, tokens, batch=256):
    """-> (X (n, T, C) the final LayerNorm's output, q (n, T, K) the predictive distribution), float64."""
    xs, qs = [], []
    for i in range(0, len(tokens), batch):
        logits, cache = models.forward(family, params, tokens[i:i + batch], cfg)
        xs.append(cache["xf"].astype(np.float64))
        qs.append(softmax(logits.astype(np.float64)))
    return np.concatenate(xs), np.concatenate(qs)


def scale(X, q, rows):
    """X (n, T, C), q (n, T, K), rows (n, T) bool: each row's answers. -> the median distance between the
    answer of index i of sequence b and that of sequence b + 1 where both are confident (max q > CONFIDENT)
    and predict different symbols; None where no pair is."""
    out = []
    for b in range(len(X) - 1):
        a, a2 = np.flatnonzero(rows[b]), np.flatnonzero(rows[b + 1])
        k = min(len(a), len(a2))
        a, a2 = a[:k], a2[:k]
        keep = ((q[b, a].max(-1) > CONFIDENT) & (q[b + 1, a2].max(-1) > CONFIDENT)
                & (q[b, a].argmax(-1) != q[b + 1, a2].argmax(-1)))
        out.append(np.linalg.norm(X[b, a[keep]] - X[b + 1, a2[keep]], axis=-1))
    d = np.concatenate(out) if out else np.zeros(0)
    return float(np.median(d)) if len(d) else None


def chain_steps(X, first, h, j_min=2):
    """X (n, T, C), first (n,) where hop 1 is predicted, h (n,) -> (steps (S,), row of each (S,), hop j of each
    (S,)): ||X[first + j - 1] - X[first + j - 2]|| for j = j_min .. h."""
    b = np.concatenate([np.full(max(k - j_min + 1, 0), i) for i, k in enumerate(h)]).astype(np.int64)
    j = np.concatenate([np.arange(j_min, k + 1) for k in h]).astype(np.int64)
    t = first[b] + j - 1
    return np.linalg.norm(X[b, t] - X[b, t - 1], axis=-1), b, j


def baseline_pairs(X, first, h):
    """The steps' baseline: ||X[b, first + j - 1] - X[b + 1, first + j - 2]|| for j = 2 .. h where sequence b + 1
    has hop j - 1 (two neighbouring answer positions of unrelated sequences). -> (distances, row b of each)."""
    _, b, j = chain_steps(X, first, h)
    keep = (b + 1 < len(X)) & (h[np.minimum(b + 1, len(X) - 1)] >= j - 1)
    b, j = b[keep], j[keep]
    return np.linalg.norm(X[b, first[b] + j - 1] - X[b + 1, first[b + 1] + j - 2], axis=-1), b


def donors(h):
    """-> (n,) for each row the next row (cyclically) with at least as many hops (itself if none is)."""
    n = len(h)
    out = np.arange(n)
    for b in range(n):
        for k in range(1, n):
            if h[(b + k) % n] >= h[b]:
                out[b] = (b + k) % n
                break
    return out


def shuffled(tokens, first, h):
    """The chains' written hops (positions first + 1 .. first + h - 1), every one taken from a donor's chain."""
    out, d = tokens.copy(), donors(h)
    for b in range(len(tokens)):
        k = h[b] - 1
        out[b, first[b] + 1:first[b] + 1 + k] = tokens[d[b], first[d[b]] + 1:first[d[b]] + 1 + k]
    return out


def one_hop_query(tokens, s):
    """The direct tokens with every query's hop count set to one (the hop token sits at 2V + 1)."""
    out = tokens.copy()
    out[:, 2 * s["n_symbols"] + 1] = hops.tokens_of(s["n_symbols"], s["max_hops"])[0]
    return out


def median_ratio(d, S):
    return None if S is None or not len(d) else float(np.median(d)) / S


def diff_sd(a, sa, b, sb, n, B=BOOTSTRAP, seed=0):
    """The sd of median(a) - median(b) over B resamples of the n sequences (a's items belong to sequences sa,
    b's to sb; both sides from the same resample), each side already divided by its scale."""
    rng = np.random.default_rng(seed)
    ia = [np.flatnonzero(sa == i) for i in range(n)]
    ib = [np.flatnonzero(sb == i) for i in range(n)]
    out = []
    for _ in range(B):
        pick = rng.integers(0, n, n)
        xa, xb = np.concatenate([ia[i] for i in pick]), np.concatenate([ib[i] for i in pick])
        if len(xa) and len(xb):
            out.append(np.median(a[xa]) - np.median(b[xb]))
    return float(np.std(out, ddof=1)) if len(out) > 1 else 0.0


def readout(X, rows, post, twins=None):
    """The entropy readout at the answer rows, cross-validated by sequence: X (n, T, C), rows (n, T) bool, post
    (n, T, K); twins (n, C) or None: other states of each sequence, predicted by its fold's fit. -> (predictions
    (n, T), NaN off the answers; of the twins (n,) or None; held-out R^2 or None)."""
    b, t = np.nonzero(rows)
    H = wt.entropy_bits(post[b, t])
    out = np.full(rows.shape, np.nan)
    r = ms.cv_predictions(X[b, t], H, b, extra=twins, extra_groups=None if twins is None else np.arange(len(X)))
    if r is None:
        return out, None if twins is None else np.full(len(X), np.nan), None
    out[b, t] = r[0]
    return out, None if twins is None else r[2], 1.0 - float(((H - r[0]) ** 2).sum()) / float(((H - H.mean()) ** 2).sum())


def confident_share(q, post):
    """q, post (N, K): over the rows whose posterior is one-hot, the share where q puts more than CONFIDENT on
    one answer (None: no such row)."""
    one = post.max(-1) >= 1.0 - 1e-9
    return float((q[one].max(-1) > CONFIDENT).mean()) if one.any() else None


def measure(direct_path, cot_path, fails, n=500, seed=0):
    """One seed's statistics (DEFINITIONS) from a direct and a chain-of-thought checkpoint of the hops task;
    fails: the h >= 2 the direct run fails (direct_fails)."""
    (pd, cd, md, _), (pc, cc, mc, _) = load_checkpoint(direct_path), load_checkpoint(cot_path)
    if md.get("task") != "hops" or mc.get("task") != "hops":
        raise ValueError(f"chainsteps needs a direct and a chain-of-thought run of the hops task: {direct_path!r} "
                         f"and {cot_path!r} are not")
    sd, sc = probe_settings("hops", cd, md), probe_settings("hops", cc, mc)
    if sd["cot"] or not sc["cot"]:
        raise ValueError(f"chainsteps needs a direct and a chain-of-thought run of the hops task: {direct_path!r} "
                         f"and {cot_path!r} are not")
    differ = [k for k in ("n_symbols", "hidden", "max_hops") if sd[k] != sc[k]]
    if differ:
        raise ValueError(f"the two runs differ in {differ[0]} ({sd[differ[0]]} and {sc[differ[0]]}): chainsteps "
                         f"compares them on the same sequences")
    bd, bc = probe_batch("hops", cd, n, seed, sd), probe_batch("hops", cc, n, seed, sc)
    first, h = hops.chain_layout(bc, sc)
    if h.max() < 2:
        raise ValueError("no held-out chain has two hops: nothing to measure (more --seqs, or a run of max_hops >= 2)")
    # -- the chain of thought
    Xc, qc = final_states(mc["model"], pc, cc, bc["tokens"])
    rows_c = bc["mask"] > 0
    Sc = scale(Xc, qc, rows_c)
    steps, b, j = chain_steps(Xc, first, h)
    base, bb = baseline_pairs(Xc, first, h)
    ec, _, r2c = readout(Xc, rows_c, bc["posterior"])
    t = first[b] + j - 1
    Sc_ = Sc or np.nan
    cot = dict(scale=Sc, step_ratio=median_ratio(steps, Sc), steps=len(steps), baseline_ratio=median_ratio(base, Sc),
               readout_r2=r2c, readout_step_bits=float(np.median(np.abs(ec[b, t] - ec[b, t - 1]))),
               confident=confident_share(qc[b, t], bc["posterior"][b, t]),
               margin_baseline=max(MARGIN, 2 * diff_sd(steps / Sc_, b, base / Sc_, bb, n)))
    if h.max() >= 3:                                                    # steps with both ends shuffled
        Xs, qs = final_states(mc["model"], pc, cc, shuffled(bc["tokens"], first, h))
        Ss = scale(Xs, qs, rows_c) or np.nan
        s3, b3, _ = chain_steps(Xc, first, h, 3)
        x3, _, _ = chain_steps(Xs, first, h, 3)
        cot.update(step_ratio_j3=median_ratio(s3, Sc), shuffled_ratio_j3=median_ratio(x3, Ss), steps_j3=len(s3),
                   margin_shuffled=max(MARGIN, 2 * diff_sd(s3 / Sc_, b3, x3 / Ss, b3, n)))
    inits = []
    for s_ in RANDOM_INITS:
        Xr, _ = final_states(mc["model"], models.init_params(mc["model"], cc, s_), cc, bc["tokens"])
        inits.append(float(np.median(chain_steps(Xr, first, h)[0]) / np.median(np.linalg.norm(
            Xr[:-1, first[0]] - Xr[1:, first[0]], axis=-1))))
    cot["random_init_step_ratios"] = inits     # reported only: a step over the distance of two sequences' hop 1
    # -- the direct model at the h it fails, and the one-hop twins of those answers
    Xd, qd = final_states(md["model"], pd, cd, bd["tokens"])
    X1, _ = final_states(md["model"], pd, cd, one_hop_query(bd["tokens"], sd))
    a = (bd["mask"] > 0).argmax(1)                                    # (n,) the answer position
    rows_d = bd["mask"] > 0
    Sd = scale(Xd, qd, rows_d)
    far = np.flatnonzero(np.isin(h, list(fails)) & (h >= 2))
    ed, e1, r2d = readout(Xd, rows_d, bd["posterior"], X1[np.arange(n), a])
    jumps = np.linalg.norm(Xd[far, a[far]] - X1[far, a[far]], axis=-1)
    Sd_ = Sd or np.nan
    direct = dict(scale=Sd, fails=sorted(int(k) for k in fails), jumps=len(far), jump_ratio=median_ratio(jumps, Sd),
                  jump_ratio_by_h={int(k): median_ratio(jumps[h[far] == k], Sd) for k in sorted(fails)},
                  readout_r2=r2d, readout_jump_bits=float(np.median(np.abs(ed[far, a[far]] - e1[far]))) if len(far) else None,
                  confident=confident_share(qd[far, a[far]], bd["posterior"][far, a[far]]) if len(far) else None)
    if len(far):
        cot["margin_jump"] = max(MARGIN, 2 * diff_sd(steps / Sc_, b, jumps / Sd_, far, n))
    return dict(direct=direct, cot=cot, sequences=n)


def judge_seed(stats):
    """-> (short, confident) for one seed's statistics."""
    c, d = stats["cot"], stats["direct"]
    below = lambda x, y, m: None not in (x, y) and x < y - m
    short = (below(c["step_ratio"], d["jump_ratio"], c.get("margin_jump", MARGIN))
             and below(c["step_ratio"], c["baseline_ratio"], c["margin_baseline"])
             and ("shuffled_ratio_j3" not in c or below(c["step_ratio_j3"], c["shuffled_ratio_j3"], c["margin_shuffled"])))
    confident = (c["confident"] is not None and d["confident"] is not None and c["confident"] >= CONFIDENT_SHARE
                 and d["confident"] <= c["confident"] - CONFIDENT_GAP)
    return short, confident


def verdict(per_seed, runs_out=True):
    """per_seed: [stats] one per seed; runs_out: the direct model fails some h at this depth in every seed.
    -> (verdict, why)."""
    if not runs_out:
        return UNDECIDED, "the direct model fails no h at this depth: it has not run out of layers"
    if len(per_seed) < 2:
        return UNDECIDED, f"{len(per_seed)} seed(s): the rule asks for two at least"
    judged = [judge_seed(s) for s in per_seed]
    both = [s and c for s, c in judged]
    if all(both):
        return SUPPORTED, "short and confident in every seed"
    if not any(both):
        return NOT_SUPPORTED, "; ".join(f"seed {i}: {'short' if s else 'not short'}, "
                                        f"{'confident' if c else 'not confident'}" for i, (s, c) in enumerate(judged))
    return UNDECIDED, "the seeds disagree"


def direct_fails(metrics):
    """From a direct run's metrics.json: the h >= 2 whose score is below matrix.GOOD (depth.group_score)."""
    from primitives import depth
    g = depth.answer_groups(metrics, False)
    return [h for h in sorted(g) if h >= 2 and depth.group_score(g[h]) < matrix.GOOD]


def sweep_runs(sweep_dir, layers, seeds):
    """The depth sweep's chosen runs at `layers` for each seed: [(seed, direct run dir, cot run dir, fails)],
    fails the h >= 2 past the direct run's lookup reach; a seed the sweep chose no pair for is left out (and
    said). ValueError in one line if the directory holds no depth-sweep.json."""
    from primitives import depth_rules, depth_sweep
    summary = drivers.read_json(os.path.join(sweep_dir, "depth-sweep.json"), "depth sweep's summary (run python -m "
                                f"primitives.depth_sweep --out {sweep_dir} first)", keys=("grid", "chosen"))
    out = []
    for s in seeds:
        names = [summary["chosen"].get(f"L{layers}-{mode}-s{s}") for mode in ("direct", "cot")]
        if None in names:
            print(f"seed {s}: the sweep chose no {'direct' if names[0] is None else 'chain-of-thought'} run at "
                  f"{layers} layers; left out")
            continue
        m, problem = drivers.read_metrics(os.path.join(sweep_dir, names[0]))
        if m is None:
            print(f"seed {s}: {problem or os.path.join(sweep_dir, names[0], 'metrics.json') + ' is missing'}; left out")
            continue
        reach = depth_rules.lookup_reach(depth_sweep.accuracies(m, False))
        fails = [h for h in range(2, summary["grid"]["max_hops"] + 1) if h > reach]
        out.append((s, *(os.path.join(sweep_dir, n) for n in names), fails))
    return out, summary


def shown(x, f=".3f"):
    return "n/a" if x is None else format(x, f)


def memory_bytes(n, T, V, C):
    """About what measuring n held-out sequences of length T holds at once (V symbols, width C): the batch's
    posteriors and one-hots in float64, a few passes' final states and distributions (an estimate to refuse
    what cannot fit before anything loads, not a measurement)."""
    return n * T * (32 * V + 32 * C)


def main(argv_=None):
    p = drivers.parser("python -m primitives.chainsteps", __doc__.split("\n\n")[0])
    p.add_argument("--runs", default=os.path.join("runs", "depth"), help="primitives/depth.py's cells (default runs/depth)")
    p.add_argument("--sweep", default=None, help="the depth sweep's directory instead: its chosen runs")
    p.add_argument("--layers", type=int, default=None, help=f"the depth judged (default {LAYERS}; with --sweep, each "
                   "depth the sweep calls short)")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 (with --sweep, the sweep's)")
    p.add_argument("--seqs", type=int, default=500, help="held-out sequences (default 500)")
    a = p.parse_args(argv_)
    drivers.check(p, drivers.count(a.seqs, "--seqs", 4), drivers.count(a.layers, "--layers", 1), drivers.seeds(a.seeds),
                  drivers.existing_directory(a.sweep, "--sweep") if a.sweep else drivers.existing_directory(a.runs, "--runs"))
    try:
        if a.sweep is None:
            judge(a.runs, a.layers or LAYERS, a.seeds or [0, 1], a.seqs)
            return
        _, summary = sweep_runs(a.sweep, 0, [])
        from primitives import depth_rules
        g = summary["grid"]
        for L in [a.layers] if a.layers else depth_rules.short_depths(g["depths"], g["max_hops"]):
            judge(a.sweep, L, a.seeds or list(g["seeds"]), a.seqs, sweep=True)
    except (drivers.Refused, ValueError) as e:
        p.error(str(e))


def judge(runs, layers, seeds, seqs, sweep=False):
    """Measure each seed's pair of runs at `layers` (primitives/depth.py's cells in runs, or the depth sweep's
    chosen ones), print them and the verdict, write runs/chainsteps-L<layers>.json."""
    per_seed, out, runs_out = [], {}, []
    pairs = sweep_runs(runs, layers, seeds)[0] if sweep else []
    for s in seeds:
        if sweep:
            found = [x for x in pairs if x[0] == s]
            if not found:
                continue
            _, d_dir, c_dir, fails = found[0]
        else:
            d_dir, c_dir = (os.path.join(runs, f"hops-transformer-L{layers}-{m}-s{s}") for m in ("direct", "cot"))
        paths = [os.path.join(d_dir, "checkpoint.npz"), os.path.join(c_dir, "checkpoint.npz")]
        missing = [q for q in paths + [os.path.join(d_dir, "metrics.json")] if not os.path.exists(q)]
        if missing:
            print(f"seed {s}: {missing[0]} is missing (run python -m primitives.{'depth_sweep' if sweep else 'depth'} "
                  f"first); left out")
            continue
        if not sweep:
            m, problem = drivers.read_metrics(d_dir)
            if m is None:
                print(f"seed {s}: {problem}; left out")
                continue
            fails = direct_fails(m)
        cfg = load_checkpoint(paths[1])[1]
        problem = drivers.memory(memory_bytes(seqs, cfg.max_len, cfg.n_classes, cfg.d_model), f"--seqs {seqs}")
        if problem:
            raise drivers.Refused(problem)
        runs_out.append(bool(fails))
        if not fails:
            print(f"seed {s}: the direct run fails no h at {layers} layers")
            continue
        stats = measure(*paths, fails, n=seqs)
        per_seed.append(stats)
        out[f"seed {s}"] = stats
        c, d = stats["cot"], stats["direct"]
        print(f"seed {s}: chain step {shown(c['step_ratio'])} S (baseline {shown(c['baseline_ratio'])}; j >= 3: "
              f"{shown(c.get('step_ratio_j3'))}, shuffled {shown(c.get('shuffled_ratio_j3'))}; random init "
              f"{', '.join(shown(r) for r in c['random_init_step_ratios'])}); direct jump {shown(d['jump_ratio'])} S "
              f"at h = {d['fails']}; confident {shown(c['confident'])} chain, {shown(d['confident'])} direct; readout "
              f"R^2 {shown(c['readout_r2'])} / {shown(d['readout_r2'])}, change per step {shown(c['readout_step_bits'])} "
              f"bits, per jump {shown(d['readout_jump_bits'])}")
    v, why = verdict(per_seed, runs_out=all(runs_out) if runs_out else True)
    print(f"claim: short, confident steps ({layers} layers): {v} ({why})")
    out.update(verdict=v, why=why, layers=layers, margin_floor=MARGIN, bootstrap=BOOTSTRAP,
               confident_share=CONFIDENT_SHARE, confident_gap=CONFIDENT_GAP)
    write_json(os.path.join(runs, f"chainsteps-L{layers}.json"), out)


if __name__ == "__main__":
    main()
