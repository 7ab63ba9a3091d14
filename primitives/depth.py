"""depth: running out of layers, and chain of thought as the way out, measured in the hops wind tunnel.

    python -m primitives.depth [--preset quick|default] [--out runs/depth] [--seeds 0 1] [--jobs 2] [--figures figures]
                    [--max-hops 4]

The papers close with a claim: a task that needs more steps of inference than the network has layers
cannot be finished in one pass (the network "runs out of layers"), and chain of thought extends the
depth, in short confident steps, without hallucinating. tunnels/hops.py draws a chain of h lookups through a
permutation whose exact posterior is known at every hop; every run draws h from 1 to --max-hops, and
its answer groups h=1, h=2, ... score each h apart.

The cells are ordinary train.py runs through matrix.run (a finished one is skipped, an interrupted one
resumes): the transformer at DEPTHS layers of the hops preset's width, direct and with --cot, and the
other recurrent families (LSTM, SSM) at the preset transformer's parameter count, direct and with
--cot. A chain-of-thought cell is judged on the final answers it reaches running free (primitives/cot.py: its own
hops, the free-running distribution against the exact posterior given the context alone), not on its
teacher-forced hops.

The rules, fixed here before the first run they judge (tests exercise every branch):
  score(h)   1 - KL / KL(uniform) on the answers of h hops: the matrix's score, on one answer group
  solved(h)  score(h) >= matrix.GOOD (0.95)
  reach      the largest h with every h' <= h solved (0: not even one hop), per seed
  short      a depth whose direct reach is at least 1 and below max_hops in every seed (it does the first
             hop and runs out before the last)
  Every claim is undecided while a transformer cell of the sweep is missing (not yet run, failed).
  Claim 1, a fixed depth runs out: supported when some depth's direct reach is below max_hops in every
    seed and a deeper one reaches further in every seed (its smallest reach over seeds above the
    shallower's largest); not supported when some depth is short and no deeper depth reaches further than
    a shallower one in any seed; undecided else (the seeds disagree; nothing learned; every depth at
    max_hops: the range was too small to tell).
  Claim 2, chain of thought extends it: at every short depth, the free-running reach with --cot exceeds
    the direct one (smallest over seeds against largest): supported; at every short depth it does not in
    any seed: not supported; else, or when no depth is short, undecided.
  Claim 3, without hallucinating: over the free-running chain of thought's final answers past the largest
    direct reach of each short depth, the share hallucinated (evaluation: over half its mass on an answer
    the posterior gives under 5%), with a Wilson interval at two standard errors per short depth and seed
    (a seed's answers share one model, so they are not pooled with another's): supported when claim 2 is
    and in every depth and seed the interval's upper end, on the upper bound of the share (primitives/cot.py: the
    mass the free run dropped put on an implausible answer), is below CEILING; not supported when in every
    depth and seed its lower end, on the share itself, is above CEILING; else, or when no depth is short,
    undecided. The direct model's share on the same h is reported beside it, pooled. (Amended after the
    first two probe runs and before any primitives/depth.py run: the rule first asked the chain of thought to
    hallucinate less than the direct model, which a direct model that is honestly unsure, as the probe's
    was, makes impossible; after a referee's read, before any run: Wilson intervals, the upper bound, short
    depths only; after a second referee's read, after the matched budget's runs, whose short depths were
    none, so that no verdict on it had been read, and before any 4x run finished: an interval per depth
    and seed instead of pooled answers, and supported only with claim 2, since a chain of thought that is
    unsure past the reach hallucinates nothing either.)
What happens past a depth's reach is also said: hallucinating or honest doubt, whichever share is larger
and at least NOTABLE, else neither (wrong, but neither confident nor unsure).

--confirm adds the runs of 4x the steps (X4_RULE), after the matched budget's cells.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("primitives/depth.py: run it as python -m primitives.depth, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import math  # noqa: E402

from primitives import matrix  # noqa: E402
import models  # noqa: E402
from harness import drivers, plots, runs  # noqa: E402
from harness.checkpoints import write_json  # noqa: E402
from tunnels import hops  # noqa: E402

DEPTHS = (1, 2, 3, 4, 6)        # the transformer's depths, one width
MAX_HOPS = 4                    # h drawn from 1 to this in every cell (the task's default)
OTHERS = ("lstm", "ssm")        # the recurrent families, at the preset transformer's count
SEEDS = (0, 1)
QUICK = dict(depths=(1, 2), seeds=(0,), max_hops=2)   # the quick preset (teaching, CI's smoke test): the
                                                      # task's quick preset, the families at their quick sizes
SUPPORTED, NOT_SUPPORTED, UNDECIDED = "supported", "not supported", "undecided"
CEILING = 0.02                  # claim 3: a chain of thought "does not hallucinate" below this share
Z = 2.0                         # claim 3's interval: two standard errors
NOTABLE = 0.05                  # what happens past the reach: a share below this does not name it


# ----------------------------------------------------------------------------
# the rules

def group_score(g):
    """One answer group's score: 1 - KL / KL(uniform), KL(uniform) = log2 K - mean H_Bayes on its answers."""
    if g["prior_kl_bits"] <= 0:
        raise ValueError("an answer group whose exact answers are all uniform has no score (KL(uniform) = 0)")
    return 1.0 - g["kl_bits"] / g["prior_kl_bits"]


def forward_flops(family, metrics, h):
    """About how many floating-point operations a forward pass takes to the run's last answer of h hops (a
    chain of thought with a cache: one pass over the context and its h - 1 written hops): a third of the
    family's training-step count (models.step_flops) at that length."""
    from tunnels import hops
    cfg = models.config_from_dict(family, metrics["config"])
    return models.step_flops(family, cfg, 1, hops.answer_length(metrics["settings"], h)) / 3


def answer_groups(metrics, cot):
    """{h: group metrics} of a run: its held-out answers by h (direct), or its free-running final answers by h
    (cot). Each group gains prior_kl_bits from its mean exact entropy and the run's classes."""
    groups = metrics["free_run"]["free"]["groups"] if cot else metrics["groups"]
    log_k = math.log2(metrics["config"]["n_classes"])
    return {int(name[2:]): {**g, "prior_kl_bits": log_k - g["h_bayes_bits"]}
            for name, g in groups.items() if name.startswith("h=")}


def reach(groups):
    """The largest h with every h' <= h solved (score >= matrix.GOOD); 0 if one hop is not."""
    r = 0
    for h in sorted(groups):
        if h != r + 1 or group_score(groups[h]) < matrix.GOOD:
            break
        r = h
    return r


def runs_out(direct, max_hops):
    """Claim 1. direct: {depth: [reach per seed]}."""
    depths = sorted(direct)
    pairs = [(a, b) for i, a in enumerate(depths) for b in depths[i + 1:]]
    if any(max(direct[a]) < max_hops and min(direct[b]) > max(direct[a]) for a, b in pairs):
        return SUPPORTED
    if short_depths(direct, max_hops) and all(max(direct[b]) <= min(direct[a]) for a, b in pairs):
        return NOT_SUPPORTED
    return UNDECIDED


def short_depths(direct, max_hops):
    """The depths whose direct reach is at least 1 and below max_hops in every seed."""
    return [L for L in sorted(direct) if min(direct[L]) >= 1 and max(direct[L]) < max_hops]


def cot_extends(direct, cot, max_hops):
    """Claim 2. direct, cot: {depth: [reach per seed]} (cot: running free)."""
    short = short_depths(direct, max_hops)
    if not short or any(L not in cot for L in short):
        return UNDECIDED
    if all(min(cot[L]) > max(direct[L]) for L in short):
        return SUPPORTED
    if all(max(cot[L]) <= min(direct[L]) for L in short):
        return NOT_SUPPORTED
    return UNDECIDED


def past_reach(groups_by_seed, cut, key="hallucinated"):
    """(answers with key, all answers) pooled over the seeds, on every h above cut."""
    bad = n = 0
    for groups in groups_by_seed:
        for h, g in groups.items():
            if h > cut:
                bad += g[key] * g["n_answers"]
                n += g["n_answers"]
    return bad, n


def wilson(k, n, z=Z):
    """The Wilson score interval of a share k / n at z standard errors: (low, high)."""
    p, z2 = k / n, z * z
    centre, half = p + z2 / (2 * n), z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (centre - half) / (1 + z2 / n), (centre + half) / (1 + z2 / n)


def without_hallucinating(cot_shares, extends):
    """Claim 3. cot_shares: [(hallucinated, hallucinated at most, answers)] per short depth and seed (each its
    own interval: a seed's answers are not independent of each other's model), or []; extends: claim 2's
    verdict (supported needs it: an unsure chain of thought does not hallucinate either)."""
    shares = [s for s in cot_shares if s[2]]
    if not shares:
        return UNDECIDED
    if extends == SUPPORTED and all(wilson(s[1], s[2])[1] < CEILING for s in shares):
        return SUPPORTED
    if all(wilson(s[0], s[2])[0] > CEILING for s in shares):
        return NOT_SUPPORTED
    return UNDECIDED


def behaviour_past_reach(groups_by_seed, reaches):
    """"hallucinating", "honest doubt" or "neither": which share is larger (and at least NOTABLE) over the
    answers past each seed's reach, with both shares; None when no answer lies past it."""
    hall = doubt = n = 0.0
    for groups, r in zip(groups_by_seed, reaches):
        for h, g in groups.items():
            if h > r:
                hall += g["hallucinated"] * g["n_answers"]
                doubt += g["honest_doubt"] * g["n_answers"]
                n += g["n_answers"]
    if not n:
        return None
    kind = "neither" if max(hall, doubt) / n < NOTABLE else "hallucinating" if hall > doubt else "honest doubt"
    return dict(kind=kind, hallucinated=hall / n, honest_doubt=doubt / n, answers=int(n))


X4_RULE = """The runs of 4x the steps (--confirm; written before any 4x run finished, and amended before any finished:
from seed 0 only to every seed, so that they can decide, and after a referee's read to all depths or none).
Which depths: every direct depth of the transformer, in every seed of the sweep, when some depth's training
loss was still falling at its end in some seed (matrix.flat false) or no depth reaches one hop in every
seed (claim 1 undecided for want of anything learned: the budget is the first suspect); else none (claim 1
compares depths at one budget). The three claims are judged again by the same rules with the direct cells
replaced by their 4x runs (the chain of thought kept at its matched budget: a chain of thought beating a
direct model of 4x the steps is the stronger finding, and a chain of thought losing to one says less),
reported beside the matched budget's verdicts, not in place of them. Each depth also reads the budget, seed
by seed: "budget-limited" where the 4x run's reach exceeds the matched budget's in every seed, "not the
budget" else, "incomplete" where a seed's 4x run is missing."""


def x4_depths(direct, falling):
    """X4_RULE: the direct depths to run at 4x the steps, all or none (claim 1 compares depths at one budget).
    direct: {depth: [reach per seed]}; falling: {depth: whether some seed's loss was still falling (not
    matrix.flat)}."""
    nothing = direct and not any(min(r) >= 1 for r in direct.values())
    return sorted(direct) if nothing or any(falling.get(L) for L in direct) else []


def budget_reading(reaches, reaches_4x):
    """X4_RULE: {seed: reach} at the matched budget and at 4x -> "budget-limited" or "not the budget", seed by
    seed; "incomplete" when a seed lacks its 4x run."""
    if set(reaches_4x) != set(reaches):
        return "incomplete"
    return "budget-limited" if all(reaches_4x[s] > reaches[s] for s in reaches) else "not the budget"


# ----------------------------------------------------------------------------
# the cells

def cells(seeds=SEEDS, max_hops=MAX_HOPS, depths=DEPTHS, others=OTHERS):
    """-> matrix.run's cells: the transformer at each depth, the others at the preset's count; direct, cot."""
    flags = ["--max-hops", str(max_hops)]
    out = []
    for cot in (False, True):
        tag, extra = ("cot", ["--cot"]) if cot else ("direct", [])
        rows = [("transformer", L) for L in depths] + [(f, None) for f in others]
        for family, layers in rows:
            for seed in seeds:
                name = f"hops-{family}{f'-L{layers}' if layers else ''}-{tag}-s{seed}"
                out.append(dict(task="hops", family=family, layers=layers, seed=seed, flags=flags + extra,
                                cot=cot, name=name))
    return out


def x4_cells(depths, seeds, max_hops, steps):
    """X4_RULE's cells: the direct transformer at each depth and seed, steps (4x the preset's)."""
    return [dict(task="hops", family="transformer", layers=L, seed=seed, cot=False, x4=True,
                 flags=["--max-hops", str(max_hops), "--steps", str(steps)],
                 name=f"hops-transformer-L{L}-direct-4x-s{seed}")
            for L in depths for seed in seeds]


def verdicts(results, todo, max_hops):
    """results {cell name: metrics} -> rows per (family, layers, mode), the three claims, and what claim 3
    pooled (and the transformer cells missing, which leave every claim undecided)."""
    rows = {}
    for c in todo:
        m = results.get(c["name"])
        if m is None or "sits_out" in m or "failed" in m:
            continue
        key = (c["family"], c["layers"], c["cot"])
        r = rows.setdefault(key, dict(family=c["family"], layers=c["layers"], cot=c["cot"], params=m["params"],
                                      steps=m["steps"], groups=[], reach=[], seeds=[]))
        g = answer_groups(m, c["cot"])
        r["groups"].append(g)
        r["reach"].append(reach(g))
        r["seeds"].append(c["seed"])
        r["flops"] = {h: forward_flops(c["family"], m, h) for h in g}     # the same config for every seed
    for r in rows.values():
        r["past_reach"] = behaviour_past_reach(r["groups"], r["reach"])
    missing = [c["name"] for c in todo if c["family"] == "transformer" and
               (results.get(c["name"]) is None or "sits_out" in results[c["name"]] or "failed" in results[c["name"]])]
    depth = {cot: {r["layers"]: r["reach"] for r in rows.values() if r["family"] == "transformer" and r["cot"] == cot}
             for cot in (False, True)}
    short = short_depths(depth[False], max_hops) if depth[False] else []
    d_share, c_shares = None, []
    for L in short:
        d, c = rows[("transformer", L, False)], rows.get(("transformer", L, True))
        if c is None:
            continue
        cut = max(d["reach"])                                   # the same h for both: past every seed's reach
        db, dn = past_reach(d["groups"], cut)
        d_share = (d_share[0] + db, d_share[1] + dn) if d_share else (db, dn)
        for g in c["groups"]:                                   # the chain of thought seed by seed
            cb, cn = past_reach([g], cut)
            c_shares.append((cb, past_reach([g], cut, "hallucinated_upper")[0], cn))
    extends = cot_extends(depth[False], depth[True], max_hops)
    claims = {"a fixed depth runs out": runs_out(depth[False], max_hops) if len(depth[False]) > 1 else UNDECIDED,
              "chain of thought extends it": extends,
              "without hallucinating": without_hallucinating(c_shares, extends)}
    c_share = tuple(sum(x) for x in zip(*c_shares)) if c_shares else None
    if missing:
        claims = {k: UNDECIDED for k in claims}
    return list(rows.values()), claims, dict(direct=d_share, cot=c_share, short_depths=short, missing=missing)


def confirm(rows, results, todo, out, preset, max_hops, jobs=2, run=matrix.run):
    """X4_RULE: train the 4x runs the verdicts ask for and judge the claims again with them. -> (the 4x rows,
    as verdicts' rows with x4 and the budget's reading, the claims at 4x, what claim 3 pooled at 4x, their
    details)."""
    from tunnels import tasks
    direct = {r["layers"]: r["reach"] for r in rows if r["family"] == "transformer" and not r["cot"]}
    by_seed = {r["layers"]: dict(zip(r["seeds"], r["reach"])) for r in rows if r["family"] == "transformer"
               and not r["cot"]}
    falling = {c["layers"]: True for c in todo if c["family"] == "transformer" and not c["cot"]
               and c["name"] in results and "steps" in results[c["name"]]
               and not matrix.flat(os.path.join(out, c["name"], "log.csv"))}
    seeds = sorted({c["seed"] for c in todo})
    todo_x4 = x4_cells(x4_depths(direct, falling), seeds, max_hops, 4 * tasks.task("hops").PRESETS[preset]["steps"])
    if not todo_x4:
        return [], {}, {}, []
    got = run(preset, out, jobs=jobs, todo=sorted(todo_x4, key=lambda c: -c["layers"]))   # the longest first
    merged = dict(results)
    for c in todo_x4:                                # each 4x run in its matched-budget cell's place
        merged[c["name"].replace("-4x", "")] = got.get(c["name"], {"failed": "not run"})
    rows_4x, claims_4x, shares_4x = verdicts(merged, todo, max_hops)
    x4_rows = [dict(r, x4=True, budget=budget_reading(by_seed[r["layers"]], dict(zip(r["seeds"], r["reach"]))))
               for r in rows_4x
               if r["family"] == "transformer" and not r["cot"] and r["layers"] in {c["layers"] for c in todo_x4}]
    return x4_rows, claims_4x, shares_4x, details(got, todo_x4)


def details(results, todo):
    """Every cell's answers by h, seeds side by side: [dict(family, layers, mode, kl, hallucinated, honest_doubt,
    accuracy)], each {h: [per seed]}; modes: direct, or the chain of thought teacher-forced (the true hops
    before), running free and greedy."""
    out = {}
    for c in todo:
        m = results.get(c["name"])
        if m is None or "steps" not in m:
            continue
        modes = ([("teacher-forced", m["groups"])] + [(k, m["free_run"][k]["groups"]) for k in ("free", "greedy")]
                 if c["cot"] else [("direct, 4x" if c.get("x4") else "direct", m["groups"])])
        for mode, groups in modes:
            r = out.setdefault((c["family"], c["layers"], mode), dict(family=c["family"], layers=c["layers"],
                                                                      mode=mode, seeds=[]))
            r["seeds"].append(c["seed"])
            for name, g in groups.items():
                if name.startswith("h="):
                    for k in ("kl_bits", "hallucinated", "honest_doubt", "accuracy"):
                        r.setdefault(k, {}).setdefault(int(name[2:]), []).append(g.get(k))
    return list(out.values())


def detail_lines(rows, max_hops):
    """details' rows as a table: KL (bits) by h, the seeds joined by '/', and the shares hallucinated."""
    hs = range(1, max_hops + 1)
    seeds = lambda v: "/".join("-" if x is None else f"{x:.3g}" for x in v)
    share = lambda v: "/".join("-" if x is None else f"{x:.0%}" for x in v)
    head = f"{'model':<24}{'mode':<16}" + "".join(f"{f'KL h={h}':>14}" for h in hs) + "  hallucinated by h"
    out = ["KL in bits by h, seed by seed; the share hallucinated by h (over half the mass on an answer the posterior "
           "gives under 5%)", head, "-" * len(head)]
    for r in rows:
        kl = "".join(f"{seeds(r['kl_bits'][h]) if h in r['kl_bits'] else '':>14}" for h in hs)
        hall = "  ".join(share(r["hallucinated"][h]) for h in hs if h in r["hallucinated"])
        out.append(f"{plots.row_label(r['family'], r['layers']):<24}{r['mode']:<16}{kl}  {hall}")
    return out


def lines(rows, claims, max_hops):
    hs = range(1, max_hops + 1)
    head = (f"{'model':<26}{'mode':<8}{'params':>9}  " + "".join(f"{f'h={h}':>7}" for h in hs)
            + f"  {'MFLOP':>11}  reach   past it")
    out = ["scores 1 - KL/KL(uniform) by hops h (first seed; cot: running free); forward MFLOP to the answer at "
           "h = 1 and the largest h; reach per seed; past it: hallucinated / honest doubt", head, "-" * len(head)]
    for r in rows:
        name = plots.row_label(r["family"], r["layers"])
        g = r["groups"][0]
        scores = "".join(f"{group_score(g[h]):>7.3f}" if h in g else f"{'':>7}" for h in hs)
        p = r.get("past_reach")
        past = "" if p is None else f"{p['kind']} ({p['hallucinated']:.1%} / {p['honest_doubt']:.1%})"
        f = r["flops"]
        mflop = f"{f[min(f)] / 1e6:.2f}-{f[max(f)] / 1e6:.2f}"
        mode = "4x" if r.get("x4") else "cot" if r["cot"] else "direct"
        past = r["budget"] if r.get("x4") else past
        out.append(f"{name:<26}{mode:<8}{r['params']:>9,}  {scores}  {mflop:>11}  "
                   f"{'/'.join(map(str, r['reach'])):<7} {past}")
    out += [f"claim: {k}: {v}" for k, v in claims.items()]
    return out


COMMAND = "python -m primitives.depth"


def main(argv_=None):
    p = drivers.parser(COMMAND, __doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=("quick", "default"), default="default")
    p.add_argument("--out", default=None, help="the cells' directory (default runs/depth[-quick])")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the preset's (quick 0; default 0 1)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--figures", default="figures")
    p.add_argument("--max-hops", type=int, default=None, help="default: the preset's (quick 2; default 4)")
    p.add_argument("--confirm", action="store_true", help="also the runs of 4x the steps the verdicts ask for "
                   "(X4_RULE: every seed, the claims judged again beside the verdicts)")
    p.add_argument("--overwrite", action="store_true", help="where --out was made with other settings (another "
                   "preset or --max-hops), remove what this command wrote there and start again")
    a = p.parse_args(argv_)
    drivers.check(p, drivers.jobs(a.jobs), drivers.seeds(a.seeds), drivers.count(a.max_hops, "--max-hops", 1, hops.HOPS_TOP),
                  drivers.directory(a.out, "--out"), drivers.directory(a.figures, "--figures"))
    quick = a.preset == "quick"
    a.max_hops = a.max_hops or (QUICK["max_hops"] if quick else MAX_HOPS)
    a.out = a.out or os.path.join("runs", "depth" + ("-quick" if quick else ""))
    try:
        drivers.take(a.out, COMMAND, dict(preset=a.preset, max_hops=a.max_hops), a.overwrite)
    except drivers.Refused as e:
        p.error(str(e))
    try:
        failed = drive(a)
    except drivers.Refused as e:
        p.error(str(e))
    finally:
        runs.release(a.out)
    if failed:
        print(f"{len(failed)} cell(s) failed, left out of the verdicts above: {', '.join(failed)} (their logs: "
              f"{os.path.join(a.out, failed[0])}.log, ...; delete a cell's .failed marker to train it again)")
        raise SystemExit(1)


def drive(a):
    """The cells, the verdicts and the figure, in a directory taken (main) -> the names of the cells that failed."""
    quick = a.preset == "quick"
    seeds = tuple(a.seeds or (QUICK["seeds"] if quick else SEEDS))
    todo = cells(seeds, a.max_hops, QUICK["depths"] if quick else DEPTHS)
    results = matrix.run(a.preset, a.out, jobs=a.jobs, todo=todo)
    rows, claims, shares = verdicts(results, todo, a.max_hops)
    x4_rows, claims_4x, shares_4x, x4_detail = (confirm(rows, results, todo, a.out, a.preset, a.max_hops, a.jobs)
                                                if a.confirm else ([], {}, {}, []))
    detail = details(results, todo) + x4_detail
    drivers.note(a.out, summaries=["depth.json"])
    write_json(os.path.join(a.out, "depth.json"), dict(max_hops=a.max_hops, good=matrix.GOOD, claims=claims, shares=shares,
                                                       claims_4x=claims_4x, shares_4x=shares_4x, rows=rows + x4_rows,
                                                       details=detail))
    print("\n".join(detail_lines(detail, a.max_hops)))
    print("\n".join(lines(rows + x4_rows, claims, a.max_hops)))
    print("\n".join(f"claim with the direct depths at 4x the steps (X4_RULE): {k}: {v}" for k, v in claims_4x.items()))
    os.makedirs(a.figures, exist_ok=True)
    print(plots.plot_layers(rows + x4_rows, os.path.join(a.figures, "layers" + ("-quick" if quick else "") + ".png"),
                            a.max_hops))
    return sorted(name for name, m in results.items() if "failed" in m)


if __name__ == "__main__":
    main()
