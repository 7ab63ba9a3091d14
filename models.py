"""models: the registry of model families, and what every family shares, written once against four names.

A family is one module exposing
    Config                                     a dataclass; the shared field names where they apply
                                               (vocab_size, n_classes, max_len, d_model, n_layers, dtype),
                                               every other field with a default
    init_params(cfg, seed) -> {name: array}
    forward(params, tokens, cfg) -> (logits (B, T, K), cache)
    backward(dlogits, cache, params, cfg) -> {name: gradient}, the keys of params
and, where it has them (a documented default applies where it does not):
    param_shapes(cfg) -> {name: shape}         default: the shapes init_params makes
    decayed(name, shape) -> bool               which parameters take weight decay; default: matrices
                                               (two or more axes) do, vectors and gains do not
    step_memory_bytes(cfg, B, T) -> int        the peak of one training step; default: the parameters
                                               four times, DEFAULT_ACTIVATIONS activations of
                                               (B, T, d_model) per layer (where it has them) and the logits
    step_flops(cfg, B, T) -> int               the floating-point operations of one training step (the
                                               progress bar's estimate of the time left); default:
                                               6 x parameters x B x T
    grow(params, cfg_from, cfg, seed) -> params   a deeper model computing what params does (train.py
                                               --grow-from); default: a family cannot grow
    state_floats(cfg, T) -> int                floats carried from one position to the next on T tokens (the
                                               recall sweep's state size); default: not stated (None)
    upgrade_fields(fields) -> fields           reads the config fields of older checkpoints
    FLAGS = {flag: dict(field, type, help[, check])}   command-line flags of the family's own Config
                                               fields (check(value, args) -> what is wrong or None;
                                               default: an int must be positive; else the Config's)
    PRESETS = {task: {preset: settings}}       the family's sizes in the tasks' presets, and any of the
                                               task's optimisation it sets otherwise (its own tuned lr,
                                               init), over the task's; a task or preset it does not
                                               name: its Config's defaults and the task's optimisation
    PROBES = True                              geometry/run.py's probes apply (they read attention)
    TWINS = "module name"                      the module of the family's Numba twins, loaded with the family
                                               (it hands them to kernels.add_twins; kernels.py says how)

FAMILIES maps the name a user types (--model) to the module's name, or to a pair (module name, fixed
Config fields) where two names share a module. Adding a family is adding its module and one entry here.
Everything below takes the family's name.
"""

import dataclasses
import os
import importlib

import numpy as np

import layers as ly

FAMILIES = {
    "transformer": "bayesattn",
    "mlp": ("families.mlp_baseline", {"inputs": "token"}),          # the authors' MLP: one token and its position
    "prefix-mlp": ("families.mlp_baseline", {"inputs": "prefix"}),  # an MLP that sees the whole prefix
    "lstm": "families.lstm",
    "ssm": "families.mamba",                                        # the selective state-space model (Mamba)
}
SHARED_FIELDS = ("vocab_size", "n_classes", "max_len", "d_model", "n_layers", "dtype")
DEFAULT_ACTIVATIONS = 16    # the default memory estimate: activations of (B, T, d_model) held per layer
MATCH_TOL = 0.05            # capacity matching: the parameter count within 5% of the target


def family(name):
    """-> (module, fixed Config fields) of a registered family; ValueError naming the allowed names."""
    if name not in FAMILIES:
        raise ValueError(f"model {name!r}: allowed are {', '.join(FAMILIES)}")
    entry = FAMILIES[name]
    module_name, fixed = (entry, {}) if isinstance(entry, str) else entry
    mod = importlib.import_module(module_name)
    if hasattr(mod, "TWINS"):
        importlib.import_module(mod.TWINS)                  # its twins, for the fast path
    return mod, dict(fixed)


def module(name):
    return family(name)[0]


def config_fields(name):
    """-> {field: default or None} of the family's Config, without the fields its registry entry fixes."""
    mod, fixed = family(name)
    return {f.name: (None if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(mod.Config) if f.name not in fixed}


def make_config(name, **fields):
    """The family's Config from fields it declares (ValueError naming one it does not), with its fixed fields."""
    mod, fixed = family(name)
    declared = {f.name for f in dataclasses.fields(mod.Config)}
    unknown = sorted(set(fields) - declared)
    if unknown:
        raise ValueError(f"model {name!r} has no config field {unknown[0]!r} (its fields: {', '.join(sorted(declared))})")
    clash = {k: v for k, v in fields.items() if k in fixed and v != fixed[k]}
    if clash:
        k = next(iter(clash))
        raise ValueError(f"model {name!r} has {k}={fixed[k]!r}, not {clash[k]!r}")
    return mod.Config(**{**fields, **fixed})


def config_from_dict(name, fields):
    """A Config from a checkpoint's stored fields, older field names included (the family's upgrade_fields)."""
    mod, _ = family(name)
    if hasattr(mod, "upgrade_fields"):
        fields = mod.upgrade_fields(fields)
    return make_config(name, **fields)


def param_shapes(name, cfg):
    """name -> shape of every parameter of the family at cfg."""
    mod = module(name)
    if hasattr(mod, "param_shapes"):
        return {k: tuple(v) for k, v in mod.param_shapes(cfg).items()}
    return {k: v.shape for k, v in mod.init_params(cfg, 0).items()}


def count_params(shapes):
    """The number of parameters of {name: shape} (or of {name: array})."""
    return int(sum(np.prod(getattr(s, "shape", s), dtype=np.int64) for s in shapes.values()))


def init_params(name, cfg, seed=0):
    return module(name).init_params(cfg, seed)


def grow(name, params, cfg_from, cfg, seed=0):
    """The family's grow(params, cfg_from, cfg, seed): a deeper model that computes what params does (the
    transformer's: its new blocks' output maps at zero); ValueError in one line for a family without it."""
    mod = module(name)
    if not hasattr(mod, "grow"):
        raise ValueError(f"model {name!r} cannot grow from a shallower checkpoint (its module has no grow)")
    return mod.grow(params, cfg_from, cfg, seed)


def decayed(name, param_name, shape):
    """Does this parameter take weight decay? The family's rule, or: matrices do, vectors and gains do not."""
    mod = module(name)
    if hasattr(mod, "decayed"):
        return bool(mod.decayed(param_name, shape))
    return len(shape) >= 2


def decay_set(name, params):
    """The names of the parameters that take weight decay."""
    return {k for k, v in params.items() if decayed(name, k, v.shape)}


def forward(name, params, tokens, cfg):
    """The family's forward on tokens checked once here for every family: an array (B, T) of ids in
    0..vocab_size-1 (wte[-1] would otherwise read a row without a word); ValueError naming the shape or range."""
    return module(name).forward(params, ly.checked_tokens(tokens, cfg.vocab_size), cfg)


def loss_and_grads(name, params, tokens, targets, mask, cfg):
    """Mean cross-entropy (nats) over the supervised positions and its gradient for every parameter.
    targets (B, T) class indices or (B, T, K) probabilities; mask (B, T)."""
    mod = module(name)
    logits, cache = forward(name, params, tokens, cfg)
    loss, dlogits = ly.cross_entropy(logits, targets, mask)
    return loss, mod.backward(dlogits, cache, params, cfg)


def predict_proba(name, params, tokens, cfg, batch=256):
    """The model's predictive distributions (B, T, K) in float64, evaluated in chunks of `batch` sequences."""
    out = []
    for i in range(0, len(tokens), batch):
        logits, _ = forward(name, params, tokens[i:i + batch], cfg)
        out.append(ly.softmax(logits.astype(np.float64)))
    return np.concatenate(out)


def step_memory_bytes(name, cfg, B, T):
    """About how many bytes one training step at batch B and length T holds at its peak (an estimate to
    refuse what cannot fit, not a measurement)."""
    mod = module(name)
    if hasattr(mod, "step_memory_bytes"):
        return int(mod.step_memory_bytes(cfg, B, T))
    itemsize = 8 if getattr(cfg, "dtype", "float32") == "float64" else 4
    width, layers = getattr(cfg, "d_model", 0), getattr(cfg, "n_layers", 1)      # the shared fields it has
    activations = DEFAULT_ACTIVATIONS * B * T * width * layers + 3 * B * T * cfg.n_classes
    return itemsize * (4 * count_params(param_shapes(name, cfg)) + activations)


def available_memory_bytes():
    """MemAvailable of /proc/meminfo (Linux), or the physical memory where that file is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def step_flops(name, cfg, B, T):
    """About how many floating-point operations one training step at batch B and length T takes."""
    mod = module(name)
    if hasattr(mod, "step_flops"):
        return int(mod.step_flops(cfg, B, T))
    return 6 * count_params(param_shapes(name, cfg)) * B * T


def state_floats(name, cfg, T):
    """Floats the family carries from one position to the next on a sequence of T tokens, or None where its
    module does not say."""
    mod = module(name)
    return int(mod.state_floats(cfg, T)) if hasattr(mod, "state_floats") else None


class CapacityError(ValueError):
    """No width of the family matches the parameter count asked for; the message says the closest."""


def match_capacity(name, fields, target_params, tol=MATCH_TOL, max_width=1 << 16):
    """The family's Config at fields, with the d_model whose parameter count (every parameter: embeddings,
    position tables and head included) is closest to target_params (the smaller width on a tie);
    ValueError if it is not within tol. The widths tried are the multiples of the smallest width the
    family's Config accepts at fields (the transformer's: of n_heads); the count must grow with d_model."""
    shown = ", ".join(f"{k}={v}" for k, v in fields.items() if k not in ("dtype",)) or "its defaults"

    refused = []

    def accepts(H):
        try:
            make_config(name, **{**fields, "d_model": H})
            return True
        except ValueError as e:
            refused.append(e)
            return False
    step = next((H for H in range(1, 1025) if accepts(H)), None)
    if step is None and len({str(e) for e in refused}) == 1:
        raise refused[0]                                            # a field that no width makes right: its own error
    if step is None:
        raise CapacityError(f"{name} accepts no width up to 1024 at {shown}")
    count = lambda k: count_params(param_shapes(name, make_config(name, **{**fields, "d_model": k * step})))
    hi = 1
    while count(hi) < target_params and hi * step < max_width:     # exponential search, then bisection, for
        hi *= 2                                                     # the first multiple reaching the target
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(mid) < target_params else (lo, mid)
    k = hi
    if k > 1 and target_params - count(k - 1) <= count(k) - target_params:
        k -= 1
    error = abs(count(k) - target_params) / target_params
    if error > tol:
        raise CapacityError(f"no width of {name} matches {target_params:,} parameters within {tol:.0%} at {shown}: "
                         f"closest is d_model={k * step} with {count(k):,} ({error:.1%} off)")
    return make_config(name, **{**fields, "d_model": k * step})
