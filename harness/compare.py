"""compare: the figures that put finished runs side by side, read from their metrics.json (nothing retrains).

    python -m harness.compare calibration RUN [RUN ...] --out figures/NAME.png [--labels A B ...]
        each run's entropy by answer index against the exact posterior (Paper I's calibration figure, with
        the families or the MLP beside the transformer); the runs must be of one task and one setting
    python -m harness.compare variants RUN [RUN ...] --out figures/NAME.png [--labels A B ...]
        each run's KL by answer index on each of its task's held-out variants (the HMM at K = 20, 30, 50:
        Paper I's length-generalisation figure), one colour per run, one line style per variant

A RUN is a run directory (its metrics.json) or a metrics file itself (a baseline's metrics_mlp.json). The
label of a run is its model's name unless --labels gives them.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("harness/compare.py: run it as python -m harness.compare, from the repository's folder")

import json
import os

from harness import drivers, plots
from tunnels import tasks


def load(path):
    """A run directory or a metrics file -> its metrics (drivers.read_metrics); ValueError in one line if
    neither, or if it lacks the answers by index a figure reads."""
    file = os.path.join(path, "metrics.json") if os.path.isdir(path) else path
    m, problem = drivers.read_metrics_file(file)
    if m is None:
        raise ValueError(problem or f"{path!r}: no metrics.json to read")
    if "per_position" not in m:
        raise ValueError(f"{file} has no answers by index (per_position): a run's metrics.json from train.py has them")
    return m


def labelled(paths, labels=None):
    """-> {label: metrics}, in the order given; ValueError if the runs differ in task or settings (their
    answers would not line up) or the labels do not match the runs."""
    runs = [load(p) for p in paths]
    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs: give one per run")
    keys = [(m["task"], json.dumps(m.get("settings"), sort_keys=True), len(m["per_position"])) for m in runs]
    if any(k != keys[0] for k in keys):
        raise ValueError(f"the runs differ in task, settings or answers ({keys[0][0]} against "
                         f"{next(k for k in keys if k != keys[0])[0]}): only runs of one task and setting line up")
    names = labels or [m["model"] for m in runs]
    if len(set(names)) < len(names):
        names = [f"{n} ({os.path.basename(os.path.normpath(p))})" for n, p in zip(names, paths)]
    return dict(zip(names, runs))


def main(argv=None):
    p = drivers.parser("python -m harness.compare", __doc__.split("\n\n")[0])
    p.add_argument("figure", choices=("calibration", "variants"))
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", required=True, help="the figure's file (.png, .pdf, .svg, ...)")
    p.add_argument("--labels", nargs="+")
    a = p.parse_args(argv)
    drivers.check(p, drivers.figure_file(a.out, "--out"))
    try:
        results = labelled(a.runs, a.labels)
    except ValueError as e:
        p.error(str(e))
    task = next(iter(results.values()))["task"]
    mod = tasks.task(task)
    label = getattr(mod, "ANSWER_LABEL", "answer index i")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    if a.figure == "calibration":
        path = plots.plot_calibration(results, task, label, a.out)
    else:
        key = getattr(mod, "VARIANTS", None)
        lacking = [n for n, m in results.items() if not key or key + "_curves" not in m]
        if lacking:
            p.error(f"{lacking[0]} has no held-out variants ({task} names none, or the run predates them)")
        path = plots.plot_variants_across({n: plots.variant_curves(m, key) for n, m in results.items()}, a.out,
                                          getattr(mod, "VARIANT_FORMAT", "{}"), label,
                                          getattr(mod, "VARIANT_TITLE", f"{task}: held-out variants"))
    print(path)
    return path


if __name__ == "__main__":
    main()
