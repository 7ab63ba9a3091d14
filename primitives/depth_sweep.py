"""depth_sweep: the depth experiment with depth apart from optimisation and chain of thought apart from its
extra supervision, judged by primitives/depth_rules.py on fresh seeds.

    python -m primitives.depth_sweep [--preset quick|default] [--out runs/depth-sweep] [--jobs 2]

Every cell is a train.py run through matrix.run (a finished one is skipped, an interrupted one resumes):
  - the transformer at each depth, direct, at every rate and initialisation of the grid and every seed; the
    direct format asks QUERIES questions a sequence, as many answers as a chain of thought of the same
    max_hops supervises on the task itself ((max_hops + 1) / 2, rounded up; under the preset's hop curriculum,
    which asks fewer hops early, the chain gets fewer: 1.96 a sequence on average against the direct 3 over
    the default 6,000 steps at 4 hops), so the direct model is never trained on fewer answers;
  - with --cot, the same grid at the depths the prediction calls short (a lookup fits, every hop does not);
  - longer where not flat: a cell whose loss still falls over the last tenth of its steps (matrix.flat) is
    run again with 4x the steps (one round: the 4x run is not itself extended), and the longer run stands;
  - for each depth and seed, the setting with the lowest held-out KL (its longest run) is chosen, direct and
    cot apart;
  - the growth control: each depth past the first also started from the chosen run one layer shallower of
    the same seed (train.py --grow-from, the new block's output maps at zero), at that run's setting.
A depth's lookup reach in a seed is the larger of its chosen run's and its grown run's; where the grown run
reaches further, the line says the limit was optimisation. The readings and the rules of the first two
claims are depth_rules.py's; "without hallucinating" is depth.py's rule (a Wilson interval per short depth
and seed on the chain's free answers past the direct reach), read at the sweep's chosen runs.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("primitives/depth_sweep.py: run it as python -m primitives.depth_sweep, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import math  # noqa: E402

from harness.checkpoints import write_json  # noqa: E402
from harness import drivers, plots, runs  # noqa: E402
from primitives import depth, depth_rules, matrix  # noqa: E402
from tunnels import hops  # noqa: E402

# the grid, fixed before its runs: max_hops 4 so that the predicted depths are small (2 layers for one hop,
# 3 for two and three, 4 for four) and two depths are short (2 and 3);
# seeds 2, 3, 4: none of the development runs' (0, 1)
PRESETS = {
    "default": dict(max_hops=4, depths=(1, 2, 3, 4, 5), rates=(1e-3, 3e-3, 1e-2), inits=("gpt2", "fan-in"),
                    seeds=(2, 3, 4)),
    "quick": dict(max_hops=2, depths=(1, 2), rates=(3e-3,), inits=("fan-in",), seeds=(0,)),   # a smoke test
}


def queries(max_hops):
    """The direct format's questions a sequence: a chain of thought of max_hops supervises (max_hops + 1) / 2
    answers on average (h uniform on 1..max_hops), rounded up."""
    return math.ceil((max_hops + 1) / 2)


def short_depths(depths, max_hops):
    """The depths the prediction calls short: a lookup fits (layers_needed(1)), every hop does not."""
    return depth_rules.short_depths(depths, max_hops)


def setting_name(lr, init):
    return f"lr{lr:g}-{init}"


def grid_cells(g):
    """The grid's cells: direct at every depth, cot at the short ones; each rate, initialisation and seed."""
    out = []
    for cot in (False, True):
        for L in (short_depths(g["depths"], g["max_hops"]) if cot else g["depths"]):
            for lr in g["rates"]:
                for init in g["inits"]:
                    for seed in g["seeds"]:
                        fmt = ["--cot"] if cot else ["--queries", str(queries(g["max_hops"]))]
                        out.append(dict(task="hops", family="transformer", layers=L, seed=seed, cot=cot,
                                        setting=setting_name(lr, init), flags=["--max-hops", str(g["max_hops"]), *fmt,
                                                                               "--lr", f"{lr:g}", "--init", init],
                                        name=f"L{L}-{'cot' if cot else 'direct'}-{setting_name(lr, init)}-s{seed}"))
    return out


def longer(cell, steps):
    """The cell again with 4x the steps (until flat)."""
    return {**cell, "flags": [*cell["flags"], "--steps", str(4 * steps)], "name": cell["name"] + "-4x", "x4": True}


def grown_cell(cell, L, out, source):
    """Depth L grown from the chosen run one layer shallower (cell: its cell; source: the run's name, its 4x
    run's where that stands), at its setting; named after the source, so another choice is another cell."""
    return {**cell, "layers": L, "flags": [*cell["flags"], "--grow-from", os.path.join(out, source, "checkpoint.npz")],
            "name": f"L{L}-grown-from-{source}", "grown": True}


def final(results, cell):
    """A cell's standing run: its 4x run where it has one, else itself (None if neither finished)."""
    for name in (cell["name"] + "-4x", cell["name"]):
        m = results.get(name)
        if m is not None and "failed" not in m and "sits_out" not in m:
            return name, m
    return None


def choose(results, cells):
    """{(depth, cot, seed): (cell, run name, metrics)}: per depth, format and seed, the setting whose standing
    run has the lowest held-out KL."""
    best = {}
    for c in cells:
        got = final(results, c)
        if got is None:
            continue
        key = (c["layers"], c["cot"], c["seed"])
        if key not in best or got[1]["kl_bits"] < best[key][2]["kl_bits"]:
            best[key] = (c, *got)
    return best


def accuracies(metrics, cot):
    """{h: accuracy on h's one-hot answers}: direct, the held-out answers; cot, the final answers running free."""
    groups = metrics["free_run"]["free"]["groups"] if cot else metrics["groups"]
    return {int(g[2:]): v.get("accuracy") for g, v in groups.items() if g.startswith("h=")}


def reaches(best, results, grown, g):
    """-> direct {depth: [reach per seed]}, cot {depth: [...]}, and the (depth, seed)s where the grown run
    reached further than the chosen one (the limit there was optimisation)."""
    direct, cot, optimisation = {}, {}, []
    for L in g["depths"]:
        for seed in g["seeds"]:
            chosen = best.get((L, False, seed))
            if chosen is not None:
                r = depth_rules.lookup_reach(accuracies(chosen[2], False))
                m = results.get(grown.get((L, seed), {}).get("name"))
                if m is not None and "failed" not in m and "sits_out" not in m:
                    r_grown = depth_rules.lookup_reach(accuracies(m, False))
                    if r_grown > r:
                        optimisation.append((L, seed))
                    r = max(r, r_grown)
                direct.setdefault(L, []).append(r)
            c = best.get((L, True, seed))
            if c is not None:
                cot.setdefault(L, []).append(depth_rules.lookup_reach(accuracies(c[2], True)))
    return direct, cot, optimisation


def hallucinated(best, direct, g):
    """Claim 3's counts (depth.without_hallucinating): per short depth and seed, the chosen chain of thought's
    free-running final answers past the direct model's largest reach there: (hallucinated, hallucinated at
    most, answers)."""
    out = []
    for L in short_depths(g["depths"], g["max_hops"]):
        if L not in direct:
            continue
        cut = max(direct[L])
        for seed in g["seeds"]:
            chosen = best.get((L, True, seed))
            if chosen is not None:
                groups = depth.answer_groups(chosen[2], True)
                out.append((depth.past_reach([groups], cut)[0], depth.past_reach([groups], cut, "hallucinated_upper")[0],
                            depth.past_reach([groups], cut)[1]))
    return out


def run(preset="default", out=None, jobs=2, runner=matrix.run, figures="figures"):
    """The whole sweep (module docstring); -> its summary, written to out/depth-sweep.json."""
    g = PRESETS[preset]
    out = out or os.path.join("runs", "depth-sweep" + ("-quick" if preset == "quick" else ""))
    task_preset = "quick" if preset == "quick" else "default"
    cells = grid_cells(g)
    results = runner(task_preset, out, jobs=jobs, todo=cells)
    steps = {c["name"]: results[c["name"]]["steps"] for c in cells if final(results, c)}
    again = [longer(c, steps[c["name"]]) for c in cells if c["name"] in steps and "failed" not in results[c["name"]]
             and not matrix.flat(os.path.join(out, c["name"], "log.csv"))]
    if again:
        results.update(runner(task_preset, out, jobs=jobs, todo=again))
    best = choose(results, cells)
    grown = {}
    for L in g["depths"][1:]:
        below = [d for d in g["depths"] if d < L]
        for seed in g["seeds"]:
            src = best.get((below[-1], False, seed))
            if src is not None:
                grown[(L, seed)] = grown_cell(src[0], L, out, src[1])
    if grown:
        results.update(runner(task_preset, out, jobs=jobs, todo=list(grown.values())))
    direct, cot, optimisation = reaches(best, results, grown, g)
    claims = {"runs out": depth_rules.runs_out(direct, g["max_hops"]),
              "extends": depth_rules.cot_extends(direct, cot, g["max_hops"])}
    claims["without hallucinating"] = (depth.without_hallucinating(hallucinated(best, direct, g), claims["extends"][0]),
                                       "depth.without_hallucinating on the chain's free answers past the direct reach")
    summary = dict(preset=preset, grid=g, queries=queries(g["max_hops"]), direct=direct, cot=cot,
                   n_symbols=hops.SETTINGS["n_symbols"], does=depth_rules.DOES,
                   optimisation=optimisation, claims={k: dict(verdict=v, why=w) for k, (v, w) in claims.items()},
                   chosen={f"L{k[0]}-{'cot' if k[1] else 'direct'}-s{k[2]}": v[1] for k, v in best.items()},
                   readings={name: m.get("readings") for name, m in results.items() if isinstance(m, dict)},
                   failed=sorted(name for name, m in results.items() if "failed" in m))
    drivers.note(out, summaries=["depth-sweep.json"])
    write_json(os.path.join(out, "depth-sweep.json"), summary)
    os.makedirs(figures, exist_ok=True)
    drawn = plots.plot_depth_sweep(summary, os.path.join(figures, "depth-sweep" + ("-quick" if preset == "quick"
                                                                                   else "") + ".png"))
    print(f"lookup reach by depth, seed by seed ({', '.join(map(str, g['seeds']))}): direct "
          + "; ".join(f"{L} layers {r}" for L, r in direct.items())
          + " | chain of thought " + ("; ".join(f"{L} layers {r}" for L, r in cot.items()) or "none"))
    if optimisation:
        print("grown further than trained from scratch (the limit there was optimisation): "
              + ", ".join(f"{L} layers seed {s}" for L, s in optimisation))
    for claim, (verdict, why) in claims.items():
        print(f"{claim}: {verdict} ({why})")
    print(f"{os.path.join(out, 'depth-sweep.json')}; figure {drawn}; the geometric claim: python -m primitives.chainsteps "
          f"--sweep {out}")
    return summary


COMMAND = "python -m primitives.depth_sweep"


def main(argv=None):
    p = drivers.parser(COMMAND, __doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=tuple(PRESETS), default="default")
    p.add_argument("--out", default=None, help="the cells' directory (default runs/depth-sweep[-quick])")
    p.add_argument("--jobs", type=int, default=2, help="cells at a time (default 2, one per core)")
    p.add_argument("--figures", default="figures", help="where depth-sweep.png goes (default figures)")
    p.add_argument("--overwrite", action="store_true", help="where --out was made with another preset, remove what "
                   "this command wrote there and start again")
    a = p.parse_args(argv)
    drivers.check(p, drivers.jobs(a.jobs), drivers.directory(a.out, "--out"), drivers.directory(a.figures, "--figures"))
    out = a.out or os.path.join("runs", "depth-sweep" + ("-quick" if a.preset == "quick" else ""))
    try:
        drivers.take(out, COMMAND, dict(preset=a.preset), a.overwrite)
    except drivers.Refused as e:
        p.error(str(e))
    try:
        summary = run(a.preset, out, a.jobs, figures=a.figures)
    except drivers.Refused as e:
        p.error(str(e))
    finally:
        runs.release(out)
    if summary["failed"]:
        print(f"{len(summary['failed'])} cell(s) failed, left out of the verdicts above: {', '.join(summary['failed'])} "
              f"(their logs: {os.path.join(out, summary['failed'][0])}.log, ...; delete a cell's .failed marker to train "
              f"it again)")
        raise SystemExit(1)
    return summary


if __name__ == "__main__":
    main()
