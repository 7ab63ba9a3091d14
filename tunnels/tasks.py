"""tasks: the registry of token wind tunnels, and what every task shares, written once against their names.

A task is one module exposing
    SETTINGS = {name: default}            its settings (a run's meta records them); s below is such a dict
    FLAGS = {flag: spec}                  the command-line flags that set them: spec = dict(setting, type,
                                          check(value, s) -> None or what is wrong, help)
    TINY = {"train": s, "grad": s}      the smallest settings of the conformance tests (tests/test_families.py): a
                                          training run in seconds; gradient checks on at least 12 positions
    PRESETS = {preset: {flag dest: value}}   optimisation and data of the presets (quick, default, paper);
                                          the model's sizes are its family's (models.py: PRESETS)
    sizes(s) -> dict(vocab, classes, max_len, eval_len)   input tokens, output classes, the training
                                          length and the longest evaluated length (>= max_len)
    sample(rng, n, s, step=None) -> batch  n sequences with exact posteriors (tunnels/windtunnels.py says what a
                                          batch holds); the training loop passes its step (a curriculum
                                          may read it), held-out sets pass none and see the task itself
    prior_gap_bits(s) -> float            the paper metric of a prior-only predictor (the authors' MLP)
and, where it has them:
    settings_of(cfg) -> s                 the settings of an older checkpoint whose meta lacks them (a task
                                          without older checkpoints has none: every run's meta has them)
    held_out_key(s) -> int                a number the held-out generator's seed takes from the settings
                                          (default 20; the HMM's: its length, so each length draws its own)
    variants(s) -> {label: s'}, VARIANTS  more held-out sets (the HMM's longer lengths), reported under
                                          metrics[VARIANTS] by label, the run's own settings first;
                                          VARIANT_FORMAT, VARIANT_TITLE how tables and figures name them
    ANSWER_LABEL                          what the figures call the i-th answer
    shortcut(batch, s) -> (n, T, K)       the best predictor without the primitive the task exercises
                                          (the HMM: no filtering; recall: no binding; the sawtooth: no
                                          lookup): primitives/matrix.py's floor for a mark (default: the uniform prior)
    readings(batch, q, s) -> {...}        the answers read in parts, each beside predictors that do one part
                                          (hops, direct: the lookup and the elimination), metrics["readings"]
    what the geometry probes read (manifold.PROBE_HOOKS): hypothesis_tokens, token_groups, token_names,
                                          evidence_masks, row_split, graded_rows, swap_query (a task
                                          without them is refused by geometry/run.py in one line)

Which positions are supervised is each batch's own: mask (and query_mask for answers the paper's curve
leaves out, groups for answers scored by name: tunnels/windtunnels.py), row by row. TASKS maps the name a user types (--task) to the module's name. Adding a task is adding its
module and one entry here. Paper II's sticky chain (continuous inputs) is tunnels/sticky.py, outside the registry.
"""

import importlib

import numpy as np

TASKS = {"bijection": "tunnels.bijection", "sawtooth": "tunnels.sawtooth", "hmm": "tunnels.hmm", "recall": "tunnels.recall",
         "hops": "tunnels.hops", "transport": "tunnels.transport"}
EVAL_SEED = 1_000_003       # held-out data never overlaps the training stream (seeds (seed, step))


def task(name):
    """-> the task's module; ValueError naming the allowed names."""
    if name not in TASKS:
        raise ValueError(f"task {name!r}: allowed are {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])


def settings(name, given=None):
    """The task's settings: its defaults, overridden by the given ones it declares (others are dropped)."""
    defaults = task(name).SETTINGS
    return {**defaults, **{k: v for k, v in (given or {}).items() if k in defaults and v is not None}}


def settings_from(name, cfg, meta):
    """A checkpoint's task settings: its meta's (older names by the task's LEGACY_META), and only where the
    meta lacks one, what its config implies (the task's settings_of, for checkpoints older than the meta's)."""
    mod, meta = task(name), meta or {}
    legacy = getattr(mod, "LEGACY_META", {})
    s = {**{k: meta[k] for k in mod.SETTINGS if k in meta},
         **{k: meta[v] for k, v in legacy.items() if k not in meta and v in meta}}
    if set(mod.SETTINGS) <= set(s):
        return s
    if not hasattr(mod, "settings_of"):
        missing = sorted(set(mod.SETTINGS) - set(s))
        raise ValueError(f"the checkpoint's meta lacks the {name} setting {missing[0]!r} (and the task has no "
                         f"older checkpoints to infer it from)")
    return {**mod.settings_of(cfg), **s}


def sizes(name, s):
    return task(name).sizes(s)


def sample(name, rng, n, s, step=None):
    return task(name).sample(rng, n, s, step)


def prior_gap_bits(name, s):
    return float(task(name).prior_gap_bits(s))


def shortcut(name, batch, s):
    """The task's no-primitive predictor on a batch (n, T, K), or None where it names none (the floor is then
    the uniform prior)."""
    mod = task(name)
    return mod.shortcut(batch, s) if hasattr(mod, "shortcut") else None


def held_out_sets(name, s, n, seed):
    """{label: batch}: the run's held-out sequences ("" the task itself, then the task's variants), each
    from a generator seeded apart from every training batch."""
    mod = task(name)
    labels = getattr(mod, "variants", lambda s: {})(s)
    sets = {"": mod.sample(np.random.default_rng(_held_out_seed(name, s, seed)), n, s)}
    for label, v in labels.items():
        sets[label] = sets[""] if v == s else mod.sample(np.random.default_rng(_held_out_seed(name, v, seed)), n, v)
    return sets


def held_out_bytes(name, s, n):
    """About how many bytes the held-out sets of n sequences hold (per set the posterior (n, T, classes) in
    float64 and three (n, T) arrays, T the longest evaluated length): an estimate to refuse what cannot fit
    before anything runs, not a measurement."""
    z = sizes(name, s)
    n_sets = 1 + len(getattr(task(name), "variants", lambda s: {})(s))
    return 8 * n * z["eval_len"] * (z["classes"] + 3) * n_sets


def _held_out_seed(name, s, seed):
    """The held-out generator's seed: (EVAL_SEED, seed, the task's held_out_key(s), default 20), as it has
    always been (the HMM's length; the bijection and the sawtooth used the default 20 there, which keeps their
    held-out sets)."""
    return (EVAL_SEED, seed, int(getattr(task(name), "held_out_key", lambda s: 20)(s)))
