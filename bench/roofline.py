"""roofline: where one training step's time goes, op by op, for any family: the split the benches print.

Every op the step calls through the twin switch (layers.FAST: linear, LayerNorm, GELU, attention,
the loss, the embedding, and each family's own ops, as the LSTM's and the SSM's recurrences), the layer
products inside them (kernels.PRODUCTS) and the optimiser's two calls (optim.clip_grad_norm,
optim.adamw_step) are timed while the step runs, each call's time less the time of the timed calls inside it
(its own, exclusive time), so the parts add up to the step: what no timed call holds is the rest (Python,
the models' own arrays and copies between ops).
"""
import collections
import contextlib
import sys
import time

import numba
import numpy as np

import kernels
import layers
import optim

# a category per op, by its name; a family's own ops (its twins' names) are "the family's own ops"
CATEGORIES = (("products", kernels.PRODUCTS),
              ("attention", ("attention_forward", "attention_backward")),
              ("norms and GELU", ("layernorm_forward", "layernorm_backward", "gelu_forward", "gelu_backward")),
              ("the loss", ("cross_entropy",)),
              ("embedding", ("embedding_forward", "embedding_backward")),
              ("linear, outside its product (bias, reshapes)", ("linear_forward", "linear_backward")),
              ("the optimiser", ("clip_grad_norm", "adamw_step", "adamw_update")))
OWN = "the family's own ops"
REST = "the rest (Python, the models' arrays, copies)"


def category(name):
    return next((c for c, names in CATEGORIES if name in names), OWN)


@contextlib.contextmanager
def every_op(wrap):
    """Inside: every op the step calls through the twin switch, every layer product and the optimiser's two
    calls replaced by wrap(name, op); switched back however the block ends."""
    fast = dict(layers.FAST)
    products = {name: getattr(kernels, name) for name in kernels.PRODUCTS}
    opt = optim.clip_grad_norm, optim.adamw_step
    layers.FAST.update({k: wrap(k, f) for k, f in fast.items()})
    for name, f in products.items():
        setattr(kernels, name, wrap(name, f))
    optim.clip_grad_norm, optim.adamw_step = wrap("clip_grad_norm", opt[0]), wrap("adamw_step", opt[1])
    try:
        yield
    finally:
        layers.FAST.clear()
        layers.FAST.update(fast)
        for name, f in products.items():
            setattr(kernels, name, f)
        optim.clip_grad_norm, optim.adamw_step = opt


@contextlib.contextmanager
def kernel_estimates():
    """Inside: every call of kernels.run_kernel (in each module that holds it by that name) recorded, as (the
    kernel's name, its estimated one-thread time in microseconds: items x ns_per_item / 1000, the number
    run_kernel compares with kernels.PARALLEL_MIN_US), in the list it yields; switched back however it ends."""
    found, run_kernel = [], kernels.run_kernel

    def record(kernel, items, ns_per_item, *args):
        found.append((kernel.__name__, items * ns_per_item / 1e3))
        return run_kernel(kernel, items, ns_per_item, *args)
    holders = [m for m in list(sys.modules.values()) if getattr(m, "run_kernel", None) is run_kernel]
    for m in holders:
        m.run_kernel = record
    try:
        yield found
    finally:
        for m in holders:
            m.run_kernel = run_kernel


def exclusive_times(step, n=5):
    """Run step n times with every op timed (module docstring) -> ({op name: exclusive seconds a step}, the
    step's seconds a step). The ops are switched back however the step ends."""
    totals = collections.defaultdict(float)
    inner = [0.0]                                        # the timed time inside the call now running

    def timed(name, f):
        def call(*a, **k):
            inner.append(0.0)
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                totals[name] += dt - inner.pop()
                inner[-1] += dt
        return call
    with every_op(timed):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        total = (time.perf_counter() - t0) / n
    return {k: v / n for k, v in totals.items()}, total


def arrays(obj, found=None):
    """Every NumPy array in obj (an array, or tuples, lists and dicts of them, nested) -> [(first byte, one
    past the last, its bytes, whether it is contiguous)]: the range of memory it spans and what it holds (a
    strided view holds fewer bytes than it spans)."""
    found = [] if found is None else found
    if isinstance(obj, np.ndarray):
        lo = hi = obj.__array_interface__["data"][0]
        for n, s in zip(obj.shape, obj.strides):
            lo, hi = (lo + s * (n - 1), hi) if s < 0 else (lo, hi + s * (n - 1))
        contiguous = obj.flags.c_contiguous or obj.flags.f_contiguous
        found.append((lo, hi + obj.itemsize if obj.size else lo, obj.nbytes, contiguous))
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            arrays(x, found)
    elif isinstance(obj, dict):
        for x in obj.values():
            arrays(x, found)
    return found


def merged(ranges):
    """Byte ranges [(lo, hi)] -> the same memory as sorted, disjoint ranges."""
    out = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def overlap(lo, hi, ranges):
    """Bytes of [lo, hi) inside the disjoint ranges."""
    return sum(max(0, min(hi, b) - max(lo, a)) for a, b in ranges)


def distinct_bytes(found, below=()):
    """The bytes the arrays found (arrays()) hold, each byte once, less those in the ranges below: a contiguous
    array counts the bytes it spans, a strided view its own bytes only where it spans memory no other array
    and nothing below does (else nothing: a floor, never more than the arrays hold)."""
    below = merged(below)
    whole = merged([(lo, hi) for lo, hi, _, contiguous in found if contiguous])
    total = sum(hi - lo - overlap(lo, hi, below) for lo, hi in whole)
    views = [(lo, hi, n) for lo, hi, n, contiguous in found if not contiguous]
    for i, (lo, hi, n) in enumerate(views):
        others = merged(whole + below + [(a, b) for j, (a, b, _) in enumerate(views) if j != i])
        total += min(n, hi - lo) if overlap(lo, hi, others) == 0 else 0     # a broadcast view holds its span only
    return total


def exclusive_bytes(step):
    """Run step once with every op watched -> {op name: the bytes its calls must move a step}: each call's
    arguments and results, every byte of them once (it is read or written at least once), less the memory a
    watched call inside it spans. A floor on the traffic: an array read twice, or read and written back in
    place, counts once, and memory a product inside the call also touches counts with the product (a linear
    op's floor is its bias alone, though it adds the bias to the product's result in place and sums dout for
    the bias's gradient)."""
    totals = collections.defaultdict(int)
    inner = [[]]                                         # the byte ranges of the calls inside the running call

    def watched(name, f):
        def call(*a, **k):
            inner.append([])
            out = None
            try:
                out = f(*a, **k)
                return out
            finally:
                mine = arrays((a, k, out))
                below = inner.pop()
                totals[name] += distinct_bytes(mine, below)
                inner[-1].extend((lo, hi) for lo, hi, _, _ in mine)
        return call
    with every_op(watched):
        step()
    return dict(totals)


@numba.njit(parallel=True, cache=True)
def _copy_back_and_forth(a, b, parts, rounds):
    """rounds of two copies, b = a + 1 then a = b + 1 (an add is free beside the memory, and makes every copy
    show in the values), each of parts threads over its own part of the arrays (one parallel launch for them
    all, so small arrays measure the cache, not the launch)."""
    one = a.dtype.type(1)
    for p in numba.prange(parts):
        lo, hi = p * a.size // parts, (p + 1) * a.size // parts
        x, y = a[lo:hi], b[lo:hi]
        for _ in range(rounds):
            np.add(x, one, y)            # (element loops ran at a tenth of this: not vectorised)
            np.add(y, one, x)


def copy_bandwidth(nbytes, repeats=5):
    """The memory bandwidth the step's ops can see at a working set of 2 nbytes: the best of repeats runs of
    copies between two float32 arrays of nbytes each, on every Numba thread -> GB/s, counting what a copy of
    n bytes moves: n read, n written, and the n the cache reads before it writes them (write-allocate), so
    that the floor is one no op beats by reading more than it writes. About 2^30 bytes a run."""
    a = np.zeros(max(numba.get_num_threads(), nbytes // 4), dtype=np.float32)
    b = np.zeros_like(a)
    parts, rounds = numba.get_num_threads(), max(1, 2 ** 29 // (2 * a.nbytes))
    _copy_back_and_forth(a, b, parts, 1)                 # compiled and both arrays touched before the clock
    best = float("inf")
    for _ in range(repeats):
        a[:] = 0                                         # float32 counts exactly to 2^24: no round reaches it
        t0 = time.perf_counter()
        _copy_back_and_forth(a, b, parts, rounds)
        best = min(best, time.perf_counter() - t0)
    return 3 * (2 * a.nbytes) * rounds / best / 1e9


# working sets the bandwidth is measured at (two arrays of these bytes): in the per-core caches (this
# machine's L2 is 1 MiB a core), in the shared cache (its L3, 32 MiB) and in memory
BANDWIDTH_SIZES = {"L2": 128 * 1024, "L3": 4 * 2 ** 20, "memory": 256 * 2 ** 20}


def bandwidths():
    """-> ({where: GB/s} at BANDWIDTH_SIZES, the line the benches print of it)."""
    bw = {k: copy_bandwidth(v) for k, v in BANDWIDTH_SIZES.items()}
    return bw, ("copy bandwidth on every Numba thread (best of 5), a copy of n bytes counted as 3n moved (read, "
                "written, read by the cache before the write): " +
                ", ".join(f"{gbs:.0f} GB/s in {where} (two arrays of {BANDWIDTH_SIZES[where] / 2 ** 20:g} MiB)"
                          for where, gbs in bw.items()))


def memory_line(op_bytes, op_seconds, bandwidth):
    """{op: bytes a step}, {op: seconds a step} and {where: GB/s} -> one line: per category outside the
    products, the MB it must move a step, its floor (those bytes at the fastest and at the slowest of the
    bandwidths this run measured) and the time it takes."""
    mb, sec = by_category(op_bytes), by_category(op_seconds)
    fast, slow = max(bandwidth.values()), min(bandwidth.values())
    return "; ".join(f"{c} {b / 1e6:.2f} MB, floor {1e3 * b / (fast * 1e9):.2f}-{1e3 * b / (slow * 1e9):.2f} ms, "
                     f"takes {1e3 * sec.get(c, 0.0):.2f} ms" for c, b in mb.items() if c != "products" and b > 0)


def by_category(per_op):
    """{op: a quantity} -> {category: its sum}, in CATEGORIES' order, then the family's own ops."""
    out = {c: 0 for c, _ in CATEGORIES}
    for name, s in per_op.items():
        c = category(name)
        out[c] = out.get(c, 0) + s
    return out


def split(op_seconds, total):
    """{op: seconds} and the step's seconds -> {category: seconds}, REST the part no timed op holds, in
    CATEGORIES' order, then the family's own ops, then the rest."""
    out = by_category(op_seconds)
    out[REST] = total - sum(op_seconds.values())
    return out


def line(parts, total, flops, sgemm):
    """One line: the step's ms and its FLOP rate as a share of the 2-thread sgemm, the products' ms, rate and
    share, then every other part's ms and share of the step."""
    prod = parts.get("products", 0.0)
    rate = lambda f, s: f / s / 1e9 if s > 0 else float("nan")
    head = (f"step {1e3 * total:.2f} ms, {flops / 1e9:.3f} GFLOP: {rate(flops, total):.1f} GFLOP/s = "
            f"{100 * rate(flops, total) / sgemm:.0f}% of 2-thread sgemm; products {1e3 * prod:.2f} ms "
            f"({100 * prod / total:.0f}% of the step)")
    rest = "; ".join(f"{c} {1e3 * s:.2f} ms ({100 * s / total:.0f}%)" for c, s in parts.items()
                     if c != "products" and abs(s) >= 0.005 * total)
    return head + "; " + rest
