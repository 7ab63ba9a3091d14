"""lstm: a stack of LSTM layers with every backward derived by hand (backpropagation through time), in NumPy.

Notation (fixed for the whole module)
    B  batch size     T  sequence length     C  model width (d_model); every LSTM layer's hidden size is C too
    V  input vocabulary     K  output classes     L  number of LSTM layers

Gradient convention (layers.py's, for every op): a forward returns (out, cache), its backward takes
(dout, cache) and returns FRESH arrays. `backward` returns a dict with the same keys as the parameters.

This module is one model family of models.FAMILIES ("lstm"): `Config`, `init_params`, `forward`,
`backward`, and `param_shapes`, `decayed`, `step_memory_bytes`, `step_flops`, `TWINS`.

The model, in the order of its forward pass:
    x_0 = wte[tokens] (+ wpe[t] with pos "learned")          embedding           (layers.py)
    for l = 1..L:  h^l = LSTM_l(x_{l-1})                     the recurrence       (below)
                   x_l = x_{l-1} + h^l  (residual "on"),  or  x_l = h^l
    logits = LNf(x_L) W_u + b_u                              unembedding          (layers.py)

One LSTM step (one layer, one time step t; all four gates from ONE matrix product of [x_t, h_{t-1}]):
    a   = [x_t, h_{t-1}] W + b        (B, 4C)   gate pre-activations, in the order i, f, g, o
    i   = sigmoid(a_i)                input gate: how much of the candidate to write
    f   = sigmoid(a_f)                forget gate: how much of the old cell to keep
    g   = tanh(a_g)                   candidate cell values
    o   = sigmoid(a_o)                output gate: how much of the cell to show
    c_t = f * c_{t-1} + i * g         the cell: the layer's memory
    h_t = o * tanh(c_t)               the hidden state: what the next layer and the next step see
with h_0 = c_0 = 0. Backpropagation through time runs the steps in reverse time: the gradient arriving at
h_t is what the layer above sends (dh_t) plus what step t+1 sent back through h_t; the gradient at c_t is
what step t+1 sent back through c_t (dc = dc_{t+1} * f_{t+1}) plus what arrives through h_t.

Choices, and why:
  - Positions: none by default (pos "none"). A recurrence knows where it is (it can count its own steps),
    and without a position table no length past the training length meets an untrained row (the HMM is
    evaluated at K = 30 and 50 after training at 20). pos "learned" adds a table as the authors' LSTM has
    on the bijection, clamped past the training length (pos_limit) as the transformer's is.
  - Residual connections between layers: on by default. Each layer then refines the stream below it and the
    gradient reaches the embedding past every layer's gates, which is what lets a deep stack train (the
    authors' LSTM has none; residual "off" gives their plain stack). Whether it helps here on each task is
    for the learning-rate sweep to show, not asserted.
  - The forget-gate bias starts at 1 (FORGET_BIAS): with f near sigmoid(1) = 0.73 the cell keeps most of
    its memory from the start, so gradients through c survive many steps (Jozefowicz et al. 2015).
  - Left out: dropout, a head tied to the embedding, peephole connections.

Weight decay (decayed): the matrices (embedding tables, the gate matrices W, the head) decay; the biases
and the LayerNorm's gain and bias do not.
"""

import math
from dataclasses import dataclass, asdict

import layers as ly
from layers import twin

import numpy as np  # noqa: E402  (after layers: it pins OpenBLAS to one thread before NumPy loads)

FORGET_BIAS = 1.0           # initial bias of the forget gate (Jozefowicz et al. 2015)
POSITIONS = ("none", "learned")
RESIDUALS = ("on", "off")
INITS = ("fan-in", "uniform")  # Config.init: N(0, 1/fan_in), or PyTorch's LSTM default U(-1/sqrt(C), 1/sqrt(C))
TWINS = "families.lstm_twins"    # the module of this family's Numba twins (models.py loads it with the family)


# ----------------------------------------------------------------------------
# configuration and initialisation

# sizes: the Config's 2 layers, the width that gives the transformer's parameter count in each task's
# default and paper presets (within 5%: --params); the quick presets take the Config's width. Optimisation:
# the learning rate and initialisation of a sweep, the lowest held-out KL over its grid: the sawtooth's
# (families/README.md, "The sweep and its rule": 3 rates x 2 initialisations; the bijection takes it) and
# the rate sweep's on recall, hops, transport and the HMM (primitives/README.md, "The recurrent families' rate
# sweep": 4 rates x 2 initialisations on seed 9, which no verdict uses), over the task's own
TUNED = {"bijection": dict(lr=1e-2, init="fan-in"), "sawtooth": dict(lr=1e-2, init="fan-in"),
         "recall": dict(lr=3e-3, init="uniform"), "hops": dict(lr=3e-3, init="uniform"),
         "transport": dict(lr=3e-3, init="uniform"), "hmm": dict(lr=3e-3, init="fan-in")}
PRESETS = {task: {preset: dict(params=n, **TUNED[task]) for preset, n in counts.items()} for task, counts in {
    "bijection": {"default": 156_372, "paper": 156_372},
    "sawtooth": {"first": 105_172, "default": 105_172, "paper": 105_172},
    "hmm": {"default": 213_445, "paper": 691_301},
    "transport": {"default": 208_709, "paper": 684_197},
    "recall": {"default": 109_600, "paper": 109_600},
    "hops": {"default": 205_840, "paper": 205_840}}.items()}
FLAGS = {"--residual": dict(field="residual", type=str, help="lstm: on (default): x_l = x_{l-1} + h^l | off")}


@dataclass
class Config:
    vocab_size: int            # V, input tokens
    n_classes: int             # K, output classes
    max_len: int = 64          # longest sequence the learned positions cover (pos "learned")
    d_model: int = 64          # C, the embedding width and every layer's hidden size
    n_layers: int = 2          # L
    dtype: str = "float32"     # "float32" for training, "float64" for checks
    pos: str = "none"          # "none" or "learned"
    pos_limit: int = 0         # learned positions: t >= pos_limit reuses row pos_limit - 1 (0: no limit)
    residual: str = "on"       # "on": x_l = x_{l-1} + h^l; "off": x_l = h^l
    init: str = "fan-in"       # see INITS

    def __post_init__(self):
        for name in ("vocab_size", "n_classes", "max_len", "d_model", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive integer")
        for name, allowed in (("dtype", ("float32", "float64")), ("pos", POSITIONS), ("residual", RESIDUALS),
                              ("init", INITS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}: allowed are {', '.join(map(repr, allowed))}")
        if not isinstance(self.pos_limit, (int, np.integer)) or not 0 <= self.pos_limit <= self.max_len:
            raise ValueError(f"pos_limit={self.pos_limit!r}: allowed are 0 (no limit) to max_len={self.max_len}")

    def to_dict(self):
        return asdict(self)


def param_shapes(cfg):
    """name -> shape of every parameter init_params makes for cfg."""
    C = cfg.d_model
    shapes = {"wte": (cfg.vocab_size, C)}
    if cfg.pos == "learned":
        shapes["wpe"] = (cfg.max_len, C)
    for l in range(cfg.n_layers):
        shapes[f"lstm.{l}.w"], shapes[f"lstm.{l}.b"] = (2 * C, 4 * C), (4 * C,)   # rows: [x_t, h_{t-1}]
    shapes.update({"lnf.g": (C,), "lnf.b": (C,), "unembed.w": (C, cfg.n_classes), "unembed.b": (cfg.n_classes,)})
    return shapes


def init_params(cfg, seed=0):
    """Embeddings N(0, 1). Gate matrices: "fan-in" N(0, 1/(2C)), so each pre-activation starts at the scale of
    its inputs; "uniform" U(-1/sqrt(C), 1/sqrt(C)), PyTorch's nn.LSTM default. Gate biases 0 except the forget
    gate's, FORGET_BIAS. The head N(0, 1/C), its bias 0; the LayerNorm gain 1, bias 0."""
    rng = np.random.default_rng(seed)
    C = cfg.d_model
    p = {}
    for name, shape in param_shapes(cfg).items():
        if name in ("wte", "wpe"):
            p[name] = rng.normal(0, 1.0, shape)
        elif name.endswith(".w") and name.startswith("lstm."):
            p[name] = (rng.normal(0, 1 / math.sqrt(2 * C), shape) if cfg.init == "fan-in"
                       else rng.uniform(-1 / math.sqrt(C), 1 / math.sqrt(C), shape))
        elif name == "unembed.w":
            p[name] = rng.normal(0, 1 / math.sqrt(C), shape)
        else:
            p[name] = np.ones(shape) if name == "lnf.g" else np.zeros(shape)
        if name.startswith("lstm.") and name.endswith(".b"):
            p[name][C:2 * C] = FORGET_BIAS                      # gate order i, f, g, o: f is the second block
    return {k: v.astype(cfg.dtype) for k, v in p.items()}


def decayed(name, shape):
    """Weight decay on the matrices (embeddings, gate matrices, head); not on biases or LayerNorm parameters."""
    return len(shape) >= 2


def step_memory_bytes(cfg, B, T):
    """About how many bytes one training step at batch B and length T holds at its peak: per layer and time
    step the cache of the step ([x_t, h_{t-1}] of 2C, c_{t-1}, i, f, g, o, tanh c_t, the output h_t: 9C) and
    the residual stream (C), twice for the backward's temporaries; the parameters four times (weights,
    gradients, AdamW's m and v); three (B, T, K) arrays of logits. An estimate to refuse what cannot fit."""
    C, L = cfg.d_model, cfg.n_layers
    itemsize = 8 if cfg.dtype == "float64" else 4
    params = sum(int(np.prod(s)) for s in param_shapes(cfg).values())
    return itemsize * (L * 2 * 10 * B * T * C + 4 * params + 3 * B * T * cfg.n_classes)


def state_floats(cfg, T):
    """Floats carried from one position to the next: every layer's h and c (fixed, whatever T)."""
    return 2 * cfg.n_layers * cfg.d_model


def step_flops(cfg, B, T):
    """Floating-point operations of one training step: per layer and token the gate product [x, h] W
    (2 x 2C x 4C) and about 30C elementwise operations for the gates and the cell, the head's product;
    the backward twice the forward."""
    C, L = cfg.d_model, cfg.n_layers
    per_token = L * (2 * 2 * C * 4 * C + 30 * C) + 2 * C * cfg.n_classes
    return 3 * per_token * B * T


# ----------------------------------------------------------------------------
# the gate nonlinearities: sigmoid (layers.py) and tanh(a)


def tanh_forward(a):
    """a (...) -> t = tanh(a) (...), cache t."""
    t = np.tanh(a)
    return t, t


def tanh_backward(dt, cache):
    """cache = t. dt/da = 1 - t^2."""
    t = cache
    return dt * (1.0 - t * t)


# ----------------------------------------------------------------------------
# one LSTM step, and the sequence: the step looped forward in time, then backward in reverse time

def lstm_step_forward(x, h_prev, c_prev, w, b):
    """x (B, Cin), h_prev (B, C), c_prev (B, C), w (Cin + C, 4C), b (4C,) -> h (B, C), c (B, C), cache.
        a = [x, h_prev] w + b;  i, f, o = sigmoid(a_i, a_f, a_o);  g = tanh(a_g)
        c = f * c_prev + i * g;  h = o * tanh(c)"""
    C = h_prev.shape[1]
    xh = np.concatenate([x, h_prev], axis=1)                       # (B, Cin + C)
    a, linear = ly.linear_forward(xh, w, b)                        # (B, 4C)  one product for the four gates
    i, _ = ly.sigmoid_forward(a[:, 0 * C:1 * C])                      # (B, C)
    f, _ = ly.sigmoid_forward(a[:, 1 * C:2 * C])
    g, _ = tanh_forward(a[:, 2 * C:3 * C])
    o, _ = ly.sigmoid_forward(a[:, 3 * C:4 * C])
    c = f * c_prev + i * g                                          # (B, C)
    tc, _ = tanh_forward(c)
    h = o * tc                                                      # (B, C)
    return h, c, (linear, c_prev, i, f, g, o, tc)


def lstm_step_backward(dh, dc, cache):
    """dh, dc (B, C): the gradients arriving at h and c -> dx (B, Cin), dh_prev (B, C), dc_prev (B, C),
    dw (Cin + C, 4C), db (4C,). Each line undoes one line of lstm_step_forward, last first."""
    linear, c_prev, i, f, g, o, tc = cache
    Cin = linear[1].shape[0] - i.shape[1]
    # h = o * tanh(c): c reaches the loss through h and through the next step (dc)
    do = dh * tc
    dc = dc + tanh_backward(dh * o, tc)
    # c = f * c_prev + i * g
    df, dc_prev = dc * c_prev, dc * f
    di, dg = dc * g, dc * i
    # i, f, o = sigmoid(a_i, a_f, a_o);  g = tanh(a_g)
    da = np.concatenate([ly.sigmoid_backward(di, i), ly.sigmoid_backward(df, f), tanh_backward(dg, g),
                         ly.sigmoid_backward(do, o)], axis=1)      # (B, 4C)
    # a = [x, h_prev] w + b
    dxh, dw, db = ly.linear_backward(da, linear)                   # (B, Cin + C)
    return dxh[:, :Cin], dxh[:, Cin:], dc_prev, dw, db


@twin
def lstm_forward(x, w, b):
    """x (B, T, Cin), w (Cin + C, 4C), b (4C,) -> h (B, T, C), cache (the step caches, in time order).
    The step looped over t with h_0 = c_0 = 0."""
    B, T, _ = x.shape
    C = w.shape[1] // 4
    h_t = np.zeros((B, C), dtype=x.dtype)
    c_t = np.zeros((B, C), dtype=x.dtype)
    hs, steps = np.empty((B, T, C), dtype=x.dtype), []
    for t in range(T):
        h_t, c_t, step = lstm_step_forward(x[:, t], h_t, c_t, w, b)
        hs[:, t] = h_t
        steps.append(step)
    return hs, steps


@twin
def lstm_backward(dh, cache):
    """dh (B, T, C): the gradient arriving at every h_t from above -> dx (B, T, Cin), dw, db.
    Reverse time: step t receives dh_t plus what step t+1 sent back through h_t (dh_next), and what it
    sent back through c_t (dc_next); w and b are shared by every step, so their gradients add up."""
    steps = cache
    B, T, C = dh.shape
    w = steps[0][0][1]
    dx = np.empty((B, T, w.shape[0] - C), dtype=dh.dtype)
    dw, db = np.zeros_like(w), np.zeros(w.shape[1], dtype=dh.dtype)
    dh_next = np.zeros((B, C), dtype=dh.dtype)
    dc_next = np.zeros((B, C), dtype=dh.dtype)
    for t in reversed(range(T)):
        dx[:, t], dh_next, dc_next, dw_t, db_t = lstm_step_backward(dh[:, t] + dh_next, dc_next, steps[t])
        dw += dw_t
        db += db_t
    return dx, dw, db


# ----------------------------------------------------------------------------
# the model

def position_rows(cfg, T):
    """Row of the learned position table used at each t < T: t, or the last trained row past pos_limit."""
    t = np.arange(T)
    return np.minimum(t, cfg.pos_limit - 1) if cfg.pos_limit else t


def forward(params, tokens, cfg):
    """tokens (B, T) int -> logits (B, T, K), cache. cache["resid"] lists the stream x_0..x_L (B, T, C);
    cache["xf"] is the final LayerNorm's output."""
    B, T = tokens.shape
    if cfg.pos == "learned":
        if T > cfg.max_len:
            raise ValueError(f"sequence length {T} exceeds max_len={cfg.max_len} of learned positions")
        wpe = params["wpe"][position_rows(cfg, T)]
    else:
        wpe = np.zeros((T, cfg.d_model), dtype=cfg.dtype)
    x, embedding = ly.embedding_forward(params["wte"], wpe, tokens)             # (B, T, C)
    x = x.astype(cfg.dtype)
    cache = {"T": T, "embedding": embedding, "layers": [], "resid": [x]}
    for l in range(cfg.n_layers):
        h, lc = lstm_forward(x, params[f"lstm.{l}.w"], params[f"lstm.{l}.b"])     # (B, T, C)
        x = x + h if cfg.residual == "on" else h
        cache["layers"].append(lc)
        cache["resid"].append(x)
    logits, cache["head"] = ly.head_forward(x, params["lnf.g"], params["lnf.b"], params["unembed.w"], params["unembed.b"])
    cache["xf"] = cache["head"]["xf"]                               # (B, T, C)  the final state
    return logits, cache


def backward(dlogits, cache, params, cfg):
    """dlogits (B, T, K) -> grads, a dict with the same keys as params. Reverses forward line by line."""
    g = {}
    dx, g["lnf.g"], g["lnf.b"], g["unembed.w"], g["unembed.b"] = ly.head_backward(dlogits, cache["head"])
    for l in reversed(range(cfg.n_layers)):
        # forward: x_l = x_{l-1} + h^l (or h^l), h^l = LSTM_l(x_{l-1})
        dxin, g[f"lstm.{l}.w"], g[f"lstm.{l}.b"] = lstm_backward(dx, cache["layers"][l])
        dx = dx + dxin if cfg.residual == "on" else dxin
    g["wte"], dwpe = ly.embedding_backward(dx, cache["embedding"])              # (V, C), (T, C)
    if cfg.pos == "learned":                      # clamped positions share a row: their gradients add up
        g["wpe"] = np.zeros_like(params["wpe"])
        np.add.at(g["wpe"], position_rows(cfg, cache["T"]), dwpe)
    return g
