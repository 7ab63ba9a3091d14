"""flags: train.py's command line, each flag once in one table (FLAGS), each value checked once, and the model
configurations the flags build (the --model family's, the baseline's capacity-matched to it).

parse_args(argv) -> args (bad input: one line on stderr and exit code 2, before anything is written);
model_config(args, sizes, name) -> the family's Config; baseline_config(name, main_cfg, params). train.py runs
what they describe; primitives/matrix.py reads the sizes a run would get.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # see layers.py: BLAS threads fight Numba's

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import numba  # noqa: E402

import models  # noqa: E402
from harness import runs  # noqa: E402
from tunnels import tasks  # noqa: E402

EVAL_SEQS = 2000        # held-out sequences for evaluation
MIN_EVAL_SEQS = 4       # the single-sequence figure draws four
WEIGHT_DECAY = 0.01     # AdamW's decoupled weight decay, unless the preset says otherwise
LR_FLOOR = 0.1          # the cosine ends at lr * lr_floor, unless the preset says otherwise
OPTIMIZER = ("lr", "lr_floor", "warmup", "weight_decay")   # metrics.json records them; matrix.finished checks them
STICKY = "sticky"       # Paper II's chain: continuous inputs, outside tasks.TASKS; its experiments below
EXPERIMENTS = {"one-head": "SGD on one chain against exact Bayes", "compare-em": "SGD, EM-like and a true M-step, "
               "5 seeds", "deep": "the authors' deep variant, 5 seeds"}


PROG = "train.py"       # the command whose line an error names (python -m dynamics.run sets its own)


def fail(msg):
    """One clear line on stderr, exit code 2, no traceback."""
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ----------------------------------------------------------------------------
# the flags, each once. A row: the flag, what it sets (an args attribute; for a model's size, the
# Config field it fills), its type, its default, a check (value, args) -> what is wrong or None, where
# it applies (contexts: a token task's name, or "sticky:<experiment>"; None: everywhere), whether a
# preset sets it, and whether it is part of a run's identity (checked on --resume; "legacy": the value
# of a checkpoint written before the flag existed), and whether it applies with --eval-only (evaluate).
# A model-size flag applies to the families whose Config has its field. The tasks' own flags (--V, --K,
# --curriculum) come from their modules.

TOKEN = tuple(tasks.TASKS)
SOME = [f"{STICKY}:{e}" for e in EXPERIMENTS]
positive = lambda v, a: None if v >= 1 else "must be a positive integer"
a_name = lambda v, a: runs.name_problem(v)      # a path: not empty, printable, UTF-8
FLAGS = [
    dict(flag="--task", type=str, default="bijection", choices=lambda a: [*TOKEN, STICKY],
         help="wind tunnel: " + " | ".join(TOKEN) + "; Paper II's sticky chain runs with python -m dynamics.run",
         run=True),
    dict(flag="--model", type=str, default="transformer", choices=lambda a: list(models.FAMILIES), where=TOKEN,
         help="model family (models.FAMILIES): " + " | ".join(models.FAMILIES), run=True),
    dict(flag="--baseline", type=str, default="mlp", choices=lambda a: list(models.FAMILIES), where=TOKEN,
         help="the family trained after the model, capacity-matched to it (default mlp, the authors' MLP)"),
    dict(flag="--no-baseline", type=bool, where=TOKEN, help="do not train a baseline after the model"),
    dict(flag="--baseline-steps", type=int, check=positive, where=TOKEN, preset=True, run=True, legacy="any",
         help="the baseline's training steps (default: from the preset, else --steps)"),
    dict(flag="--preset", type=str, default="default", choices=lambda a: presets_of(a), where=(*TOKEN, "sticky:compare-em"),
         help="the token tasks: quick | default | paper, and first for the sawtooth; python -m dynamics.run --compare-em: "
         "default | quick (toy size)"),
    dict(flag="--steps", type=int, check=positive, preset=True, run=True, help="training steps (default: from the preset)"),
    dict(flag="--batch", type=int, check=positive, where=TOKEN, preset=True, run=True, help="sequences per step"),
    dict(flag="--width", field="d_model", type=int, check=positive, where=TOKEN, preset=True,
         help="model width d_model"),
    dict(flag="--layers", field="n_layers", type=int, check=positive, where=TOKEN, preset=True,
         help="layers (the MLP: residual blocks)"),
    dict(flag="--params", type=int, check=positive, where=TOKEN, metavar="N", preset=True,
         help="size the model to N parameters (within 5%%; every parameter counts: embeddings, position tables "
              "and head): the width is found under the family's constraints, its other sizes as given"),
    dict(flag="--heads", field="n_heads", type=int, check=positive, where=TOKEN, preset=True,
         help="attention heads (must divide the width)"),
    dict(flag="--pos", field="pos", type=str, where=TOKEN, help="positions (the families that have them): the "
         "transformer learned (default) | sinusoidal; the LSTM none (default) | learned"),
    dict(flag="--init", field="init", type=str, where=TOKEN, preset=True,
         help="initialisation: one of the family's INITS (its module says each draw), for example fan-in "
         "(N(0, 1/fan_in) matrices)"),
    dict(flag="--dtype", field="dtype", type=str, where=TOKEN, help="float32 (the default) | float64"),
    dict(flag="--grow-from", type=str, check=a_name, where=TOKEN, run=True, legacy=None, metavar="CHECKPOINT",
         help="start from a trained shallower model of the same family, task and sizes: its blocks copied, the new "
              "blocks' output maps at zero, so it starts computing what that model computes (the depth "
              "experiment's growth control; the families that can: their module's grow)"),
    dict(flag="--lr", type=float, check=lambda v, a: None if math.isfinite(v) and v > 0 else "must be a finite number > 0",
         preset=True, run=True, help="peak learning rate (warm-up, then cosine to lr * lr-floor)"),
    dict(flag="--lr-floor", type=float, check=lambda v, a: None if 0.0 <= v <= 1.0 else "must lie in [0, 1] (a fraction "
         "of --lr)", where=TOKEN, preset=True, run=True, legacy=LR_FLOOR,
         help=f"final learning rate as a fraction of --lr (default {LR_FLOOR})"),
    dict(flag="--warmup", type=int, check=lambda v, a: None if v >= 0 else "must be a non-negative integer",
         where=TOKEN, preset=True, run=True, help="warm-up steps"),
    dict(flag="--weight-decay", type=float, check=lambda v, a: None if 0.0 <= v < 1.0 else "must lie in [0, 1)",
         where=TOKEN, preset=True, run=True, legacy=WEIGHT_DECAY,
         help=f"AdamW decoupled weight decay on the matrices (default {WEIGHT_DECAY} unless the preset says otherwise)"),
    dict(flag="--soft", type=bool, where=TOKEN, run=True,
         help="train on the exact posterior (soft targets) instead of sampled labels"),
    dict(flag="--threads", type=int, preset=True, run=True, legacy="any", evaluate=True,
         check=lambda v, a: None if 1 <= v <= numba.config.NUMBA_NUM_THREADS else
         f"must lie in 1..{numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS)",
         help="Numba threads (default: all cores, unless the preset says otherwise)"),
    dict(flag="--seed", type=int, default=0, where=(*TOKEN, "sticky:one-head"), run=True,
         check=lambda v, a: None if 0 <= v < 2 ** 63 else "must be an integer in 0..2^63-1",
         help="seed of the initialisation and the data stream (default 0; Paper II's comparisons use five seeds)"),
    dict(flag="--eval-seqs", type=int, default=EVAL_SEQS, where=TOKEN, run=True, legacy=EVAL_SEQS, evaluate=True,
         check=lambda v, a: None if v >= MIN_EVAL_SEQS else f"must be at least {MIN_EVAL_SEQS} (the single-sequence "
         "figure draws four)", help=f"held-out sequences for evaluation (default {EVAL_SEQS})"),
    dict(flag="--stop-after", type=int, check=positive, where=(*TOKEN, *SOME), metavar="N",
         help="stop after N steps with a checkpoint, as Ctrl-C would (continue with --resume); sticky --deep: the "
              "seed in progress stops at its step N; sticky --compare-em: after N of its runs"),
    dict(flag="--out", type=str, check=a_name, help="run directory (default runs/<task>-<model>-<preset>, then the task settings typed and a seed other than 0: "
              "runs/hmm-transformer-default-n_obs30-s1)"),
    dict(flag="--figures", type=str, check=a_name, where=TOKEN, evaluate=True, help="where the figures go (default: "
         "the run directory; --figures figures regenerates the ones the documents show)"),
    dict(flag="--kernels", type=str, default="numba", choices=lambda a: ["numba", "numpy"], evaluate=True,
         help="numba: the fast twins of kernels.py | numpy: the NumPy ops as written (slower; docs/USAGE.md says how close)"),
    dict(flag="--eval-only", type=str, check=a_name, where=TOKEN, metavar="CHECKPOINT", evaluate=True,
         help="evaluate a checkpoint, no training (its task, settings and seed from its meta)"),
    dict(flag="--resume", type=bool, where=(*TOKEN, *SOME), help="continue the run in --out from its "
         "checkpoint (also after Ctrl-C, SIGTERM or SIGHUP; sticky --deep: from its finished seeds and the one in "
         "progress; sticky --compare-em: from its finished runs)"),
    dict(flag="--overwrite", type=bool, help="replace the run already in --out (its checkpoint, metrics, logs, "
         "snapshots and figures; Paper II's: its JSON and figures) instead of refusing"),
    dict(flag="--no-geometry", type=bool, where=TOKEN, help="skip the geometry probes (geometry/run.py) after training"),
    dict(flag="--compare-em", type=bool, where=(STICKY,), help="sticky: SGD against the EM-like schedule and the true "
         "M-step over 5 seeds"),
    dict(flag="--deep", type=bool, where=(STICKY,), help="sticky: the authors' deep variant (4 pre-LN blocks, AdamW, "
         "a held-out chain), 5 seeds"),
    dict(flag="--chain", type=str, default="exact", choices=lambda a: ["exact", "authors"], where=SOME,
         help="sticky: exact (self-transition 0.3, the default) | authors (0.3498, as the authors' script builds it)"),
    dict(flag="--sigma", type=float, default=1.0, where=("sticky:one-head",),
         check=lambda v, a: "must be a finite number > 0" if not (math.isfinite(v) and v > 0) else None
         if 1e-6 <= v <= 1e6 else "must lie in 1e-06..1e+06 (the likelihoods divide by sigma^2; the one-head model "
         "trains in float32)",
         help="sticky: the input noise of the one-head run (default 1)"),
    dict(flag="--quiet", type=bool, where=TOKEN, evaluate=True, help="no progress bar"),
]


def flag_table():
    """FLAGS, the registered families' own flags and the registered tasks' own flags, as {flag: row}; a flag
    several tasks declare applies to each; a family's flag sets a field of its Config, and is refused for a
    --model whose Config lacks that field (several families may declare one field's flag, not one flag for
    two fields)."""
    table = {row["flag"]: dict(row) for row in FLAGS}
    for name in models.FAMILIES:
        for flag, spec in getattr(models.module(name), "FLAGS", {}).items():
            check = spec.get("check", positive if spec["type"] is int else None)   # else: the Config's own check
            row = table.setdefault(flag, dict(flag=flag, field=spec["field"], type=spec["type"], where=TOKEN,
                                              help=spec["help"], **({"check": check} if check else {})))
            if row.get("field") != spec["field"]:
                raise ValueError(f"{flag}: --model {name} declares it for its field {spec['field']!r}, another "
                                 f"family or the shared table for {row.get('field')!r}")
    for name in tasks.TASKS:
        for flag, spec in tasks.task(name).FLAGS.items():
            row = table.setdefault(flag, dict(flag=flag, dest=spec["setting"], type=spec["type"], setting=True,
                                              help=spec["help"], checks={}, where=(), run=True))
            if row["where"] and spec["help"] not in row["help"]:     # another task's use of the flag: its help too
                row["help"] += "; " + spec["help"]
            row["where"] = (*row["where"], name)
            row["checks"][name] = spec["check"]
    for row in table.values():
        row.setdefault("dest", row["flag"][2:].replace("-", "_"))
    return table


def presets_of(args):
    if args.task == STICKY:
        return ["default", "quick"]
    return list({**tasks.task(args.task).PRESETS, **family_presets(args.model, args.task)})


def family_presets(model, task):
    """A family's own presets for a task, over the task's (models.py: PRESETS)."""
    return getattr(models.module(model), "PRESETS", {}).get(task, {})


def context(args):
    """Where a run is: its token task's name, or sticky:<experiment>."""
    if args.task != STICKY:
        return args.task
    return f"{STICKY}:" + ("compare-em" if args.compare_em else "deep" if args.deep else "one-head")


def parse_args(argv=None):
    """The flags, checked once: one line and exit code 2 for anything wrong; -> args, with the presets, the
    task's settings (args.settings) and the defaults filled in."""
    table = flag_table()
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.error = fail
    for flag, row in table.items():
        if row["type"] is bool:
            p.add_argument(flag, dest=row["dest"], action="store_true", help=row["help"])
        else:
            p.add_argument(flag, dest=row["dest"], type=row["type"], metavar=row.get("metavar"), help=row["help"])
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)        # the command, for the run directory's lock
    typed = lambda row: getattr(args, row["dest"]) is True if row["type"] is bool else getattr(args, row["dest"]) is not None
    given = {flag for flag, row in table.items() if typed(row)}     # `--seed 0` is typed too (0 == False)
    for flag in ("--task", "--model", "--preset"):                    # what decides what the others mean
        if getattr(args, table[flag]["dest"]) is None:
            setattr(args, table[flag]["dest"], table[flag]["default"])
    if args.eval_only is not None:                                   # the checkpoint says the rest
        with_it = [f for f, row in table.items() if row.get("evaluate") and f != "--eval-only"]
        for flag in sorted(given, key=list(table).index):
            if not table[flag].get("evaluate"):
                fail(f"{flag} does not apply to --eval-only (the checkpoint's meta gives its run's task, settings and "
                     f"seed); with it go {', '.join(with_it)}")
    check_value(table["--task"], args)
    if args.compare_em and args.deep:
        fail("--compare-em and --deep are two experiments: run them one at a time")
    where = context(args)
    for flag in sorted(given, key=list(table).index):                 # a flag typed where it does not apply
        places = table[flag].get("where")
        if places is not None and where not in places and args.task not in places:
            fail(f"{flag} does not apply to {describe(where)} (it belongs to {' and '.join(map(describe, places))})")
    if args.task == STICKY:
        fill_defaults(table, args, {}, where)
        for flag in given:
            check_value(table[flag], args)
        check_relations(args, given)
        args.out = args.out or os.path.join("runs", {"one-head": "sticky-one-head", "compare-em": "dynamics",
                                                     "deep": "deep-variant"}[where.split(":")[1]]
                                            + ("-quick" if args.preset == "quick" else "")
                                            + ("-authors-chain" if args.chain == "authors" else ""))
        return args
    check_value(table["--model"], args)
    check_value(table["--preset"], args)
    fields = models.config_fields(args.model)
    for flag in sorted(given, key=list(table).index):                 # a size the model's family does not have
        field = table[flag].get("field")
        if field is not None and field not in fields:
            fail(f"{flag} does not apply to --model {args.model} (its Config has no {field})")
    preset = {**tasks.task(args.task).PRESETS.get(args.preset, {}),          # the task's optimisation and data,
              **family_presets(args.model, args.task).get(args.preset, {})}   # the family's sizes (its defaults else)
    if "--width" in given:                                                    # a typed width over a preset's count
        preset.pop("params", None)
    fill_defaults(table, args, preset, where)
    for flag, row in table.items():
        if getattr(args, row["dest"]) is not None and (flag in given or row.get("preset") or row.get("setting")):
            check_value(row, args, related=flag in given)
    check_relations(args, given)
    args.settings = tasks.settings(args.task, {row["dest"]: getattr(args, row["dest"])
                                               for row in table.values() if row.get("setting")})
    args.eval_seqs_given = "--eval-seqs" in given
    args.given = given
    args.out = args.out or default_out(args, [row for flag, row in table.items() if flag in given and row.get("setting")])
    return args


def default_out(args, typed):
    """runs/<task>-<model>-<preset>, then each task setting typed on the command line (typed: its flag table
    rows) as -<setting><value>, then -s<seed> for a seed other than 0: so the cells of a sweep over settings
    or seeds never share a directory (a value's characters outside letters, digits, '.' and '_' become '-')."""
    parts = [f"{args.task}-{args.model}-{args.preset}"]
    parts += [row["dest"] + re.sub(r"[^A-Za-z0-9._]", "-", str(getattr(args, row["dest"]))) for row in typed]
    parts += [f"s{args.seed}"] if args.seed else []
    return os.path.join("runs", "-".join(parts))


def check_relations(args, given):
    """The values that pass their own checks but not together: a baseline flag without a baseline, the model
    as its own baseline, a warm-up longer than the run, a stop after its last step."""
    if args.task == STICKY:                     # Paper II's relations are its command's (dynamics/run.py)
        return
    if args.no_baseline and given & {"--baseline", "--baseline-steps"}:
        fail(f"{min(given & {'--baseline', '--baseline-steps'})} and --no-baseline: there is no baseline to set")
    if "--baseline" in given and args.baseline == args.model:
        fail(f"--baseline {args.baseline}: it is the --model itself; give another family, or --no-baseline")
    if {"--params", "--width"} <= given:
        fail(f"--params {args.params} and --width {args.width}: --params finds the width; give one of them")
    if "--warmup" in given and args.warmup > args.steps:
        fail(f"--warmup {args.warmup}: longer than the run (--steps {args.steps}); allowed are 0..{args.steps}")
    last = max(args.steps, 0 if args.no_baseline or args.baseline == args.model else args.baseline_steps or 0)
    if args.stop_after is not None and args.stop_after >= last:
        fail(f"--stop-after {args.stop_after}: the run ends at step {last} anyway; give a step before it, or leave "
             f"--stop-after out")


def describe(where):
    if where == STICKY:                                   # Paper II's experiments: their own command
        return "python -m dynamics.run"
    if ":" not in where:
        return f"--task {where}"
    return "python -m dynamics.run " + ("(the one-head run)" if where.endswith("one-head") else "--" + where.split(":")[1])


def fill_defaults(table, args, preset, where):
    """Unset flags take the preset's value, then the row's default; the task's settings their SETTINGS'."""
    for flag, row in table.items():
        dest = row["dest"]
        if getattr(args, dest) is None and dest in preset:
            setattr(args, dest, preset[dest])
        if getattr(args, dest) is None and "default" in row:
            setattr(args, dest, row["default"])
    args.lr_floor = LR_FLOOR if args.lr_floor is None else args.lr_floor
    args.weight_decay = WEIGHT_DECAY if args.weight_decay is None else args.weight_decay
    args.threads = numba.config.NUMBA_NUM_THREADS if args.threads is None else args.threads
    if args.task != STICKY:
        for name, default in tasks.task(args.task).SETTINGS.items():
            if getattr(args, name, None) is None:
                setattr(args, name, default)


def check_value(row, args, related=True):
    """One line and exit 2 if the flag's value is not allowed. A task's setting sees the run's --steps only
    where the user typed it (related; its check sees "typed"): a preset's curriculum outlasting a short --steps,
    or asking more hops than a typed --max-hops, is the preset's (its stages are clipped)."""
    value = getattr(args, row["dest"])
    if value is None or row["type"] is bool:
        return
    shown = repr(value) if row["type"] is str else value
    if "choices" in row and value not in row["choices"](args):
        fail(f"{row['flag']} {shown}: allowed are {', '.join(row['choices'](args))}")
    checks = [row["check"]] if "check" in row else [c for t, c in row.get("checks", {}).items() if t == args.task]
    for check in checks:
        problem = check(value, {**vars(args), "steps": args.steps if related else None, "typed": related}) \
            if row.get("setting") \
            else check(value, args)
        if problem:
            fail(f"{row['flag']} {shown}: {problem}")


# ----------------------------------------------------------------------------
# models of a run: the --model family from the flags, the baseline capacity-matched to it

def model_config(args, sizes, name):
    """The family's Config from the task's sizes and the flags its Config declares; one line if invalid.
    Learned positions cover the longest evaluated length; with a longer evaluation than training, a family
    with pos_limit reuses its last trained row past the training length."""
    fields = models.config_fields(name)
    table = flag_table()
    values = dict(vocab_size=sizes["vocab"], n_classes=sizes["classes"], max_len=sizes["eval_len"])
    values.update({row["field"]: getattr(args, row["dest"]) for row in table.values()
                   if row.get("field") in fields and getattr(args, row["dest"]) is not None})
    values = {k: v for k, v in values.items() if k in fields}
    try:
        if getattr(args, "params", None) is not None:               # the width from the parameter count
            if "d_model" not in fields:
                fail(f"--params {args.params}: --model {name} has no width to size (its Config has no d_model)")
            cfg = models.match_capacity(name, {k: v for k, v in values.items() if k != "d_model"}, args.params)
        else:
            cfg = models.make_config(name, **values)
    except models.CapacityError as e:                              # no width gives the count: say so
        fail(f"--params {args.params}: {e}")
    except (TypeError, ValueError) as e:                            # a field's own error, in the flags' words
        fail(in_flags(str(e), table, name))
    return fit_positions(cfg, sizes)


def in_flags(message, table, name):
    """A Config's error ("n_heads=3 does not divide d_model=64: allowed are ...") in the words of the flags that
    set those fields ("--heads 3 does not divide --width 64: allowed are ..."), its allowed values unquoted;
    a field no flag sets keeps its name, and the family is named."""
    flags = {row["field"]: row["flag"] for row in table.values() if row.get("field")}
    translated = re.sub(r"\b(\w+)=('[^']*'|\S+?)(?=[:,) ]|$)",
                        lambda m: f"{flags[m.group(1)]} {m.group(2)}" if m.group(1) in flags else m.group(0), message)
    head, sep, allowed = translated.partition("allowed are ")
    return head + sep + allowed.replace("'", "") + ("" if translated.startswith("--") else f" (--model {name})")


def fit_positions(cfg, sizes):
    """pos_limit = the training length when evaluation runs longer (the HMM's K = 30, 50): the task is
    time-homogeneous, so 'one more observation' beats an untrained row. Older checkpoints get it here too."""
    if getattr(cfg, "pos", None) == "learned" and hasattr(cfg, "pos_limit") and not cfg.pos_limit \
            and sizes["eval_len"] > sizes["max_len"]:
        cfg.pos_limit = sizes["max_len"]
    return cfg


def baseline_config(name, main_cfg, target_params):
    """The baseline's Config: the main model's shared fields it declares, the width matched to target_params."""
    fields = models.config_fields(name)
    shared = {k: v for k, v in dataclasses.asdict(main_cfg).items() if k in fields and k != "d_model" and k in models.SHARED_FIELDS}
    return models.match_capacity(name, shared, target_params)
