"""roofline: where one training step's time goes, op by op, for any family: the split the benches print.

Every op the step calls through the twin switch (layers.FAST: linear, LayerNorm, GELU, attention,
the loss, the embedding, and each family's own ops, as the LSTM's and the SSM's recurrences), the layer
products inside them (kernels.PRODUCTS) and the optimiser's two calls (optim.clip_grad_norm,
optim.adamw_step) are timed while the step runs, each call's time less the time of the timed calls inside it
(its own, exclusive time), so the parts add up to the step: what no timed call holds is the rest (Python,
the models' own arrays and copies between ops).
"""
import collections
import time

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
    fast = dict(layers.FAST)
    products = {name: getattr(kernels, name) for name in kernels.PRODUCTS}
    opt = optim.clip_grad_norm, optim.adamw_step
    layers.FAST.update({k: timed(k, f) for k, f in fast.items()})
    for name, f in products.items():
        setattr(kernels, name, timed(name, f))
    optim.clip_grad_norm, optim.adamw_step = timed("clip_grad_norm", opt[0]), timed("adamw_step", opt[1])
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        total = (time.perf_counter() - t0) / n
    finally:
        layers.FAST.clear()
        layers.FAST.update(fast)
        for name, f in products.items():
            setattr(kernels, name, f)
        optim.clip_grad_norm, optim.adamw_step = opt
    return {k: v / n for k, v in totals.items()}, total


def split(op_seconds, total):
    """{op: seconds} and the step's seconds -> {category: seconds}, REST the part no timed op holds, in
    CATEGORIES' order, then the family's own ops, then the rest."""
    out = {c: 0.0 for c, _ in CATEGORIES}
    for name, s in op_seconds.items():
        c = category(name)
        out[c] = out.get(c, 0.0) + s
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
