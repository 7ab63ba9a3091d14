"""Benchmark: one training step of bayesattn against the same transformer in PyTorch.

    python -m bench.transformer                          # the three training shapes; PyTorch too if it is installed
    python -m bench.transformer --quick                  # tiny shapes, few repeats: a smoke test
    python -m bench.transformer --shapes hmm-paper --repeats 60
    python -m bench.transformer --shapes bij-b256         # the earlier bijection paper preset (batch 256)
    python -m bench.transformer --tricks                 # what each speed trick of kernels.py buys, per shape
    python -m bench.transformer --products               # each layer product on one thread against as the step runs it
    python -m bench.transformer --sgemm                  # only the machine's one-thread sgemm (seconds): scale the documents' times

A step is training.train_step, the step train.py takes (models.loss_and_grads, clip_grad_norm, adamw_step),
on the fast path (inside `with kernels.enabled():`). PyTorch gets the same float32 parameters, batch, shapes and thread count
(torch.set_num_threads(2)): pre-LN blocks, separate q/k/v/o projections with biases, GELU (tanh),
learned positions, final LN, untied unembedding, AdamW with decay on the same tensors, cross-entropy
on the masked positions. PyTorch shares this process's OpenMP runtime and so its wait policy, which both
leave at its default (a worker spins a while after a parallel loop; until 7 December 2026 our code set
OMP_WAIT_POLICY=passive, which slowed PyTorch's step 1.2-2.8x: docs/PERFORMANCE.md). Ours and PyTorch's steps are timed alternately, so a change in the load of
this shared machine falls on both; every number is a median over repeats, with the load beside it.

Also reported: our step with Numba held to one thread (the bijection paper preset trains that way);
each Numba kernel against its NumPy reference at the training shapes; the step's
GFLOP/s (matmul + attention flops counted analytically) beside a large float32 matmul (sgemm) on this
machine; the step's layer products (its kernels.PRODUCTS calls, recorded and run again alone)
and what half the sgemm rate would leave for the rest of the step; the roofline line (bench/roofline.py:
each op's own time inside a step, by category, against the 2-thread sgemm); Numba compile time (fresh cache
against cached). The peak memory of a training run, and how a step's time grows with its sizes: bench/scaling.py.
The last line is `worst ratio ours/torch: R` (R = nan without PyTorch). The other families (LSTM, SSM) against
PyTorch: bench/recurrent.py.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("bench/transformer.py: run it as python -m bench.transformer, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as layers.py and train.py: BLAS threads fight Numba's

import argparse  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import bayesattn as ba  # noqa: E402
import kernels  # noqa: E402
import layers  # noqa: E402
import models  # noqa: E402
import optim  # noqa: E402
from bench import roofline  # noqa: E402
from tunnels import tasks  # noqa: E402
import training  # noqa: E402  (its train_step: the step is the one train.py takes)

WEIGHT_DECAY = 0.01     # decay on the matrices, so the step does that work too

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository: a child imports from it
THREADS = 2             # PyTorch's intra-op threads; Numba uses its default, one per core
LR = 1e-3               # a constant learning rate: the schedule costs nothing
SHAPES = {
    # name -> task and sizes, those the presets train (train.py PRESETS); bijection: vocab 40, classes 20,
    # T 38; sawtooth: vocab 20, classes 20, T 39; hmm: vocab 102, classes 5, T 72
    "bij-default": dict(task="bijection", width=64, layers=3, heads=2, batch=64),
    "bij-paper":   dict(task="bijection", width=64, layers=3, heads=2, batch=16),
    "saw-default": dict(task="sawtooth", width=64, layers=2, heads=2, batch=64),
    "saw-paper":   dict(task="sawtooth", width=64, layers=2, heads=2, batch=32),
    "hmm-paper":   dict(task="hmm", width=96, layers=6, heads=6, batch=32),
    "bij-b256":    dict(task="bijection", width=64, layers=3, heads=4, batch=256),   # the earlier paper preset
    # --quick
    "tiny-bij":    dict(task="bijection", V=6, width=16, layers=1, heads=2, batch=8),
    "tiny-hmm":    dict(task="hmm", K=4, width=16, layers=1, heads=2, batch=4),
}
FULL, QUICK = ["bij-default", "bij-paper", "saw-default", "saw-paper", "hmm-paper"], ["tiny-bij", "tiny-hmm"]


def fail(msg):
    """One clear line on stderr, exit code 2, no traceback."""
    print(f"python -m bench.transformer: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load():
    return "load %.2f %.2f %.2f" % os.getloadavg()


def median_ms(times):
    return 1e3 * float(np.median(times))


def spread(times):
    """Inter-quartile range in ms, the noise beside a median."""
    lo, hi = np.percentile(times, [25, 75])
    return f"IQR {1e3 * lo:.3g}-{1e3 * hi:.3g}"


def timed(f):
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def interleaved(fs, repeats, warmup):
    """Time every f in fs `repeats` times, alternating between them; -> list of lists of seconds."""
    for _ in range(warmup):
        for f in fs:
            f()
    times = [[] for _ in fs]
    for _ in range(repeats):
        for f, ts in zip(fs, times):
            ts.append(timed(f))
    return times


# ----------------------------------------------------------------------------
# the problem: config, parameters and one fixed batch of a shape

def task_settings(s):
    """The task's settings of a shape: its defaults, V or n_obs where the shape says."""
    return tasks.settings(s["task"], {"V": s.get("V"), "n_obs": s.get("K")})


def setup(name):
    s = SHAPES[name]
    settings = task_settings(s)
    sizes = tasks.sizes(s["task"], settings)
    cfg = ba.Config(vocab_size=sizes["vocab"], n_classes=sizes["classes"], max_len=sizes["max_len"],
                    d_model=s["width"], n_layers=s["layers"], n_heads=s["heads"], dtype="float32")
    batch = tasks.sample(s["task"], np.random.default_rng(0), s["batch"], settings)
    return cfg, ba.init_params(cfg, 0), batch


def one_thread(step):
    """The same step with Numba (and so the row-block split of the products) held to one thread."""
    def step_1():
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            step()
        finally:
            numba.set_num_threads(threads)
    return step_1


def ours_step(cfg, params, batch, family="transformer"):
    """-> a closure taking one training step of the family exactly as train.py does (training.train_step)."""
    state = optim.adamw_init(params)
    model = lambda p, tok, tgt, m: models.loss_and_grads(family, p, tok, tgt, m, cfg)
    decay = models.decay_set(family, params)

    def step():
        return training.train_step(model, params, state, batch["tokens"], batch["targets"], batch["mask"], LR,
                                   WEIGHT_DECAY, decay=decay)[0]
    return step


def product_flops(name, *args):
    """Flops of one call of a kernels product: a (N, K) @ b (K, M) and a (N, K)^T b (N, M) are both N K M
    multiply-adds; matmul_pair(a, b, x, y) is one of each."""
    pairs = [args[:2], args[2:]] if name == "matmul_pair" else [args]
    return sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs)


def step_products(step, keep_calls=False):
    """Record one step's matrix products (every call of a kernels.PRODUCTS function, with its arrays; a product
    called inside another counts once, in the outer). -> (closure running those calls again and nothing else,
    their flops, the number of products, a matmul_pair counting two)."""
    calls, depth = [], [0]
    originals = {name: getattr(kernels, name) for name in kernels.PRODUCTS}

    def recording(name, product):
        def record(*args):
            if not depth[0]:
                calls.append((name, product, args))
            depth[0] += 1
            try:
                return product(*args)
            finally:
                depth[0] -= 1
        return record
    for name, product in originals.items():
        setattr(kernels, name, recording(name, product))
    try:
        step()
    finally:
        for name, product in originals.items():
            setattr(kernels, name, product)
    flops = sum(product_flops(name, *args) for name, _, args in calls)

    def replay():
        for _, product, args in calls:
            product(*args)
    counted = sum(2 if name == "matmul_pair" else 1 for name, _, _ in calls)
    return (replay, flops, counted, calls) if keep_calls else (replay, flops, counted)


# ----------------------------------------------------------------------------
# the same transformer in PyTorch

def torch_step(cfg, params, batch):
    """-> (closure taking one PyTorch training step, the loss at the initial parameters)."""
    import torch
    import torch.nn.functional as F
    P = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    tokens, targets = torch.from_numpy(batch["tokens"]), torch.from_numpy(batch["targets"]).reshape(-1)
    mask = torch.from_numpy(batch["mask"].astype(np.float32)).reshape(-1)
    B, T = batch["tokens"].shape
    C, NH, K = cfg.d_model, cfg.n_heads, cfg.n_classes

    def linear(x, w, b):                                   # our weights are (Cin, Cout)
        return F.linear(x, P[w].t(), P[b])

    def heads(x):
        return x.view(B, T, NH, C // NH).transpose(1, 2)   # (B, NH, T, hs)

    def loss_fn():
        x = P["wte"][tokens] + P["wpe"][:T]                # (B, T, C)
        for l in range(cfg.n_layers):
            pre = f"blocks.{l}."
            h = F.layer_norm(x, (C,), P[pre + "ln1.g"], P[pre + "ln1.b"], eps=layers.LN_EPS)
            q, k, v = (heads(linear(h, pre + f"attn.w{n}", pre + f"attn.b{n}")) for n in "qkv")
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + linear(o.transpose(1, 2).reshape(B, T, C), pre + "attn.wo", pre + "attn.bo")
            h = F.layer_norm(x, (C,), P[pre + "ln2.g"], P[pre + "ln2.b"], eps=layers.LN_EPS)
            a = F.gelu(linear(h, pre + "mlp.w1", pre + "mlp.b1"), approximate="tanh")
            x = x + linear(a, pre + "mlp.w2", pre + "mlp.b2")
        x = F.layer_norm(x, (C,), P["lnf.g"], P["lnf.b"], eps=layers.LN_EPS)
        logits = linear(x, "unembed.w", "unembed.b").reshape(B * T, K)
        return (F.cross_entropy(logits, targets, reduction="none") * mask).sum() / mask.sum()

    return torch_stepper(list(P.items()), models.decay_set("transformer", params), loss_fn)


def torch_stepper(named, decay, loss_fn):
    """named: [(our parameter name, torch tensor)], decay: the names that decay. -> (closure taking one
    PyTorch step as train.py takes ours: AdamW with decay on those tensors, gradient clipping; the loss at
    the initial parameters)."""
    import torch
    groups = [dict(params=[p for n, p in named if n in decay], weight_decay=WEIGHT_DECAY),
              dict(params=[p for n, p in named if n not in decay], weight_decay=0.0)]
    opt = torch.optim.AdamW(groups, lr=LR, betas=training.BETAS, eps=1e-8)
    with torch.no_grad():
        loss0 = float(loss_fn())

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], training.GRAD_CLIP)
        opt.step()
        return loss
    return step, loss0


def torch_available():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(THREADS)
    return torch.__version__


# ----------------------------------------------------------------------------
# the kernels against their NumPy references

def kernel_cases(cfg, batch):
    """name -> (the twin as the step calls it, the bare Numba kernel, the NumPy op), each a call on random
    float32 inputs of the training shape. "As called" picks one thread for small inputs
    (kernels.run_kernel); the bare kernel is what the bench also times on one thread."""
    K_ = kernels
    rng = np.random.default_rng(1)
    B, T = batch["tokens"].shape
    N, C, M, K, NH = B * T, cfg.d_model, cfg.d_mlp, cfg.n_classes, cfg.n_heads
    r = lambda *s: rng.normal(size=s).astype(np.float32)
    tensors = [(r(*shape), r(*shape), np.zeros(shape, np.float32), np.zeros(shape, np.float32))
               for shape in ba.param_shapes(cfg).values()]                    # AdamW: p, g, m, v of every tensor
    n_params = sum(p.size for p, _, _, _ in tensors)

    def adamw(update):                                     # one AdamW step over every tensor, weight decay on all
        for p, g, m, v in tensors:
            update(p, g, m, v, LR, 0.9, 0.98, 1, 1e-8, WEIGHT_DECAY)

    def adamw_kernel(p, g, m, v, lr, beta1, beta2, t, eps, wd):
        K_.adamw_update_kernel(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), lr, beta1, beta2,
                               1 - beta1 ** t, 1 - beta2 ** t, eps, lr * wd)
    q, k, v, u = (r(B, NH, T, C // NH) for _ in range(4))
    _, alpha = ba.attention_forward.numpy(q, k, v)
    alpha = alpha.astype(np.float32)
    x, g, b, dy, h, dh = r(N, C), r(C), r(C), r(N, C), r(N, M), r(N, M)
    th = np.tanh(h)                                        # GELU's cached tanh z: any values in (-1, 1) do
    sh = (1 + th) / 2                                      # the twin's cache holds s = (1 + tanh z) / 2
    _, ln_cache = K_.layernorm_forward(x, g, b)
    mean, rstd = ln_cache[1:3]
    logits, t, w = r(B, T, K), batch["targets"], batch["mask"]
    z, wf = logits.reshape(-1, K), w.reshape(-1).astype(np.float64)
    tf = t.reshape(-1).astype(np.int64)
    tokens = batch["tokens"]                               # embedding backward: rows added by token
    idx = np.ascontiguousarray(tokens.reshape(-1))
    dx3 = x.reshape(B, T, C)
    return {
        f"attention fwd {q.shape}": (lambda: K_.attention_forward(q, k, v),
                                     lambda: K_.attention_forward_kernel(q, k, v),
                                     lambda: ba.attention_forward.numpy(q, k, v)),
        f"attention bwd {q.shape}": (lambda: K_.attention_backward(u, alpha, q, k, v),
                                     lambda: K_.attention_backward_kernel(u, alpha, q, k, v),
                                     lambda: ba.attention_backward.numpy(u, alpha, q, k, v)),
        f"layernorm fwd {x.shape}": (lambda: K_.layernorm_forward(x, g, b),
                                     lambda: K_.layernorm_forward_kernel(x, g, b, layers.LN_EPS),
                                     lambda: layers.layernorm_forward.numpy(x, g, b)),
        f"layernorm bwd {x.shape}": (lambda: K_.layernorm_backward(dy, ln_cache),
                                     lambda: K_.layernorm_backward_kernel(dy, x, mean, rstd, g),
                                     lambda: layers.layernorm_backward.numpy(dy, ln_cache)),
        f"gelu fwd {h.shape}": (lambda: K_.gelu_forward(h), lambda: K_.gelu_forward_kernel(h),
                                lambda: layers.gelu_forward.numpy(h)),
        f"gelu bwd {h.shape}": (lambda: K_.gelu_backward(dh, (h, sh)), lambda: K_.gelu_backward_kernel(dh, h, sh),
                                lambda: layers.gelu_backward.numpy(dh, (h, th))),
        f"scatter-add {x.shape}": (lambda: K_.embedding_backward(dx3, (tokens, cfg.vocab_size)),
                                   lambda: K_.scatter_add_kernel(x, idx, cfg.vocab_size),
                                   lambda: layers.embedding_backward.numpy(dx3, (tokens, cfg.vocab_size))),
        f"cross-entropy {logits.shape}": (lambda: K_.cross_entropy(logits, t, w),
                                          lambda: K_.cross_entropy_hard_kernel(z, tf, wf, float(wf.sum())),
                                          lambda: layers.cross_entropy.numpy(logits, t, w)),
        f"adamw ({n_params} parameters)": (lambda: adamw(K_.adamw_update), lambda: adamw(adamw_kernel),
                                           lambda: adamw(optim.adamw_update.numpy)),
    }


@numba.njit(parallel=True, cache=True)
def _touch_rows(x):
    """A parallel loop with next to no work: its time is the cost of starting one."""
    for i in numba.prange(x.shape[0]):
        x[i] += 1.0


def parallel_start_us(repeats):
    """Median microseconds of one almost empty parallel loop, on all Numba threads and on one
    (the one-thread call includes the two set_num_threads calls, as bayesattn.run_kernel makes)."""
    x = np.zeros(64)
    call = lambda: _touch_rows(x)
    t_all, t_one = interleaved([call, one_thread(call)], repeats, warmup=3)
    return 1e6 * np.median(t_all), 1e6 * np.median(t_one)


def bench_kernels(cfg, batch, repeats):
    """Prints one line per kernel; -> the smallest speed-up (reference time / time as called)."""
    worst = math.inf
    for name, (called, bare, ref) in kernel_cases(cfg, batch).items():
        tk, t1, tr = interleaved([called, one_thread(bare), ref], repeats, warmup=2)
        speedup = np.median(tr) / np.median(tk)
        worst = min(worst, speedup)
        print(f"    {name:34s} numba {median_ms(tk):8.3f} ms (1 thread {median_ms(t1):8.3f})   "
              f"numpy {median_ms(tr):8.3f} ms   x{speedup:5.1f}{'' if speedup >= 3 else '   (target x3 not met)'}")
    return worst


# ----------------------------------------------------------------------------
# measurements in fresh processes: sgemm ceiling, compile time

def child(code, env=None, timeout=600):
    """Run `code` in a fresh Python started in the repository's folder (so it imports as this one does); -> its
    stdout, stripped."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **(env or {})}, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"child process failed: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


SGEMM = """
import time, numpy as np
n, reps = {n}, {reps}
a, b = (np.random.default_rng(0).normal(size=(n, n)).astype(np.float32) for _ in range(2))
a @ b
ts = []
for _ in range(reps):
    t = time.perf_counter(); a @ b; ts.append(time.perf_counter() - t)
print(2 * n ** 3 / np.median(ts) / 1e9)
"""


def sgemm_gflops(threads, n, reps):
    return float(child(SGEMM.format(n=n, reps=reps), env={"OPENBLAS_NUM_THREADS": str(threads)}))


COMPILE = """
import time
t0 = time.perf_counter()
import numpy as np, bayesattn as ba, kernels, models
cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=1, n_heads=2)
rng = np.random.default_rng(0)
with kernels.enabled():
    models.loss_and_grads("transformer", ba.init_params(cfg), rng.integers(0, 7, (2, 6)), rng.integers(0, 5, (2, 6)),
                          np.ones((2, 6)), cfg)
print(time.perf_counter() - t0)
"""


def compile_seconds():
    """Import + first float32 step in a fresh process: with an empty Numba cache, then with it filled."""
    with tempfile.TemporaryDirectory() as cache:
        env = {"NUMBA_CACHE_DIR": cache}                   # leaves the project's own cache alone
        return float(child(COMPILE, env)), float(child(COMPILE, env))


# ----------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.transformer", description=__doc__.split("\n\n")[0])
    p.error = fail
    p.add_argument("--quick", action="store_true", help=f"tiny shapes ({', '.join(QUICK)}), few repeats")
    p.add_argument("--repeats", type=int, help="timed steps per shape (default 40; --quick: 5)")
    p.add_argument("--shapes", help=f"comma-separated subset of {', '.join(SHAPES)}")
    p.add_argument("--profile", action="store_true", help="also print cProfile's hottest functions of our step")
    p.add_argument("--tricks", action="store_true", help="only: the step without each speed trick of kernels.py")
    p.add_argument("--products", action="store_true",
                   help="only: each layer product of a step, one whole BLAS call against as the step runs it")
    p.add_argument("--sgemm", action="store_true", help="only: this machine's one-thread 2048x2048 float32 sgemm "
                   "in GFLOP/s (seconds), to scale the documents' times")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 5 if args.quick else 40
    if args.repeats < 1:
        fail(f"--repeats {args.repeats}: must be a positive integer")
    args.shapes = shape_list(args.shapes, SHAPES, QUICK if args.quick else FULL, fail)
    return args


def shape_list(text, allowed, default, fail, flag="--shapes"):
    """--shapes (or another flag's list): the comma-separated names in text (default when None), each one of
    allowed; else fail(one line)."""
    if text is None:
        return list(default)
    shapes = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in allowed]
    if unknown or not shapes:
        fail(f"{flag} {','.join(unknown) or '(empty)'}: allowed are {', '.join(allowed)}")
    return shapes


TRICKS = """
import numpy as np, kernels, layers
from bench import transformer as bench
cfg, params, batch = bench.setup({name!r})
step = bench.ours_step(cfg, params, batch)
{without}
def variant():
    with without():
        step()
with kernels.enabled():
    times = bench.interleaved([step, variant], {repeats}, warmup=3)
print(*(1e3 * np.median(t) for t in times))
"""
# each trick a code can switch off around one step (a context manager `without`): timed alternately with the
# step as trained, in one process
SWITCHED = {
    "run_kernel's other choice (every kernel on all threads, the small ones too)":
        ("kernels", "PARALLEL_MIN_US", "0.0"),
    "products not split by rows": ("kernels", "SPLIT_FLOPS", "float('inf')"),
    "a layer's two backward products in turn, each cut by rows (not side by side)":
        ("kernels", "matmul_pair", "lambda a, b, x, y: (kernels.matmul(a, b), kernels.matmul_tn(x, y))"),
}
WITHOUT = """
import contextlib
@contextlib.contextmanager
def without():
    old = {module}.{name}
    {module}.{name} = {value}
    try:
        yield
    finally:
        {module}.{name} = old
"""
NO_TWINS = "without = lambda: layers.use_twins({})"
NO_ATTENTION_TWINS = "without = lambda: layers.use_twins({k: f for k, f in layers.FAST.items() if not k.startswith('attention')})"
# each trick only a fresh process can switch off (how the kernels were compiled, how malloc was set at import):
# the variant's process against one as trained, not alternated
ENVIRONMENT = {"math.exp instead of exp32": {"BAYESATTN_EXP32": "0"},
               "glibc's malloc thresholds (no keep_freed_memory)": {"BAYESATTN_MALLOPT": "0"}}


def tricks(name, repeats):
    """The step at one shape without each speed trick of kernels.py -> {variant: (median ms as trained, median
    ms without it)}: a trick a code can switch off alternately with the step as trained in one process, the
    others in a process of their own against one as trained (the compiled exp depends on how the kernels were
    compiled, the malloc thresholds on the process's start)."""
    def run(without, cache, env=None):
        return tuple(map(float, child(TRICKS.format(name=name, repeats=repeats, without=without),
                                      {"NUMBA_CACHE_DIR": cache, **(env or {})}).split()))
    nothing = "import contextlib\nwithout = contextlib.nullcontext"
    with tempfile.TemporaryDirectory() as cache:
        out = {label: run(WITHOUT.format(module=m, name=n, value=v), cache) for label, (m, n, v) in SWITCHED.items()}
        out["the NumPy path (no twin at all)"] = run(NO_TWINS, cache)
        out["the attention twins off (the NumPy attention)"] = run(NO_ATTENTION_TWINS, cache)
        trained = run(nothing, cache)[0]
    for label, env in ENVIRONMENT.items():
        with tempfile.TemporaryDirectory() as fresh:         # Numba's cache does not see the environment
            out[label] = (trained, run(nothing, fresh, env)[0])
    return out


def product_table(name, repeats):
    """Every distinct layer product of one step at a shape (kernels.PRODUCTS calls, step_products), timed as the
    step runs it (cut by rows, or a pair side by side, where kernels' thresholds say) against one whole BLAS call
    a product on this thread, alternated: -> [(call, multiply-adds of its (first) product, whole ms, as called ms)].
    The thresholds SPLIT_FLOPS and PAIR_FLOPS are read off this table."""
    cfg, params, batch = setup(name)
    _, _, _, calls = step_products(ours_step(cfg, params, batch), keep_calls=True)
    seen, rows = set(), []
    for product_name, product, args in calls:
        key = (product_name,) + tuple(a.shape for a in args)
        if key in seen:
            continue
        seen.add(key)
        if product_name == "matmul_pair":
            whole = lambda a=args: (a[0] @ a[1], a[2].T @ a[3])
        elif product_name == "matmul_tn":
            whole = lambda a=args: a[0].T @ a[1]
        else:
            whole = lambda a=args: a[0] @ a[1]
        t_whole, t_called = interleaved([whole, lambda p=product, a=args: p(*a)], repeats, warmup=3)
        shapes = " x ".join(f"{a.shape[0]}x{a.shape[1]}" for a in args)
        first = args[0].shape[0] * args[0].shape[1] * args[1].shape[1]    # what the thresholds are compared with
        rows.append((f"{product_name}({shapes})", first, median_ms(t_whole), median_ms(t_called)))
    return rows


def profile_step(step, n=10):
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        step()
    prof.disable()
    stats = pstats.Stats(prof).sort_stats("tottime")
    total = sum(v[2] for v in stats.stats.values())
    for (path, line, fn), (_, calls, tottime, _, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:8]:
        print(f"      {100 * tottime / total:5.1f}%  {1e3 * tottime / n:7.2f} ms/step  "
              f"{os.path.basename(path)}:{line}({fn})")


def main(argv=None):
    args = parse_args(argv)
    with kernels.enabled():                                # the fast path, as train.py runs
        return bench(args)


def bench(args):
    if args.sgemm:                                         # the number the documents' times are scaled by
        print(f"sgemm 2048x2048 float32, 1 BLAS thread (best of 3 runs): {max(sgemm_gflops(1, 2048, 7) for _ in range(3)):.0f} "
              f"GFLOP/s  ({load()})")
        return
    if args.products:
        print(f"python -m bench.transformer --products  {load()}  numba {numba.__version__} "
              f"({numba.get_num_threads()} threads)  repeats {args.repeats}; kernels.SPLIT_FLOPS = {kernels.SPLIT_FLOPS:,}, "
              f"PAIR_FLOPS = {kernels.PAIR_FLOPS:,} multiply-adds")
        for name in args.shapes:
            print(f"{name}:")
            for call, madds, whole, called in product_table(name, args.repeats):
                print(f"  {call:50s} {madds / 1e6:6.1f} M multiply-adds a product  whole, one thread {whole:7.3f} ms  "
                      f"as the step runs it {called:7.3f} ms  ({whole / called:.2f}x)")
        print(f"({load()})")
        return
    if args.tricks:
        print(f"python -m bench.transformer --tricks  {load()}  numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads)  "
              f"repeats {args.repeats}; median ms of one training step as trained and without each trick: alternated in one "
              f"process, except {' and '.join(ENVIRONMENT)} (a process of their own against one as trained)")
        for name in args.shapes:
            t = tricks(name, args.repeats)
            print(f"{name}: " + "; ".join(f"{k} {b:.2f} ms against {a:.2f} ({b / a:.2f}x)" for k, (a, b) in t.items())
                  + f"  ({load()})")
        return
    torch_version = torch_available()
    warmup = 2 if args.quick else 5
    print(f"python -m bench.transformer  {load()}  numpy {np.__version__}  numba {numba.__version__} "
          f"({numba.config.NUMBA_NUM_THREADS} threads)  torch {torch_version or 'absent'} "
          f"({THREADS} threads)  OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}  "
          f"repeats {args.repeats}")

    n, reps = (256, 3) if args.quick else (2048, 7)
    # the ceiling is the best of three runs: on a shared machine a run can land on a busy core
    ceiling = {t: max(sgemm_gflops(t, n, reps) for _ in range(3)) for t in (1, 2)}
    print(f"sgemm {n}x{n} float32 (best of 3 runs): {ceiling[1]:.1f} GFLOP/s at 1 BLAS thread, "
          f"{ceiling[2]:.1f} GFLOP/s at 2; "
          f"each of the step's BLAS calls uses {os.environ['OPENBLAS_NUM_THREADS']} (OPENBLAS_NUM_THREADS), "
          f"large products split in row blocks over the Numba threads  ({load()})")

    bandwidth, line = roofline.bandwidths()
    print(line + f"  ({load()})")

    start_all, start_one = parallel_start_us(10 * args.repeats)
    print(f"an almost empty parallel loop: {start_all:.1f} us on {numba.get_num_threads()} Numba threads, "
          f"{start_one:.1f} us held to one (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset: spins a while)')}; "
          f"kernels.PARALLEL_MIN_US = {kernels.PARALLEL_MIN_US:g})")

    ratios = {}
    for name in args.shapes:
        cfg, params, batch = setup(name)
        B, T = batch["tokens"].shape
        print(f"\n{name}: vocab {cfg.vocab_size}, classes {cfg.n_classes}, T {T}, width {cfg.d_model}, "
              f"{cfg.n_layers} layers, {cfg.n_heads} heads, batch {B}, {models.count_params(params)} parameters")
        ours = ours_step(cfg, params, batch)
        if torch_version:
            theirs, loss_torch = torch_step(cfg, params, batch)
            loss_ours, _ = models.loss_and_grads("transformer", params, batch["tokens"], batch["targets"], batch["mask"], cfg)
            print(f"  initial loss: ours {loss_ours:.6f}  torch {loss_torch:.6f}  (same model, same batch)")
        products, product_flops, n_products = step_products(ours)    # takes a step: after the losses
        fs = [ours, one_thread(ours), products] + ([theirs] if torch_version else [])
        times = interleaved(fs, args.repeats, warmup)
        times_1, times_products, times[1:] = times[1], times[2], times[3:]
        flops = ba.step_flops(cfg, B, T)
        gflops = flops / np.median(times[0]) / 1e9
        print(f"  step: ours  {median_ms(times[0]):8.2f} ms ({spread(times[0])})  {gflops:.1f} GFLOP/s = "
              f"{100 * gflops / ceiling[1]:.0f}% of 1-thread sgemm, {100 * gflops / ceiling[2]:.0f}% of 2-thread "
              f"({flops / 1e9:.3f} GFLOP/step)  ({load()})")
        print(f"  step: ours with 1 Numba thread {median_ms(times_1):8.2f} ms ({spread(times_1)})")
        # how far the products alone get, and what the target of half the 2-thread sgemm rate leaves
        # for everything else (attention, LayerNorm, GELU, AdamW, ...). Replayed back to back they run
        # warm, so whatever extra they cost inside a real step lands in "the rest".
        product_gflops = product_flops / np.median(times_products) / 1e9
        half_ms = 1e3 * flops / (0.5 * ceiling[2] * 1e9)
        print(f"  the step's {n_products} layer products alone (kernels.PRODUCTS; attention's own products "
              f"count in the rest): {median_ms(times_products):.2f} ms "
              f"({spread(times_products)})  {product_gflops:.1f} GFLOP/s = {100 * product_gflops / ceiling[2]:.0f}% "
              f"of 2-thread sgemm; at 50% a step takes {half_ms:.1f} ms, which leaves "
              f"{half_ms - median_ms(times_products):.1f} ms for the rest (now "
              f"{median_ms(times[0]) - median_ms(times_products):.1f} ms)")
        if torch_version:
            ratios[name] = np.median(times[0]) / np.median(times[1])
            print(f"  step: torch {median_ms(times[1]):8.2f} ms ({spread(times[1])})  "
                  f"ratio ours/torch {ratios[name]:.2f}")
        parts_s, total_s = roofline.exclusive_times(ours, max(2, args.repeats // 4))
        print(f"  roofline: {roofline.line(roofline.split(parts_s, total_s), total_s, flops, ceiling[2])}  ({load()})")
        print(f"  memory floors: {roofline.memory_line(roofline.exclusive_bytes(ours), parts_s, bandwidth)}")
        att_flops, att_s = ba.attention_flops(cfg, B, T), roofline.by_category(parts_s)["attention"]
        print(f"  attention: its causal products {att_flops / 1e9:.3f} GFLOP a step, {1e3 * att_flops / (ceiling[2] * 1e9):.2f} ms "
              f"at the 2-thread sgemm; the whole of attention (the products, the softmax, the E- and M-steps' "
              f"loops) takes {1e3 * att_s:.2f} ms: {att_flops / att_s / 1e9:.1f} GFLOP/s of its products over that")
        if args.profile:
            print("  cProfile of our step (tottime):")
            profile_step(ours)
        print(f"  kernels against their NumPy references ({load()}):")
        bench_kernels(cfg, batch, 3 * args.repeats)

    cold, cached = compile_seconds()
    print(f"\nNumba compile: import + first step in a fresh process {cold:.1f} s with the cache cleared, "
          f"{cached:.1f} s cached  ({load()})")
    worst = max(ratios.values()) if ratios else float("nan")
    print(f"worst ratio ours/torch: {worst:.2f}" if ratios else "worst ratio ours/torch: nan")


if __name__ == "__main__":
    main()
