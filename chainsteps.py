"""chainsteps: does a chain of thought move in short, confident steps? The geometric claim, measured.

    python chainsteps.py [--runs runs/depth] [--layers 4] [--seeds 0 1] [--seqs 500]

The papers say chain of thought extends a network's depth by letting it move in short, confident steps
along its entropy-ordered representation, instead of one long jump through low-confidence territory,
where it hallucinates. In the hops wind tunnel (hops.py) both are on hand at one depth: a direct model,
which must carry the answer h hops in one pass, and a chain-of-thought model, which carries it one hop a
token. This module measures the final-layer representation (the final LayerNorm's output, what the
unembedding reads) of both, on the same held-out sequences (one generator: the direct and the chain
format of a sequence share its pairs, x and h).

DEFINITIONS, fixed here before the first run they judge (tests exercise every branch of the rule):
  X            the final-layer representation at an answer row
  scale S      the median distance ||X_b - X_b'|| between the answer rows of the same answer index in two
               neighbouring held-out sequences (b' = b + 1): a random jump in the model's own answer space
  step         chain of thought, h >= 2: ||X at hop j - X at hop j - 1||, j = 2 .. h, teacher-forced (the
               true hops written); its ratio is the median step / S
  jump         direct, h >= 2: ||X at the answer - X at the answer of the same sequence with its query
               asking one hop (only the hop-count token changed)||: how far the one pass moves to carry the
               answer h - 1 hops further; its ratio is the median jump / S
  readout      the entropy readout of the geometry probes: a ridge readout of the exact posterior's entropy
               from X, cross-validated by sequence (measures.cv_predictions); reported as its held-out R^2 and
               as the median change of the readout per step (chain) or per jump (direct), in bits
  confident    the model puts more than evaluation.CONFIDENT of its mass on one answer; its share is taken
               over the answers whose exact posterior is one-hot (where confidence is right): the chain's
               hops 2 .. h, the direct model's answers of h >= 2
  controls     the step ratio of the same chain-of-thought model on shuffled chains (each row's written hops
               taken from the next row's chain: consecutive positions that are not consecutive hops), and
               on random initialisations of its config (RANDOM_INITS, the true chains)
  margin       max(MARGIN, 2 x the sd of the random initialisations' step ratios): the noise a ratio must
               clear
The rule, per seed (a direct run and a chain-of-thought run of the same depth and seed):
  short        the step ratio is below the direct jump ratio, the shuffled chains' and every random
               initialisation's, each by the margin
  confident    the chain's confident share is at least CONFIDENT_SHARE and the direct model's is below it by
               CONFIDENT_GAP
  supported    short and confident in every seed (two seeds at least); not supported: in every seed, not
               short or not confident; undecided: the seeds disagree, fewer than two seeds, or the direct
               model answers every h >= 2 (score >= matrix.GOOD at each: it has not run out of layers, so
               there is no jump it fails to make at this depth)
What it cannot show: that the representation moves "along" the entropy axis rather than across it (the
readout's change per step is reported, not judged), nor anything about depths other than the one judged.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

import hops  # noqa: E402
import matrix  # noqa: E402
import measures as ms  # noqa: E402
import models  # noqa: E402
import windtunnels as wt  # noqa: E402
from checkpoints import load_checkpoint  # noqa: E402
from evaluation import CONFIDENT  # noqa: E402
from layers import softmax  # noqa: E402
from manifold import probe_batch, probe_settings  # noqa: E402

MARGIN = 0.05            # a ratio must clear its comparison by at least this (and 2 sd of the random inits)
CONFIDENT_SHARE = 0.9    # a chain is confident when this share of its one-hot hops is
CONFIDENT_GAP = 0.2      # and the direct model's share at its one-hot answers of h >= 2 is lower by this
RANDOM_INITS = (101, 102, 103)
LAYERS = 4               # the depth judged: the hops preset's (its direct model runs out at h = 2)
SUPPORTED, NOT_SUPPORTED, UNDECIDED = "supported", "not supported", "undecided"


def final_states(family, params, cfg, tokens, batch=256):
    """-> (X (n, T, C) the final LayerNorm's output, q (n, T, K) the predictive distribution), float64."""
    xs, qs = [], []
    for i in range(0, len(tokens), batch):
        logits, cache = models.forward(family, params, tokens[i:i + batch], cfg)
        xs.append(cache["xf"].astype(np.float64))
        qs.append(softmax.numpy(logits.astype(np.float64)))
    return np.concatenate(xs), np.concatenate(qs)


def scale(X, rows):
    """X (n, T, C), rows (n, T) bool: each row's answers. -> the median distance between the answer of index i
    of sequence b and that of sequence b + 1 (where both have one)."""
    out = []
    for b in range(len(X) - 1):
        a, a2 = np.flatnonzero(rows[b]), np.flatnonzero(rows[b + 1])
        k = min(len(a), len(a2))
        out.append(np.linalg.norm(X[b, a[:k]] - X[b + 1, a2[:k]], axis=-1))
    return float(np.median(np.concatenate(out)))


def chain_steps(X, first, h):
    """X (n, T, C), first (n,) where hop 1 is predicted, h (n,) -> (steps (S,), row of each (S,), hop j of each
    (S,)): ||X[first + j - 1] - X[first + j - 2]|| for j = 2 .. h."""
    b = np.concatenate([np.full(k - 1, i) for i, k in enumerate(h)]).astype(np.int64)
    j = np.concatenate([np.arange(2, k + 1) for k in h]).astype(np.int64)
    t = first[b] + j - 1
    return np.linalg.norm(X[b, t] - X[b, t - 1], axis=-1), b, j


def readout(X, rows, post):
    """The entropy readout at the answer rows: X (n, T, C), rows (n, T) bool, post (n, T, K) -> (predictions
    (n, T), NaN off the answers; held-out R^2 or None)."""
    b, t = np.nonzero(rows)
    H = wt.entropy_bits(post[b, t])
    r = ms.cv_predictions(X[b, t], H, b)
    out = np.full(rows.shape, np.nan)
    if r is None:
        return out, None
    out[b, t] = r[0]
    return out, 1.0 - float(((H - r[0]) ** 2).sum()) / float(((H - H.mean()) ** 2).sum())


def confident_share(q, post):
    """q, post (N, K): over the rows whose posterior is one-hot, the share where q puts more than CONFIDENT on
    one answer (None: no such row)."""
    one = post.max(-1) >= 1.0 - 1e-9
    return float((q[one].max(-1) > CONFIDENT).mean()) if one.any() else None


def shuffled(tokens, first, h):
    """The chains' written hops (positions first + 1 .. first + h - 1) taken from the next row's chain."""
    out = tokens.copy()
    nxt = np.roll(np.arange(len(tokens)), -1)
    for b in range(len(tokens)):
        k = min(h[b], h[nxt[b]]) - 1
        out[b, first[b] + 1:first[b] + 1 + k] = tokens[nxt[b], first[nxt[b]] + 1:first[nxt[b]] + 1 + k]
    return out


def one_hop_query(tokens, s):
    """The direct tokens with every query's hop count set to one (the hop token sits at 2V + 1)."""
    out = tokens.copy()
    out[:, 2 * s["n_symbols"] + 1] = hops.tokens_of(s["n_symbols"], s["max_hops"])[0]
    return out


def measure(direct_path, cot_path, n=500, seed=0):
    """One seed's statistics (DEFINITIONS) from a direct and a chain-of-thought checkpoint of the hops task."""
    (pd, cd, md, _), (pc, cc, mc, _) = load_checkpoint(direct_path), load_checkpoint(cot_path)
    sd, sc = probe_settings("hops", cd, md), probe_settings("hops", cc, mc)
    if md.get("task") != "hops" or mc.get("task") != "hops" or sd["cot"] or not sc["cot"]:
        raise ValueError(f"chainsteps needs a direct and a chain-of-thought run of the hops task: {direct_path!r} "
                         f"and {cot_path!r} are not")
    bd, bc = probe_batch("hops", cd, n, seed, sd), probe_batch("hops", cc, n, seed, sc)
    first, h = hops.chain_layout(bc, sc)
    hd = h.copy()                                                      # the direct rows' h: the same sequences
    # -- the chain of thought
    Xc, qc = final_states(mc["model"], pc, cc, bc["tokens"])
    rows_c = bc["mask"] > 0
    steps, b, j = chain_steps(Xc, first, h)
    Sc = scale(Xc, rows_c)
    ec, r2c = readout(Xc, rows_c, bc["posterior"])
    t = first[b] + j - 1
    cot = dict(scale=Sc, step_ratio=float(np.median(steps)) / Sc, steps=len(steps), readout_r2=r2c,
               readout_step_bits=float(np.median(np.abs(ec[b, t] - ec[b, t - 1]))),
               confident=confident_share(qc[b, t], bc["posterior"][b, t]))
    Xs, _ = final_states(mc["model"], pc, cc, shuffled(bc["tokens"], first, h))
    cot["shuffled_step_ratio"] = float(np.median(chain_steps(Xs, first, h)[0])) / scale(Xs, rows_c)
    inits = []
    for s_ in RANDOM_INITS:
        Xr, _ = final_states(mc["model"], models.init_params(mc["model"], cc, s_), cc, bc["tokens"])
        inits.append(float(np.median(chain_steps(Xr, first, h)[0])) / scale(Xr, rows_c))
    cot["random_init_step_ratios"] = inits
    # -- the direct model, its answers and their one-hop twins
    Xd, qd = final_states(md["model"], pd, cd, bd["tokens"])
    X1, _ = final_states(md["model"], pd, cd, one_hop_query(bd["tokens"], sd))
    a = (bd["mask"] > 0).argmax(1)                                    # (n,) the answer position
    rows_d = bd["mask"] > 0
    Sd = scale(Xd, rows_d)
    far = np.flatnonzero(hd >= 2)
    ed, r2d = readout(Xd, rows_d, bd["posterior"])
    e1 = np.full(len(a), np.nan)                                       # the readout (fit on the direct rows) of
    e1[far] = readout_apply(Xd, rows_d, bd["posterior"], X1[far, a[far]])   # the one-hop twin
    jumps = np.linalg.norm(Xd[far, a[far]] - X1[far, a[far]], axis=-1)
    direct = dict(scale=Sd, jump_ratio=float(np.median(jumps)) / Sd, jumps=len(far), readout_r2=r2d,
                  readout_jump_bits=float(np.median(np.abs(ed[far, a[far]] - e1[far]))),
                  confident=confident_share(qd[far, a[far]], bd["posterior"][far, a[far]]))
    return dict(direct=direct, cot=cot, sequences=n)


def readout_apply(X, rows, post, Y):
    """The entropy readout fit on all the answer rows of X, applied to other states Y (m, C) -> (m,)."""
    b, t = np.nonzero(rows)
    return ms.ridge_fit(X[b, t], wt.entropy_bits(post[b, t]))(Y)


def margin(stats):
    """max(MARGIN, 2 sd of the random initialisations' step ratios)."""
    return max(MARGIN, 2 * ms.seed_sd(stats["cot"]["random_init_step_ratios"]))


def judge_seed(stats):
    """-> (short, confident) for one seed's statistics."""
    c, d, m = stats["cot"], stats["direct"], margin(stats)
    others = [d["jump_ratio"], c["shuffled_step_ratio"], *c["random_init_step_ratios"]]
    short = all(c["step_ratio"] < o - m for o in others)
    confident = (c["confident"] is not None and d["confident"] is not None and c["confident"] >= CONFIDENT_SHARE
                 and d["confident"] <= c["confident"] - CONFIDENT_GAP)
    return short, confident


def verdict(per_seed, runs_out=True):
    """per_seed: [stats] one per seed; runs_out: the direct model fails some h >= 2 at this depth. -> (verdict,
    why)."""
    if not runs_out:
        return UNDECIDED, "the direct model answers every h at this depth: it has not run out of layers"
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


def direct_runs_out(metrics):
    """From a direct run's metrics.json: some h >= 2 scores below matrix.GOOD."""
    import depth
    g = depth.answer_groups(metrics, False)
    return any(depth.group_score(g[h]) < matrix.GOOD for h in g if h >= 2)


def main(argv_=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default=os.path.join("runs", "depth"), help="depth.py's cells (default runs/depth)")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--seqs", type=int, default=500, help="held-out sequences (default 500)")
    a = p.parse_args(argv_)
    if a.seqs < 4:
        p.error(f"--seqs {a.seqs}: allowed are 4 or more")
    per_seed, out, falls_short = [], {}, []
    for s in a.seeds:
        run = lambda mode: os.path.join(a.runs, f"hops-transformer-L{a.layers}-{mode}-s{s}")
        paths = [os.path.join(run(m), "checkpoint.npz") for m in ("direct", "cot")]
        missing = [q for q in paths if not os.path.exists(q)]
        if missing:
            print(f"seed {s}: {missing[0]} is missing (run python depth.py first); left out")
            continue
        stats = measure(*paths, n=a.seqs)
        with open(os.path.join(run("direct"), "metrics.json")) as f:
            falls_short.append(direct_runs_out(json.load(f)))
        per_seed.append(stats)
        out[f"seed {s}"] = stats
        c, d = stats["cot"], stats["direct"]
        print(f"seed {s}: chain step {c['step_ratio']:.3f} S (shuffled {c['shuffled_step_ratio']:.3f}, random init "
              f"{', '.join(f'{r:.3f}' for r in c['random_init_step_ratios'])}); direct jump {d['jump_ratio']:.3f} S; "
              f"confident {c['confident']:.3f} chain, {d['confident']:.3f} direct; readout R^2 "
              f"{c['readout_r2'] or float('nan'):.3f} / {d['readout_r2'] or float('nan'):.3f}, change per step "
              f"{c['readout_step_bits']:.3f} bits, per jump {d['readout_jump_bits']:.3f}")
    v, why = verdict(per_seed, runs_out=all(falls_short) if falls_short else True)
    print(f"claim: short, confident steps ({a.layers} layers): {v} ({why})")
    out.update(verdict=v, why=why, layers=a.layers, margin=MARGIN, confident_share=CONFIDENT_SHARE,
               confident_gap=CONFIDENT_GAP)
    with open(os.path.join(a.runs, f"chainsteps-L{a.layers}.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
