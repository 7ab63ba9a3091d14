"""layers: the layers every model here shares, in NumPy, each a forward/backward pair.

Notation
    B  batch size     T  sequence length     C  width (channels)     K  output classes
    N  rows (B * T) of a flattened activation

Gradient convention, for every op of the project: a forward returns (out, cache), its backward takes
(dout, cache) with exactly that cache and returns FRESH arrays (nothing is accumulated into buffers):
the gradient of each input, in the order of the forward's arguments.

The ops below are the readable path: plain NumPy, written from the equations in their docstrings.
An op marked `@twin` has a twin of the same name and signature (Numba loops, threaded matrix
products), tested against it: in kernels.py for the ops here and the transformer's, in a family's
own twins module (its TWINS, e.g. families/lstm_twins.py) for a family's. Twins are keyed by the op's bare
name, so a name may be twinned once: a second op of the same name fails at import. Which one runs
is the one switch of the project:

    FAST = {}                     empty: every op runs as written here (what you read is what runs)
    with kernels.enabled(): ...   inside the block, every op runs its twin (the fast path, which
                                  train.py takes unless --kernels numpy); after it, what ran before

The tests reach this code as op.numpy and the twin as kernels.<name> (or <family>_twins.<name>).
"""

import os

# BLAS gets one thread and Numba the cores: on 2 cores their worker threads otherwise fight. Only counts
# before NumPy is first imported. (OpenMP's wait policy is left at its default: a worker spins a while
# after a parallel loop, so the next starts in microseconds; kernels.py says what passive would change.)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import contextlib  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402

LN_EPS = 1e-5                      # LayerNorm: var + eps under the square root
GELU_C = math.sqrt(2.0 / math.pi)  # GELU's tanh approximation: c in tanh(c (x + 0.044715 x^3))

FAST = {}                          # op name -> its twin; empty: the NumPy path
TWINNED = {}                       # op name -> the module of the NumPy op marked @twin (kernels.enabled() checks
                                   # that each has a twin)


def twin(numpy_op):
    """Mark a NumPy op as having a twin of the same name: calls go to FAST[name] when the fast path is
    on, to numpy_op otherwise. ValueError if another module already twinned an op of that name."""
    name = numpy_op.__name__
    home = TWINNED.setdefault(name, numpy_op.__module__)
    if home != numpy_op.__module__:
        raise ValueError(f"op {name!r} of {numpy_op.__module__} is twinned already by {home}: twins are keyed "
                         f"by the op's name, so rename one")

    @functools.wraps(numpy_op)
    def op(*args, **kwargs):
        return FAST.get(name, numpy_op)(*args, **kwargs)
    op.numpy = numpy_op
    return op


@contextlib.contextmanager
def use_twins(twins):
    """Within the block, the ops named in twins (name -> function) run those functions and every other op
    its NumPy code; after it (also after an exception) the switch is what it was before."""
    before = dict(FAST)
    FAST.clear()
    FAST.update(twins)
    try:
        yield
    finally:
        FAST.clear()
        FAST.update(before)


def bits(nats):
    """Convert nats to bits."""
    return nats / math.log(2.0)


def checked_tokens(tokens, vocab_size):
    """tokens as an array (B, T) of ids in 0..vocab_size-1; ValueError naming the shape or the range otherwise
    (models.forward calls it for every family: wte[-1] would otherwise read a row without a word)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape (B, T), got {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in 0..{vocab_size - 1}, got {tokens.min()}..{tokens.max()}")
    return tokens


# ----------------------------------------------------------------------------
# embedding: x = wte[tokens] + wpe (a token table and a positional table)

def embedding_forward(wte, wpe, tokens):
    """tokens (B, T) int, wte (vocab, C), wpe (T', C), T' >= T -> x (B, T, C) = wte[tokens] + wpe[:T],
    cache (tokens, vocab)."""
    T = tokens.shape[1]
    return wte[tokens] + wpe[None, :T], (tokens, wte.shape[0])


@twin
def embedding_backward(dx, cache):
    """dx (B, T, C) -> dwte (vocab, C), dwpe (T, C). Forward was x = wte[tokens] + wpe, so every row of dx
    adds into the row of wte its token picked (rows that share a token add up), and dwpe sums over B."""
    tokens, V = cache
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
        raise ValueError(f"token ids must lie in 0..{V - 1}, got {tokens.min()}..{tokens.max()}")
    dwte = np.zeros((V, dx.shape[-1]), dtype=dx.dtype)
    np.add.at(dwte, tokens.reshape(-1), dx.reshape(-1, dx.shape[-1]))
    return dwte, dx.sum(axis=0)


# ----------------------------------------------------------------------------
# linear: out = x @ w + b

@twin
def linear_forward(x, w, b):
    """x (..., Cin), w (Cin, Cout), b (Cout,) -> out = x @ w + b (..., Cout), cache (x, w). (One 2-D product:
    NumPy runs (B, T, Cin) @ (Cin, Cout) as B small ones, about 10x slower at width 400.)"""
    return (x.reshape(-1, w.shape[0]) @ w).reshape(x.shape[:-1] + (w.shape[1],)) + b, (x, w)


@twin
def linear_backward(dout, cache):
    """Forward was out = x @ w + b, so dx = dout @ w^T, dw = x^T dout (summed over every row), db = sum dout."""
    x, w = cache
    Cin, Cout = w.shape
    x2, d2 = x.reshape(-1, Cin), dout.reshape(-1, Cout)           # (N, Cin), (N, Cout)
    return (d2 @ w.T).reshape(x.shape), x2.T @ d2, d2.sum(axis=0)


# ----------------------------------------------------------------------------
# LayerNorm over the last axis:  y = g * (x - mean) * rstd + b,  rstd = 1 / sqrt(var + eps)

@twin
def layernorm_forward(x, g, b):
    """x (..., C) -> y (..., C), cache (x2 (N, C), mean (N,), rstd (N,), g, shape)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    mean = x2.mean(axis=-1)                                        # (N,)
    var = ((x2 - mean[:, None]) ** 2).mean(axis=-1)                # (N,)
    rstd = 1.0 / np.sqrt(var + LN_EPS)                             # (N,)
    xhat = (x2 - mean[:, None]) * rstd[:, None]                    # (N, C)
    y = (xhat * g + b).astype(x.dtype)
    return y.reshape(shape), (x2, mean.astype(x.dtype), rstd.astype(x.dtype), g, shape)


@twin
def layernorm_backward(dy, cache):
    """-> dx (..., C), dg (C,), db (C,). With xhat the normalised input and dxhat = dy * g:
    dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat)),  dg = sum_n dy xhat,  db = sum_n dy."""
    x2, mean, rstd, g, shape = cache
    dy2 = dy.reshape(x2.shape)                                     # (N, C)
    xhat = (x2 - mean[:, None]) * rstd[:, None]
    dxhat = dy2 * g
    dx = rstd[:, None] * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx.astype(x2.dtype).reshape(shape), (dy2 * xhat).sum(axis=0).astype(x2.dtype), dy2.sum(axis=0)


# ----------------------------------------------------------------------------
# the head: logits = LN(x) W + b, a final LayerNorm then the unembedding

def head_forward(x, g, b, w, bias):
    """x (B, T, C), LayerNorm gain and bias g, b (C,), w (C, K), bias (K,) -> logits (B, T, K), cache; cache["xf"]
    is LN(x) (B, T, C), the final state the probes read."""
    xf, ln = layernorm_forward(x, g, b)
    logits, unembed = linear_forward(xf, w, bias)
    return logits, {"xf": xf, "ln": ln, "unembed": unembed}


def head_backward(dlogits, cache):
    """-> dx (B, T, C), dg, db, dw, dbias: the unembedding's backward, then the LayerNorm's."""
    dxf, dw, dbias = linear_backward(dlogits, cache["unembed"])
    dx, dg, db = layernorm_backward(dxf, cache["ln"])
    return dx, dg, db, dw, dbias


# ----------------------------------------------------------------------------
# sigmoid(a) = 1 / (1 + exp(-a)), the gates of the recurrent families

def sigmoid_forward(a):
    """a (...) -> s = 1 / (1 + exp(-a)) (...), cache s. Written with exp(-|a|) so no exp overflows."""
    e = np.exp(-np.abs(a))
    s = np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(a.dtype)
    return s, s


def sigmoid_backward(ds, cache):
    """cache = s. ds/da = s (1 - s)."""
    s = cache
    return ds * s * (1.0 - s)


# ----------------------------------------------------------------------------
# GELU, tanh approximation:  y = 0.5 x (1 + tanh z),  z = c (x + 0.044715 x^3)

@twin
def gelu_forward(x):
    """x (..., M) -> y (..., M), cache (x, tanh z): the backward needs tanh z again."""
    t = np.tanh(GELU_C * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t), (x, t)


@twin
def gelu_backward(dy, cache):
    """cache = (x, tanh z). dy/dx = 0.5 (1 + tanh z) + 0.5 x (1 - tanh^2 z) dz/dx,  dz/dx = c (1 + 3 * 0.044715 x^2)."""
    x, t = cache
    dz = GELU_C * (1.0 + 3 * 0.044715 * x ** 2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dz)


# ----------------------------------------------------------------------------
# softmax over the last axis, stable: subtract the row maximum first (it cancels)

def softmax(s):
    """s (..., K) -> probabilities (..., K). No twin: the model's softmax is fused into the attention twin, and
    the probes that call this one run it once on a batch."""
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ----------------------------------------------------------------------------
# softmax + cross-entropy at the supervised positions, loss in nats
#   loss = sum_n w_n * (-sum_k p_nk log softmax(z_n)_k) / sum_n w_n
#   dz_n = w_n * (softmax(z_n) * sum_k p_nk - p_n) / sum_n w_n
# p_n is a distribution (soft targets) or one-hot (a class index); w_n is 1 at a supervised position.

@twin
def cross_entropy(logits, targets, mask):
    """logits (B, T, K); targets (B, T) class indices or (B, T, K) probabilities; mask (B, T)
    -> mean loss over the masked positions (nats), dlogits (B, T, K)."""
    K = logits.shape[-1]
    if targets.ndim == logits.ndim - 1:
        if targets.size and (targets.min() < 0 or targets.max() >= K):
            raise ValueError(f"class targets must lie in 0..{K - 1}, got {targets.min()}..{targets.max()}")
        targets = np.eye(K, dtype=logits.dtype)[targets]          # one-hot (B, T, K)
    w = mask.astype(np.float64)[..., None]                         # (B, T, 1)
    wsum = max(float(w.sum()), 1e-12)
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))       # log softmax
    loss = -(w * targets * np.where((targets > 0) & (w > 0), logp, 0.0)).sum() / wsum   # 0 log 0 = 0 (a -inf logit)
    dlogits = w * (np.exp(logp) * targets.sum(-1, keepdims=True) - targets) / wsum
    return float(loss), dlogits.astype(logits.dtype)
