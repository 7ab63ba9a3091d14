"""matrix: every registered family on every token wind tunnel, at matched parameter counts and budgets, scored
the same way on every task: the revised Paper I's table of Bayesian primitives against architectures, measured.

    python -m primitives.matrix [--preset quick|default] [--out runs/matrix] [--seeds 0 1] [--jobs 2] [--figures DIR] [--confirm]
    python -m primitives.matrix --sweep capacity|filler     the recall sweeps (below)

Each cell is an ordinary run of train.py (so there is one training loop) in OUT/<task>-<family>[-L<layers>]-s<seed>
with its metrics.json: a finished cell is skipped, an interrupted one resumes (--resume), so the command can
be stopped (Ctrl-C) and run again. Cells run one Numba thread each (a cell's numbers do not depend on how many
run beside it), --jobs at a time.

What a cell gets (the default preset): the task's default preset (its steps x batch: the same budget for every
family, said in the table), each family's own learning rate and initialisation for the task (its PRESETS),
and --params the transformer's parameter count at that preset (every family within 5%, models.MATCH_TOL); the
HMM trains on soft targets. Depth rows: the transformer also at DEPTHS layers of its width. The quick preset
(teaching, CI's smoke test): each task's quick preset, the families at their quick sizes (not matched), one
seed, no depth rows.

Two scores, on the cell's held-out answers. The score against uniform: the fraction of the prior's gap closed,
1 - KL(model) / KL(a uniform predictor) (metrics kl_bits and prior_kl_bits). The score against the shortcut
(`closed`), which decides the mark: the share of what the task's best predictor without its primitive leaves
that the model closes, (score - floor) / (1 - floor), the floor being that predictor's score (tasks.shortcut:
the HMM's current observation weighed by the chain's marginal, about 0.92; transport's memoryless filter,
about 0.28; recall's stored values without their keys, about 0.44; the sawtooth's answer without its lookup;
the bijection has none, its floor the uniform prior, 0). The marks, one threshold for every column: a check
at a closed share of at least GOOD, ~ from PARTIAL up, a cross below (so a model at or below its shortcut is
a cross whatever its score against uniform). A cell whose seeds get different marks is marked split (with
three seeds, a majority decides). The transport column also reads each seed's effective memory
(tunnels/transport.effective_memory): the k whose window filter of k observations has the model's KL.

--confirm treats every cell alike, whatever the authors drew: three seeds (CONFIRM_SEEDS) for every cell, and
for every cell whose training loss still falls over the last tenth of its steps in any seed (flat), one run
of 4x the steps (seed 0), its mark reported beside the seeds' (X4_RULE).
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("primitives/matrix.py: run it as python -m primitives.matrix, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import argparse  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import models  # noqa: E402
from harness import drivers, plots, runs  # noqa: E402
from harness.checkpoints import write_json  # noqa: E402
from tunnels import tasks  # noqa: E402

GOOD, PARTIAL = 0.95, 0.50          # the marks' thresholds on the closed share, fixed before the first matrix run
MARKS = ("✓", "~", "✗")             # closed >= GOOD, PARTIAL <= closed < GOOD, closed < PARTIAL
FLOOR_SEQS = 1000                   # held-out sequences the shortcut's score is measured on
DEPTHS = (1, 2, 4)                  # the transformer's depth rows (the default preset)
PRESETS = {"quick": dict(seeds=(0,), depth=False), "default": dict(seeds=(0, 1), depth=True)}
CONFIRM_SEEDS = (0, 1, 2)           # --confirm: every cell
SOFT = ("hmm",)                     # tasks trained on soft targets (as every HMM row in tunnels/README.md)
# what each task exercises, and the authors' hand-drawn figure (revised Paper I): accumulation is the
# bijection, transport HMM filtering, binding associative recall; the sawtooth's repeated keys need a lookup
# (close to binding) and are not in their figure; nor is the prefix MLP (their text: "MLPs realize none")
# transport twice: the authors' HMM, where one observation of memory nearly filters, and the transport tunnel,
# where filtering needs many (their figure's transport mark is compared with both)
PRIMITIVE = {"bijection": "accumulation", "sawtooth": "lookup", "hmm": "transport", "transport": "transport",
             "recall": "binding"}
# the matrix's columns are these tasks; a task registered for another experiment (hops: depth and chain of
# thought) is not a primitive of the table
AUTHORS = {"transformer": {"accumulation": "✓", "transport": "✓", "binding": "✓"},
           "ssm": {"accumulation": "✓", "transport": "✓", "binding": "~"},
           "lstm": {"accumulation": "✓", "transport": "✗", "binding": "✗"},
           "mlp": {"accumulation": "✗", "transport": "✗", "binding": "✗"}}


# ----------------------------------------------------------------------------
# the marks

def score(metrics):
    """The fraction of the prior's gap a model closes: 1 - KL(model) / KL(uniform), on its held-out answers."""
    if not metrics.get("prior_kl_bits"):
        raise ValueError("a cell's metrics.json lacks prior_kl_bits (written by train.py since the matrix); "
                         "evaluate it again: python train.py --eval-only <run>/checkpoint.npz")
    return 1.0 - metrics["kl_bits"] / metrics["prior_kl_bits"]


def closed(s, floor=None):
    """The share of the shortcut's gap a model closes: (s - floor) / (1 - floor), s and floor scores against
    uniform; floor None (no shortcut: the uniform prior) -> s itself."""
    return s if floor is None else (s - floor) / (1.0 - floor)


def mark(s, floor=None):
    """One seed's score against uniform -> its mark, from the share it closes of its task's shortcut's gap
    (closed): a check from GOOD, ~ from PARTIAL, else a cross. floor: the shortcut's score (tasks.shortcut),
    None for the uniform prior."""
    c = closed(s, floor)
    return MARKS[0] if c >= GOOD else MARKS[1] if c >= PARTIAL else MARKS[2]


def verdict(scores, floor=None):
    """The seeds' scores (against uniform) of a cell, its task's floor -> its mark where every seed gets it; with
    three seeds or more (--confirm),
    the mark of a majority, the seeds' marks beside it; else "split (a/b)"."""
    marks = [mark(s, floor) for s in scores]
    if len(set(marks)) == 1:
        return marks[0]
    top = max(MARKS, key=marks.count)
    if len(marks) >= 3 and marks.count(top) > len(marks) / 2:
        return f"{top} ({'/'.join(marks)})"
    return "split (" + "/".join(marks) + ")"


def shortcut_metrics(task, preset, extra=(), seqs=FLOOR_SEQS):
    """The task's shortcut (a predictor without its primitive, tasks.shortcut) scored on `seqs` held-out
    sequences of its preset's settings (extra: more train.py flags, a sweep point's): evaluate's metrics, or
    None where the task has no shortcut (the uniform prior)."""
    from harness import flags
    from evaluation import evaluate
    s = flags.parse_args(["--task", task, "--preset", preset, *extra]).settings
    batch = tasks.held_out_sets(task, s, seqs, 0)[""]
    q = tasks.shortcut(task, batch, s)
    return None if q is None else evaluate(lambda tokens: q, batch)[0]


def floor_score(task, preset):
    """The score of the task's shortcut on FLOOR_SEQS held-out sequences of its preset's settings, or None (no
    shortcut: the uniform prior, score 0)."""
    m = shortcut_metrics(task, preset)
    return None if m is None else score(m)


def floors(preset):
    """{task: floor_score} for every column: what each column's marks are read against."""
    return {t: floor_score(t, preset) for t in PRIMITIVE}


def memory_steps(task, preset, seqs=FLOOR_SEQS):
    """{k: KL bits} of the task's window filters of k observations (its WINDOWS; the tasks whose module reads
    effective_memory, as tunnels/transport.py) on `seqs` held-out sequences of its preset, each scored as a
    cell is (evaluate): the steps effective memory is read between. None for the other tasks."""
    from harness import flags
    from evaluation import evaluate
    mod = tasks.task(task)
    if not hasattr(mod, "effective_memory"):
        return None
    s = flags.parse_args(["--task", task, "--preset", preset]).settings
    batch = tasks.held_out_sets(task, s, seqs, 0)[""]
    return {k: evaluate(lambda tokens, k=k: mod.window_filter(batch, k), batch)[0]["kl_bits"] for k in mod.WINDOWS}


def effective_memory(task, kl, steps):
    """A seed's effective memory, its task module's reading (tunnels/transport.effective_memory): -> (k, where)."""
    return tasks.task(task).effective_memory(kl, steps)


def cell_mark(cell_verdict):
    """A verdict's mark: its own (unanimous) or its majority's ("~ (~/✗/~)" -> "~"); None for a split."""
    return None if cell_verdict.startswith("split") else cell_verdict[0]


def against_authors(family, task, cell_verdict):
    """-> "agrees", "disagrees", "split" (the seeds get different marks and no majority: neither), or None (the
    authors' figure has no such cell)."""
    claim = AUTHORS.get(family, {}).get(PRIMITIVE[task])
    if claim is None:
        return None
    m = cell_mark(cell_verdict)
    return "split" if m is None else "agrees" if m == claim else "disagrees"


# ----------------------------------------------------------------------------
# the cells

def cells(preset, seeds=None):
    """-> [dict(task, family, layers, seed, name)] in the order they run: task by task, family by family."""
    seeds = PRESETS[preset]["seeds"] if seeds is None else seeds
    out = []
    for task in PRIMITIVE:
        rows = [(family, None) for family in models.FAMILIES]
        if PRESETS[preset]["depth"]:                          # a depth equal to the preset's is its own row
            rows += [("transformer", L) for L in DEPTHS if L != transformer_size(task, preset)[2]]
        for family, layers in rows:
            for seed in seeds:
                tag = f"-L{layers}" if layers else ""
                out.append(dict(task=task, family=family, layers=layers, seed=seed, name=f"{task}-{family}{tag}-s{seed}"))
    return out


def transformer_size(task, preset):
    """-> (parameter count, width, layers) of the transformer at the task's preset: what every family is
    matched to, and the depth its row has."""
    from harness import flags
    args = flags.parse_args(["--task", task, "--preset", preset])
    cfg = flags.model_config(args, tasks.sizes(task, args.settings), "transformer")
    return models.count_params(models.param_shapes("transformer", cfg)), cfg.d_model, cfg.n_layers


def argv(cell, preset, run_dir, size=None):
    """The train.py command line of a cell; size: (params, width) of the task's transformer (default preset)."""
    a = [sys.executable, "train.py", "--task", cell["task"], "--model", cell["family"], "--preset", preset,
         "--seed", str(cell["seed"]), "--threads", "1", "--no-baseline", "--no-geometry", "--quiet", "--out", run_dir]
    a += ["--soft"] if cell["task"] in SOFT else []
    a += cell.get("flags", [])                                    # a sweep point's settings
    if cell["layers"]:                                            # a depth row: the transformer's width
        a += ["--layers", str(cell["layers"])] + (["--width", str(size[1])] if size is not None else [])
    elif size is not None and (cell["family"] != "transformer" or cell.get("match_all")):
        a += ["--params", str(size[0])]
    if os.path.exists(os.path.join(run_dir, "checkpoint.npz")):
        a += ["--resume"]                                          # an interrupted cell continues
    elif os.path.isdir(run_dir):
        a += ["--overwrite"]                                       # stopped before its first checkpoint
    return a


def sits_out(log_path, returncode, offset=0):
    """train.py's one line when it refused a cell's parameter count (exit code 2), read from what the cell's
    log gained since offset (its size when the cell started), else None."""
    if returncode != 2:
        return None
    with open(log_path) as f:
        f.seek(offset)
        lines = [l.strip() for l in f if l.startswith("train.py: error: --params")]
    return lines[-1][len("train.py: error: "):] if lines else None


def expected_steps(cell, preset):
    flags_ = cell.get("flags", [])
    return int(flags_[flags_.index("--steps") + 1]) if "--steps" in flags_ else tasks.task(cell["task"]).PRESETS[preset]["steps"]


def finished(run_dir, cell=None, preset=None):
    """A cell's result: its metrics.json (drivers.read_metrics, checked against the cell: task, family and
    steps, and the learning rate and its schedule train.py would use now; drivers.Refused in one line for a
    directory holding another run or one trained at another rate), a marker left by a cell that sat out or
    failed ({"sits_out": why} or {"failed": why}; delete the marker to try again), or None (not run, or its
    metrics.json cannot be read: drivers.read_metrics says why, and the cell is trained again)."""
    for kind in ("sits_out", "failed"):
        if os.path.exists(f"{run_dir}.{kind}"):
            with open(f"{run_dir}.{kind}", errors="replace") as f:
                return {kind: f.read().strip()}
    m, _ = drivers.read_metrics(run_dir)
    if m is None:
        return None
    if cell is not None and (m.get("task"), m.get("model"), m.get("steps")) != (
            cell["task"], cell["family"], expected_steps(cell, preset)):
        raise drivers.Refused(f"{run_dir} holds a run of {m.get('task')}, {m.get('model')}, {m.get('steps')} steps, "
                              f"not this cell's: move it or give another --out")
    ran = optimizer_of(run_dir, m) if cell is not None and preset is not None else {}
    if ran:
        wanted = optimizer_wanted(cell, preset, run_dir)
        differ = [k for k in wanted if k in ran and not math.isclose(ran[k], wanted[k], rel_tol=1e-9)]
        if differ:
            raise drivers.Refused(f"{run_dir} was trained with --{differ[0].replace('_', '-')} {ran[differ[0]]:g}, not "
                                  f"this cell's {wanted[differ[0]]:g} (a preset changed since?): move it or give another "
                                  f"--out")
    return m


def optimizer_of(run_dir, m):
    """What a finished cell was trained with (flags.OPTIMIZER): its metrics.json's record, or, for a run from
    before that record, its checkpoint's meta ({} if neither has it)."""
    if "optimizer" in m:
        return m["optimizer"]
    path = os.path.join(run_dir, "checkpoint.npz")
    if not os.path.exists(path):
        return {}
    from harness.checkpoints import load_checkpoint
    from harness.flags import OPTIMIZER
    try:
        meta = load_checkpoint(path)[2]
    except (ValueError, OSError) as e:
        raise drivers.Refused(f"{path} cannot be read ({str(e).splitlines()[0] if str(e) else e.__class__.__name__}), "
                              f"so what its cell was trained with is unknown: move it or give another --out") from None
    return {k: meta[k] for k in OPTIMIZER if meta.get(k) is not None}


def optimizer_wanted(cell, preset, run_dir):
    """What train.py would train the cell with now (its flags over the preset and the family's tuning)."""
    from harness import flags
    a = [x for x in argv(cell, preset, run_dir)[2:] if x not in ("--resume", "--overwrite")]
    args = flags.parse_args(a)
    return {k: getattr(args, k) for k in flags.OPTIMIZER}


# ----------------------------------------------------------------------------
# the recall sweeps: where a fixed-size state stops holding the pairs (capacity), and whether it is the
# distance (filler), each family at the transformer's recall parameter count (the transformer too, --params)

CAPACITY_PAIRS = (4, 8, 16, 32, 64)
FILLERS = (0, 8, 32, 128)                 # at the default 8 pairs, each at that fixed distance (--filler-fixed)
FILLER_SEEDS = (0, 1, 2)                  # the filler sweep's seeds: three a point
STAGES = ((500, 2), (1500, 4), (2500, 8), (3500, 16), (4500, 32))   # the pair curriculum: pairs before step
FLAT = (0.01, 0.05)                       # flat: the last tenth of training moves the excess loss by less than
                                          # 0.01 bits, 5% of the tenth before or its noise (fixed before the sweeps)


def capacity_flags(pairs):
    """A capacity point's train.py flags: the pairs, a key alphabet of twice them (at least 32), the pair
    curriculum's stages below them, and 2,500 steps past its last stage (at least the default 4,000)."""
    stages = [(until, A) for until, A in STAGES if A < pairs]
    steps = max(4000, (stages[-1][0] if stages else 0) + 2500)
    return ["--pairs", str(pairs), "--keys", str(max(32, 2 * pairs)), "--steps", str(steps),
            "--recall-curriculum", ",".join(f"{A}:{until}" for until, A in stages)]


def sweep_cells(sweep, seeds=(0,)):
    """The cells of a sweep ("capacity" or "filler"), every family, as the matrix's cells."""
    points = ([(f"pairs{p}", capacity_flags(p)) for p in CAPACITY_PAIRS] if sweep == "capacity" else
              [(f"fixed{f}", ["--filler", str(f), "--filler-fixed"]) for f in FILLERS])
    return [dict(task="recall", family=family, layers=None, seed=seed, flags=flags, match_all=True, point=point,
                 name=f"recall-{family}-{point}-s{seed}")
            for point, flags in points for family in models.FAMILIES for seed in seeds]


# the recurrent families' rate sweep (--sweep rates): every rate of RATES and each family's two
# initialisations, on the tasks where a family's rate was never chosen on the task itself (or on a seed a
# verdict uses), on RATE_SEED, which no verdict uses (the matrix's 0-2, the depth sweep's 2-4); per family
# and task the pair with the lowest held-out KL is chosen (fixed before the sweep's runs)
RATE_FAMILIES = ("lstm", "ssm")
RATE_TASKS = ("recall", "hops", "transport", "hmm")
RATES = (1e-3, 3e-3, 1e-2, 3e-2)          # the range the presets chose (1e-3 to 1e-2), one step past it
RATE_SEED = 9


def rate_cells(seed=RATE_SEED):
    """The rate sweep's cells: each family of RATE_FAMILIES on each task of RATE_TASKS at every rate and both of
    its initialisations (its module's INITS), at the task's default preset and the transformer's count."""
    return [dict(task=task, family=family, layers=None, seed=seed, flags=["--lr", f"{lr:g}", "--init", init],
                 match_all=True, point=f"lr{lr:g}-{init}", lr=lr, init=init,
                 name=f"{task}-{family}-lr{lr:g}-{init}-s{seed}")
            for task in RATE_TASKS for family in RATE_FAMILIES for init in models.module(family).INITS for lr in RATES]


def rate_rows(results, cells_, out):
    """The rate sweep's rows: dict(task, family, lr, init, kl, score, flat), or its sits_out/failed marker."""
    rows = []
    for c in cells_:
        m = results.get(c["name"])
        if m is None:
            continue
        row = dict(task=c["task"], family=c["family"], lr=c["lr"], init=c["init"])
        if "sits_out" in m or "failed" in m:
            rows.append({**row, **m})
            continue
        rows.append({**row, "kl": m["kl_bits"], "score": score(m),
                     "flat": flat(os.path.join(out, c["name"], "log.csv"))})
    return rows


def choose_rates(rows):
    """{(family, task): the row with the lowest KL, with "edge": whether its rate is the grid's smallest or
    largest (a better one may lie past it)}, over the rows that finished."""
    best = {}
    for r in rows:
        if "kl" not in r:
            continue
        key = (r["family"], r["task"])
        if key not in best or r["kl"] < best[key]["kl"]:
            best[key] = r
    return {k: {**r, "edge": r["lr"] in (min(RATES), max(RATES))} for k, r in best.items()}


def rate_lines(rows, chosen):
    out = [f"{'task':<10}{'family':<8}{'init':<9}{'lr':>8}{'KL (bits)':>11}{'score':>8}  flat"]
    for r in rows:
        head = f"{r['task']:<10}{r['family']:<8}{r['init']:<9}{r['lr']:>8g}"
        if "kl" not in r:
            out.append(f"{head}  {'sits out' if 'sits_out' in r else 'failed'}: {r.get('sits_out') or r.get('failed')}")
            continue
        c = chosen.get((r["family"], r["task"]), {})
        pick = ("  <- chosen" + (" (the grid's edge)" if c["edge"] else "")
                if (c.get("lr"), c.get("init")) == (r["lr"], r["init"]) else "")
        out.append(f"{head}{r['kl']:>11.4g}{r['score']:>8.3f}  {'yes' if r['flat'] else 'no'}{pick}")
    return out


def flat(log_csv):
    """Whether a run's training loss had flattened (FLAT) by its end, from its log.csv: the mean excess loss
    (loss_bits - bayes_loss_bits) over the last tenth of the steps against the tenth before moved (down, or up:
    a rising loss is not flat) by less than the largest of FLAT[0] bits, FLAT[1] x the earlier mean, and
    twice the standard error of the difference (the per-step noise). A long plateau is flat too: only a run
    of more steps tells it from the end (--confirm's 4x run)."""
    import numpy as np
    d = np.genfromtxt(log_csv, delimiter=",", names=True)
    excess = np.atleast_1d(d["loss_bits"] - d["bayes_loss_bits"])
    n = len(excess) // 10
    if n < 2:
        return False
    before, last = excess[-2 * n:-n], excess[-n:]
    se = np.sqrt(before.var(ddof=1) / n + last.var(ddof=1) / n)
    return bool(abs(before.mean() - last.mean()) < max(FLAT[0], FLAT[1] * before.mean(), 2 * se))


# ----------------------------------------------------------------------------
# running them

def run(preset="default", out=os.path.join("runs", "matrix"), seeds=None, jobs=2, log=print, todo=None):
    """Train every cell (default: the preset's matrix; todo: a sweep's) not yet finished, `jobs` at a time, one
    progress line per cell. -> {name: metrics}; a cell whose family cannot be sized to the count sits out:
    {name: {"sits_out": train.py's one line}}."""
    todo = cells(preset, seeds) if todo is None else todo
    sizes = {t: transformer_size(t, preset) for t in {c["task"] for c in todo}} if preset != "quick" else {}
    os.makedirs(out, exist_ok=True)
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # where train.py is
    results, running, start, walls = {}, [], time.time(), []
    queue = []
    for c in todo:                                 # every cell read before any trains (drivers.Refused: one line)
        m = finished(os.path.join(out, c["name"]), c, preset)
        if m is None:
            queue.append(c)
            unreadable = drivers.read_metrics(os.path.join(out, c["name"]))[1]
            if unreadable:
                log(f"{c['name']}: {unreadable}: trained again")
        else:
            results[c["name"]] = m
    drivers.note(out, cells=[c["name"] for c in todo])
    log(f"matrix ({preset}): {len(todo)} cells, {len(results)} finished before, {len(queue)} to train, {jobs} at a "
        f"time, one Numba thread each, into {out}")
    try:
        while queue or running:
            while queue and len(running) < jobs:
                c = queue.pop(0)
                run_dir = os.path.join(out, c["name"])
                logf = open(run_dir + ".log", "a")
                offset = logf.tell()
                p = subprocess.Popen(argv(c, preset, run_dir, sizes.get(c["task"])), cwd=root, env=env,
                                     stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)     # Ctrl-C reaches the cells once, from here
                running.append((c, p, logf, time.time(), offset))
            time.sleep(0.2)
            for item in [r for r in running if r[1].poll() is not None]:
                c, p, logf, t0, offset = item
                running.remove(item)
                logf.close()
                run_dir = os.path.join(out, c["name"])
                reason = sits_out(run_dir + ".log", p.returncode, offset)
                m = finished(run_dir, c, preset) if p.returncode == 0 else None
                if reason or m is None:                          # recorded, so a rerun does not repeat it
                    kind = "sits_out" if reason else "failed"
                    reason = reason or f"exit code {p.returncode}, see {run_dir}.log"
                    with open(f"{run_dir}.{kind}", "w") as f:
                        f.write(reason + "\n")
                    results[c["name"]] = {kind: reason}
                    log(f"{c['name']}: {kind.replace('_', ' ')}: {reason}")
                    continue
                results[c["name"]] = m
                walls.append(time.time() - t0)
                done = sum(1 for x in todo if x["name"] in results)
                left = (len(queue) + len(running)) * (sum(walls) / len(walls)) / jobs
                log(f"[{done}/{len(todo)}] {c['name']}: KL {m['kl_bits']:.4g} bits, score {shown(score(m))}, "
                    f"{walls[-1]:.0f} s; {time.time() - start:.0f} s so far, about {left:.0f} s left for the matrix")
    except KeyboardInterrupt:
        for c, p, logf, _, _ in running:
            p.terminate()                                          # one SIGTERM: the cell saves its checkpoint
            p.wait()
            logf.close()
        log("interrupted: run the same command again to continue (finished cells are kept, the others resume)")
        raise SystemExit(130)
    return results


def shown(s):
    """A score to three decimals, cut rather than rounded, so that the digits never cross a mark's threshold
    (0.9496 shows as 0.949, not 0.950)."""
    return f"{math.floor(s * 1000) / 1000:.3f}"


X4_RULE = """The run of 4x the steps (--confirm; seed 0), for every cell whose training loss still falls over the
last tenth of its steps in any seed (flat), whatever its mark or the authors' figure; written before any 4x run
finished: it does not change the verdict, which is the matched budget's (the seeds' marks). It answers whether
the budget was the limit: "budget-limited" where its mark is better than the verdict's mark (or than every
seed's, for a split), "not the budget" where it is the same or worse, and its agreement with the authors is
reported apart (agreement_4x)."""


def budget_reading(cell_verdict, mark_4x):
    """X4_RULE: the verdict (the seeds') and the 4x run's mark -> "budget-limited" or "not the budget"."""
    rank = {m: i for i, m in enumerate(MARKS)}                     # ✓ 0, ~ 1, ✗ 2: lower is better
    m = cell_mark(cell_verdict)
    seeds = [x for x in MARKS if x in cell_verdict[cell_verdict.find("("):]] if m is None else [m]
    return "budget-limited" if all(rank[mark_4x] < rank[x] for x in seeds) else "not the budget"


def longer_runs(results, out, preset, seeds=None):
    """--confirm's runs of 4x the task's steps (seed 0; X4_RULE): one for every cell, depth rows too, whose
    training loss is not flat at the end of any of its seeds' runs (flat, on each run's log.csv). Which cells
    they are depends on the losses alone, not on the marks or the authors' figure."""
    groups = {}
    for c in cells(preset, seeds):
        m = results.get(c["name"])
        if m is not None and "sits_out" not in m and "failed" not in m:
            groups.setdefault((c["task"], c["family"], c["layers"]), []).append(c)
    todo = []
    for (task, family, layers), ran in groups.items():
        if all(flat(os.path.join(out, c["name"], "log.csv")) for c in ran):
            continue
        tag = f"-L{layers}" if layers else ""
        steps = 4 * tasks.task(task).PRESETS[preset]["steps"]
        todo.append(dict(task=task, family=family, layers=layers, seed=0, x4=True, flags=["--steps", str(steps)],
                         name=f"{task}-{family}{tag}-4x-s0"))
    return todo


def table(results, preset, seeds=None, extra=(), floors=None, memory=None):
    """-> rows: dict(task, family, layers, kl, score (against uniform), closed (against the floor), floor,
    verdict, authors, memory (its task's reading, or absent)), kl, score and closed per seed; extra: the 4x
    runs' cells (reported apart, as kl_4x, score_4x, closed_4x); floors: {task: its shortcut's score}
    (floor_score), which the marks are read against; memory: {task: memory_steps}, the tasks whose seeds get an
    effective memory."""
    rows, floors, memory = {}, floors or {}, memory or {}
    for c in [*cells(preset, seeds), *extra]:
        m = results.get(c["name"])
        if m is None:
            continue
        key = (c["task"], c["family"], c["layers"])
        if c.get("x4"):
            if key in rows and "sits_out" not in m and "failed" not in m:
                rows[key].update(score_4x=score(m), kl_4x=m["kl_bits"])
            continue
        if "sits_out" in m or "failed" in m:
            kind = "sits_out" if "sits_out" in m else "failed"
            rows[key] = {**dict(task=c["task"], family=c["family"], layers=c["layers"], params=0, steps=0, kl=[],
                                score=[]), kind: m[kind]}
            continue
        r = rows.setdefault(key, dict(task=c["task"], family=c["family"], layers=c["layers"], params=m["params"],
                                      steps=m["steps"], kl=[], score=[]))
        r["kl"].append(m["kl_bits"])
        r["score"].append(score(m))
    for r in rows.values():
        r["floor"] = floors.get(r["task"])
        if "sits_out" in r or "failed" in r:
            r.update(verdict="sits out" if "sits_out" in r else "failed", authors=None, agreement=None)
            continue
        r["closed"] = [closed(s, r["floor"]) for s in r["score"]]
        r["verdict"] = verdict(r["score"], r["floor"])
        r["authors"] = None if r["layers"] else AUTHORS.get(r["family"], {}).get(PRIMITIVE[r["task"]])
        r["agreement"] = None if r["layers"] else against_authors(r["family"], r["task"], r["verdict"])
        steps = memory.get(r["task"])
        if steps is not None:
            read = [effective_memory(r["task"], kl, steps) for kl in r["kl"]]
            r["memory"], r["memory_where"] = [k for k, _ in read], [w for _, w in read]
        if "score_4x" in r:                              # the budget's question, apart from the verdict (X4_RULE)
            r["closed_4x"] = closed(r["score_4x"], r["floor"])
            r["mark_4x"] = mark(r["score_4x"], r["floor"])
            r["budget"] = budget_reading(r["verdict"], r["mark_4x"])
            r["agreement_4x"] = None if r["authors"] is None else "agrees" if r["mark_4x"] == r["authors"] else "disagrees"
            if steps is not None:
                r["memory_4x"] = effective_memory(r["task"], r["kl_4x"], steps)[0]
    return list(rows.values())


def learning_curves(results, out, preset, seeds=None, points=60):
    """{task: {family label: (sequences seen, KL estimate)}} from each finished cell's log.csv (the first seed):
    the training loss above the exact posterior's on the same batch, whose expectation is KL(posterior ||
    model) on sampled targets and which is that KL on soft ones, averaged over `points` windows."""
    import numpy as np
    curves = {}
    for c in cells(preset, seeds):
        m = results.get(c["name"])
        if m is None or "sits_out" in m or c["seed"] != (seeds or PRESETS[preset]["seeds"])[0]:
            continue
        d = np.genfromtxt(os.path.join(out, c["name"], "log.csv"), delimiter=",", names=True)
        w = max(1, len(d) // points)
        n = len(d) // w * w
        excess = (d["loss_bits"] - d["bayes_loss_bits"])[:n].reshape(-1, w).mean(1)
        seen = d["step"][:n].reshape(-1, w)[:, -1] * m["batch"]
        label = plots.row_label(c["family"], c["layers"])
        curves.setdefault(c["task"], {})[label] = (seen.tolist(), excess.tolist())
    return curves


def sweep_table(results, cells_, out):
    """A sweep's rows: dict(family, point, params, kl, score, flat, state_floats) per cell, or sits_out/failed."""
    rows = []
    for c in cells_:
        mm = results.get(c["name"])
        if mm is None:
            continue
        row = dict(family=c["family"], point=c["point"], seed=c["seed"])
        if "sits_out" in mm or "failed" in mm:
            rows.append({**row, **mm})
            continue
        cfg = models.config_from_dict(c["family"], mm["config"])
        acc = mm.get("groups", {}).get("stored", {}).get("accuracy")
        rows.append({**row, "params": mm["params"], "steps": mm["steps"], "kl": mm["kl_bits"], "score": score(mm),
                     "stored_accuracy": acc, "pairs": mm["settings"]["pairs"],
                     "answered": None if acc is None else pairs_answered(acc, mm["settings"]["pairs"]),
                     "flat": flat(os.path.join(out, c["name"], "log.csv")),
                     "state_floats": models.state_floats(c["family"], cfg, mm["config"]["max_len"])})
    return rows


def pairs_answered(stored_accuracy, pairs):
    """The stored pairs a model answers, as if each were asked once: its accuracy on stored keys x the pairs.
    An expected count, not the distinct pairs held. A model that binds them all answers every pair; the
    shortcut without binding (the commonest stored value, not its key's) a few, more as values repeat
    (sweep_shortcuts: about 1.2 of 4 and 5.9 of 64 at 32 values)."""
    return stored_accuracy * pairs


def sweep_shortcuts(cells_, seqs=FLOOR_SEQS):
    """The stored pairs recall's shortcut answers at each point of a sweep (the stored values without their
    keys: what a model that binds nothing can do): {point: pairs_answered}."""
    from harness import flags
    out = {}
    for c in cells_:
        if c["point"] not in out:
            m = shortcut_metrics(c["task"], "default", c["flags"], seqs)
            pairs = flags.parse_args(["--task", c["task"], *c["flags"]]).settings["pairs"]
            out[c["point"]] = pairs_answered(m["groups"]["stored"]["accuracy"], pairs)
    return out


def sweep_lines(rows):
    head = (f"{'family':<12}{'point':<10}{'params':>9}{'steps':>7}{'KL (bits)':>11}{'score':>8}{'stored acc.':>12}"
            f"{'answered':>12}  {'state':>9}  flat")
    out = [head, "-" * len(head)]
    for r in rows:
        if "sits_out" in r or "failed" in r:
            out.append(f"{r['family']:<12}{r['point']:<10}  {'sits out' if 'sits_out' in r else 'failed'}: "
                       f"{r.get('sits_out') or r.get('failed')}")
            continue
        acc = "" if r["stored_accuracy"] is None else f"{r['stored_accuracy']:.3f}"
        answered = "" if r.get("answered") is None else f"{r['answered']:.1f} of {r['pairs']}"
        out.append(f"{r['family']:<12}{r['point']:<10}{r['params']:>9,}{r['steps']:>7}{r['kl']:>11.4g}{r['score']:>8.3f}"
                   f"{acc:>12}{answered:>12}  {r['state_floats'] if r['state_floats'] is not None else 'n/a':>9}  "
                   f"{'yes' if r['flat'] else 'no (unconverged)'}")
    return out


def memory_text(r):
    """A row's effective memory, seed by seed ("k 2.31 / 2.05", a bound as "< 0" or ">= 16"), or ""."""
    if "memory" not in r:
        return ""
    one = lambda k, w: "< 0" if w == "below" else f">= {k:g}" if w == "above" else f"{k:.2f}"
    return "k " + " / ".join(one(k, w) for k, w in zip(r["memory"], r["memory_where"]))


def lines(rows):
    head = (f"{'task':<10}{'family':<22}{'params':>9}{'steps':>8}  {'KL (bits), per seed':<24}{'vs uniform':<22}"
            f"{'vs shortcut':<24}{'mark':<14}{'authors':<18}memory")
    out = [head, "-" * len(head)]
    for r in rows:
        fam = plots.row_label(r["family"], r["layers"])
        if "sits_out" in r or "failed" in r:
            out.append(f"{r['task']:<10}{fam:<22}  {r['verdict']}: {r.get('sits_out') or r.get('failed')}")
            continue
        x4 = (f"; 4x the steps: {shown(r['score_4x'])} vs uniform, {shown(r['closed_4x'])} vs the shortcut, "
              f"{r['mark_4x']} ({r['budget']})" + (f", k {r['memory_4x']:.2f}" if "memory_4x" in r else "")
              if "score_4x" in r else "")
        authors = "" if r["authors"] is None else r["authors"] + " (" + r["agreement"] + ")"
        out.append(f"{r['task']:<10}{fam:<22}{r['params']:>9,}{r['steps']:>8}  "
                   f"{' / '.join(f'{k:.3g}' for k in r['kl']):<24}{' / '.join(shown(s) for s in r['score']):<22}"
                   f"{' / '.join(shown(s) for s in r['closed']):<24}{r['verdict']:<14}{authors:<18}{memory_text(r)}{x4}")
    return out


COMMAND = "python -m primitives.matrix"


def main(argv_=None):
    p = drivers.parser(COMMAND, __doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="default")
    p.add_argument("--out", default=None, help="the cells' directory (default runs/matrix[-quick])")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the preset's (quick 0; default 0 1; "
                   "with --confirm 0 1 2)")
    p.add_argument("--jobs", type=int, default=2, help="cells at a time (default 2, one per core)")
    p.add_argument("--figures", default="figures", help="where primitives.png goes (default figures)")
    p.add_argument("--confirm", action="store_true", help="every cell alike: three seeds (0, 1, 2), and a run of 4x "
                   "the steps for every cell whose loss still falls at the end of any seed's run")
    p.add_argument("--sweep", choices=("capacity", "filler", "rates"), help="instead of the matrix: the recall sweep "
                   "over the stored pairs (4 to 64) or the filler (0 to 128), every family at the transformer's count; "
                   "or the recurrent families' rate sweep (rates: 4 rates x 2 initialisations on recall, hops, "
                   "transport and the HMM, seed 9)")
    p.add_argument("--overwrite", action="store_true", help="where --out was made with other settings (another "
                   "preset or sweep), remove what this command wrote there and start again")
    a = p.parse_args(argv_)
    drivers.check(p, drivers.jobs(a.jobs), drivers.seeds(a.seeds), drivers.directory(a.out, "--out"),
                  drivers.directory(a.figures, "--figures"))
    if a.sweep == "rates" and a.seeds and len(a.seeds) != 1:
        p.error(f"--seeds {' '.join(map(str, a.seeds))}: --sweep rates takes one seed (default {RATE_SEED}, which no "
                f"verdict uses)")
    out = a.out or os.path.join("runs", f"sweep-{a.sweep}" if a.sweep else "matrix" + ("-quick" if a.preset == "quick"
                                                                                        else ""))
    try:
        drivers.take(out, COMMAND, dict(preset="default" if a.sweep else a.preset, sweep=a.sweep), a.overwrite)
    except drivers.Refused as e:
        p.error(str(e))
    try:
        results = drive(a, out)
    except drivers.Refused as e:
        p.error(str(e))
    finally:
        runs.release(out)
    failed = sorted(name for name, m in results.items() if "failed" in m)
    if failed:
        print(f"{len(failed)} cell(s) failed, left out of the tables above: {', '.join(failed)} (their logs: "
              f"{os.path.join(out, failed[0])}.log, ...; delete a cell's .failed marker to train it again)")
        raise SystemExit(1)


def drive(a, out):
    """The matrix or a sweep, in a directory taken (main) -> every cell's result."""
    if a.sweep == "rates":
        todo = rate_cells(*(a.seeds or ()))
        results = run("default", out, jobs=a.jobs, todo=todo)
        rows = rate_rows(results, todo, out)
        chosen = choose_rates(rows)
        drivers.note(out, summaries=["sweep-rates.json"])
        write_json(os.path.join(out, "sweep-rates.json"), dict(
            rates=RATES, seed=todo[0]["seed"], rows=rows, chosen=[dict(family=k[0], task=k[1], lr=r["lr"], init=r["init"],
                                                                     kl=r["kl"], edge=r["edge"]) for k, r in chosen.items()]))
        print("\n".join(rate_lines(rows, chosen)))
        return results
    if a.sweep:
        todo = sweep_cells(a.sweep, tuple(a.seeds or (FILLER_SEEDS if a.sweep == "filler" else (0,))))
        results = run("default", out, jobs=a.jobs, todo=todo)
        rows = sweep_table(results, todo, out)
        shortcut = sweep_shortcuts(todo)
        drivers.note(out, summaries=[f"sweep-{a.sweep}.json"])
        write_json(os.path.join(out, f"sweep-{a.sweep}.json"),
                   dict(sweep=a.sweep, flat=FLAT, rows=rows, shortcut_answered=shortcut))
        print("\n".join(sweep_lines(rows)))
        print("the shortcut (the stored values without their keys) answers " + ", ".join(
            f"{p} {n:.1f}" for p, n in shortcut.items()) + f" stored pairs ({FLOOR_SEQS:,} held-out sequences)")
        os.makedirs(a.figures, exist_ok=True)
        print(plots.plot_sweep(rows, os.path.join(a.figures, f"recall-{a.sweep}.png"), a.sweep, shortcut))
        return results
    seeds = a.seeds or (CONFIRM_SEEDS if a.confirm else None)
    results = run(a.preset, out, seeds, a.jobs)
    floor = floors(a.preset)
    memory = {t: m for t in PRIMITIVE if (m := memory_steps(t, a.preset)) is not None}
    extra = longer_runs(results, out, a.preset, seeds) if a.confirm else []
    if extra:                                          # 4x the steps where a loss still falls
        results.update(run(a.preset, out, seeds, a.jobs, todo=extra))
    rows = table(results, a.preset, seeds, extra, floor, memory)
    print("the shortcuts' scores (the best without each task's primitive; the marks read the share of its gap "
          "closed): " + ", ".join(f"{t} {'uniform, 0' if f is None else shown(f)}" for t, f in floor.items()))
    for t, steps in memory.items():
        print(f"{t}: the window filters' KL (bits) by the observations they remember, k "
              + ", ".join(f"{k}: {kl:.4f}" for k, kl in steps.items()))
    drivers.note(out, summaries=["matrix.json"])
    write_json(os.path.join(out, "matrix.json"), dict(preset=a.preset, seeds=seeds, thresholds=dict(good=GOOD, partial=PARTIAL),
                                                      floors=floor, memory_steps=memory, primitive=PRIMITIVE, rows=rows))
    print("\n".join(lines(rows)))
    os.makedirs(a.figures, exist_ok=True)
    quick = "-quick" if a.preset == "quick" else ""
    path = plots.plot_primitives(rows, os.path.join(a.figures, f"primitives{quick}.png"), GOOD, PARTIAL, PRIMITIVE,
                                 floor, {t: transformer_size(t, a.preset)[2] for t in PRIMITIVE})
    curves = plots.plot_learning_curves(learning_curves(results, out, a.preset, seeds),
                                        path.replace(".png", "-curves.png"))
    drawn = [plots.plot_memory(steps, [r for r in rows if r["task"] == t and "memory" in r],
                               os.path.join(a.figures, f"memory-{t}{quick}.png"), t) for t, steps in memory.items()]
    print(f"{os.path.join(out, 'matrix.json')}; figures {', '.join([path, curves, *drawn])}")
    return results


if __name__ == "__main__":
    main()
