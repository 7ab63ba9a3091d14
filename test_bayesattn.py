"""Gradient checks and kernel checks for bayesattn.py, layers.py, kernels.py and optim.py.

Finite differences are centred (h = 1e-5) in float64 on tiny shapes. For an op, the
check projects onto a random upstream gradient dout: the numerical directional
derivative sum((f(x+h e) - f(x-h e)) * dout) / 2h, one entry e at a time, gives the numerical
gradient. Relative error per tensor = max|a - n| / max(max|a|, max|n|): the worst difference
against the tensor's own scale (a per-entry ratio would blow up on entries that are ~0).
Every op's check and the whole model's run on both paths: the NumPy ops as written ("numpy") and
their twins in kernels.py ("numba"), chosen by the `path` fixture. No test may leave the switch on:
`switch_is_off_around_every_test` checks layers.FAST before and after each one.
"""

import math
import os
import subprocess
import sys
from contextlib import contextmanager

import numba
import numpy as np
import pytest

import bayesattn as ba
import kernels
import layers
import models
import optim

pytestmark = pytest.mark.plain_python   # .ci/run checks this module again without the JIT

H = 1e-5
GRAD_TOL = 1e-6                               # worst relative error allowed per tensor
KERNEL_TOL = {np.float32: 2e-5, np.float64: 1e-12}   # Numba kernel vs NumPy reference, relative


def rel_error(a, n):
    return float(np.abs(a - n).max() / max(np.abs(a).max(), np.abs(n).max(), 1e-300))


def numerical_grad(f, x, dout):
    """d/dx of sum(f(x) * dout) by centred differences, one entry at a time (x changed in place)."""
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + H
        fp = np.sum(f(x) * dout)
        x[idx] = old - H
        fm = np.sum(f(x) * dout)
        x[idx] = old
        grad[idx] = (fp - fm) / (2 * H)
    return grad


def assert_grads(analytic, numeric, tol=GRAD_TOL):
    """analytic, numeric: dicts name -> array. Fails naming every tensor over tol and its error."""
    errors = {name: rel_error(analytic[name], numeric[name]) for name in numeric}
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= tol}
    assert not bad, f"relative gradient error above {tol:g}: {bad}"
    return errors


@pytest.fixture(autouse=True)
def switch_is_off_around_every_test():
    """Every test starts and ends on the NumPy path: a test (or the code it runs) that leaves the fast path
    on fails here, instead of silently running the twins in the "numpy" tests after it."""
    assert layers.FAST == {}, f"the fast path was left on before this test: {sorted(layers.FAST)}"
    yield
    assert layers.FAST == {}, f"this test left the fast path on: {sorted(layers.FAST)}"


@pytest.fixture(params=["numpy", "numba"])
def path(request):
    """Run the test on the NumPy ops as written, then on their Numba twins; the switch comes back after."""
    with kernels.enabled() if request.param == "numba" else layers.use_twins({}):
        yield request.param


def own_op(op, path):
    """The code one path runs for a twinned op: its NumPy function, or its twin in kernels.py."""
    return op.numpy if path == "numpy" else getattr(kernels, op.__name__)


# ----------------------------------------------------------------------------
# every op's backward against finite differences, on both paths

def test_linear_backward(path):
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 5)), rng.normal(size=5)
    dout = rng.normal(size=(2, 3, 5))
    _, cache = layers.linear_forward(x, w, b)
    dx, dw, db = layers.linear_backward(dout, cache)
    f = lambda: layers.linear_forward(x, w, b)[0]
    assert_grads({"x": dx, "w": dw, "b": db},
                 {"x": numerical_grad(lambda _: f(), x, dout), "w": numerical_grad(lambda _: f(), w, dout),
                  "b": numerical_grad(lambda _: f(), b, dout)})


def test_embedding_backward(path):
    rng = np.random.default_rng(1)
    wte, wpe = rng.normal(size=(6, 4)), rng.normal(size=(5, 4))
    tokens = np.array([[0, 2, 2, 5], [1, 0, 3, 3]])             # repeated tokens must add up
    dout = rng.normal(size=(2, 4, 4))
    _, cache = layers.embedding_forward(wte, wpe, tokens)
    dwte, dwpe = layers.embedding_backward(dout, cache)
    f = lambda _: layers.embedding_forward(wte, wpe, tokens)[0]
    num_pe = numerical_grad(f, wpe, dout)
    assert_grads({"wte": dwte, "wpe": dwpe}, {"wte": numerical_grad(f, wte, dout), "wpe": num_pe[:4]})
    assert np.all(num_pe[4] == 0)


def test_layernorm_backward(path):
    rng = np.random.default_rng(2)
    x, g, b = rng.normal(size=(2, 3, 6)), rng.normal(size=6), rng.normal(size=6)
    dout = rng.normal(size=(2, 3, 6))
    _, cache = layers.layernorm_forward(x, g, b)
    dx, dg, db = layers.layernorm_backward(dout, cache)
    f = lambda _: layers.layernorm_forward(x, g, b)[0]
    assert_grads({"x": dx, "g": dg, "b": db},
                 {"x": numerical_grad(f, x, dout), "g": numerical_grad(f, g, dout), "b": numerical_grad(f, b, dout)})


def test_gelu_backward(path):
    rng = np.random.default_rng(3)
    x, dout = rng.normal(size=(4, 7)) * 2, rng.normal(size=(4, 7))
    _, cache = layers.gelu_forward(x)
    assert_grads({"x": layers.gelu_backward(dout, cache)},
                 {"x": numerical_grad(lambda _: layers.gelu_forward(x)[0], x, dout)})


def test_attention_backward(path):
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(2, 2, 5, 3)) for _ in range(3))
    u = rng.normal(size=(2, 2, 5, 3))                           # u = dL/do, the upstream error signal
    _, alpha = ba.attention_forward(q, k, v)
    dq, dk, dv = ba.attention_backward(u, alpha, q, k, v)
    f = lambda _: ba.attention_forward(q, k, v)[0]
    assert_grads({"q": dq, "k": dk, "v": dv},
                 {"q": numerical_grad(f, q, u), "k": numerical_grad(f, k, u), "v": numerical_grad(f, v, u)})


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
def test_cross_entropy_backward(soft, path):
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(2, 4, 5))
    mask = np.array([[1, 0, 1, 1], [0, 1, 1, 0]], dtype=float)
    targets = rng.dirichlet(np.ones(5), size=(2, 4)) if soft else rng.integers(0, 5, (2, 4))
    loss, dlogits = layers.cross_entropy(logits, targets, mask)
    num = numerical_grad(lambda z: np.array(layers.cross_entropy(z, targets, mask)[0]), logits, np.array(1.0))
    assert_grads({"logits": dlogits}, {"logits": num})
    assert np.all(dlogits[mask == 0] == 0)


def test_cross_entropy_by_hand(path):
    """Two positions, three classes, logits 0: softmax is 1/3 each. A hard target costs ln 3 nats; the soft
    target (1/2, 1/2, 0) costs ln 3 too; the unsupervised position counts for nothing. dlogits of the hard
    target at the supervised row: (1/3 - 1, 1/3, 1/3) / 1."""
    logits = np.zeros((1, 2, 3))
    mask = np.array([[1.0, 0.0]])
    loss, d = layers.cross_entropy(logits, np.array([[0, 2]]), mask)
    assert loss == pytest.approx(math.log(3)) and layers.bits(loss) == pytest.approx(math.log2(3))
    np.testing.assert_allclose(d[0, 0], [1 / 3 - 1, 1 / 3, 1 / 3])
    np.testing.assert_array_equal(d[0, 1], 0)
    loss, _ = layers.cross_entropy(logits, np.array([[[0.5, 0.5, 0.0], [1, 0, 0]]]), mask)
    assert loss == pytest.approx(math.log(3))


# ----------------------------------------------------------------------------
# the E-step: closed form against the explicit softmax Jacobian

def test_advantage_routing_equals_explicit_jacobian():
    rng = np.random.default_rng(6)
    T, hs = 6, 4
    q, k, v, u = (rng.normal(size=(1, 1, T, hs)) for _ in range(4))
    _, alpha = ba.attention_forward.numpy(q, k, v)
    ds = ba.advantage_routing(u, alpha, v)[0, 0]                # closed form: alpha * (b - b_bar)
    # step by step: dalpha_ij = u_i . v_j, then back through softmax with its Jacobian
    dalpha = (u @ np.swapaxes(v, -1, -2))[0, 0]                 # (T, T)
    for i in range(T):
        a = alpha[0, 0, i]
        jacobian = np.diag(a) - np.outer(a, a)                  # d alpha_i / d s_i
        np.testing.assert_allclose(ds[i], jacobian @ dalpha[i], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ds.sum(axis=-1), 0.0, atol=1e-13)   # routing is redistributed
    assert np.all(ds[np.triu_indices(T, 1)] == 0)                   # no gradient into the future


def test_value_update_is_responsibility_weighted():
    rng = np.random.default_rng(7)
    q, k, v, u = (rng.normal(size=(1, 1, 5, 3)) for _ in range(4))
    _, alpha = ba.attention_forward.numpy(q, k, v)
    dv = ba.value_update(u, alpha)[0, 0]
    for j in range(5):                                          # dv_j = sum_i alpha_ij u_i
        np.testing.assert_allclose(dv[j], sum(alpha[0, 0, i, j] * u[0, 0, i] for i in range(5)), rtol=1e-12)


# ----------------------------------------------------------------------------
# every twin in kernels.py equals its NumPy op

def _close(a, b, dtype):
    err = rel_error(np.asarray(a, np.float64), np.asarray(b, np.float64))
    assert err <= KERNEL_TOL[dtype], f"kernel vs reference relative error {err:.2e} > {KERNEL_TOL[dtype]:g} ({dtype.__name__})"


def test_every_twin_is_registered():
    """kernels.TWINS names exactly the ops marked @twin, and each twin has its op's signature."""
    import inspect
    ops = {name: op for module in (layers, ba, optim) for name, op in vars(module).items() if hasattr(op, "numpy")}
    assert set(kernels.TWINS) == set(ops)
    for name, op in ops.items():
        assert inspect.signature(getattr(kernels, name)).parameters.keys() == \
            inspect.signature(op.numpy).parameters.keys(), name


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_twin_is_the_numpy_update_bit_for_bit(dtype):
    """kernels.adamw_update does optim.adamw_update's operations in its order: three steps on a (5, 7) tensor
    with weight decay and a vector without give the same bits in p, m and v; a tensor that is not C-contiguous
    is updated in place all the same."""
    rng = np.random.default_rng(14)
    for shape, wd in (((5, 7), 0.1), ((7,), 0.0)):
        p, g = rng.normal(size=shape).astype(dtype), rng.normal(size=shape).astype(dtype)
        ours, ref = [p.copy(), np.zeros_like(p), np.zeros_like(p)], [p.copy(), np.zeros_like(p), np.zeros_like(p)]
        for t in (1, 2, 3):
            kernels.adamw_update(*ours[:1], g, *ours[1:], 0.01, 0.9, 0.98, t, 1e-8, wd)
            optim.adamw_update.numpy(*ref[:1], g, *ref[1:], 0.01, 0.9, 0.98, t, 1e-8, wd)
        for a, b in zip(ours, ref):
            assert np.array_equal(a, b)
        assert not np.array_equal(ours[0], p)
    # at lr 0 with weight decay the NumPy op still subtracts 0 * p, which turns -0.0 into +0.0: the same bits
    z = np.array([-0.0, 1.5, -2.0], dtype)
    z0, z1 = z.copy(), z.copy()
    kernels.adamw_update(z0, -z, np.zeros(3, dtype), np.zeros(3, dtype), 0.0, 0.9, 0.98, 1, 1e-8, 0.1)
    optim.adamw_update.numpy(z1, -z, np.zeros(3, dtype), np.zeros(3, dtype), 0.0, 0.9, 0.98, 1, 1e-8, 0.1)
    assert z0.tobytes() == z1.tobytes() and not np.signbit(z1[0])
    with pytest.raises(ValueError, match="a gradient of dtype float16 for a parameter of dtype"):
        kernels.adamw_update(z, z.astype(np.float16), z, z, 0.01, 0.9, 0.98, 1, 1e-8, 0.0)
    wide = p.copy()
    view, m, v = np.zeros((7, 2), dtype)[:, 0], np.zeros(7, dtype), np.zeros(7, dtype)
    view[:] = wide
    kernels.adamw_update(view, g, m, v, 0.01, 0.9, 0.98, 1, 1e-8, 0.0)
    optim.adamw_update.numpy(wide, g, np.zeros(7, dtype), np.zeros(7, dtype), 0.01, 0.9, 0.98, 1, 1e-8, 0.0)
    assert np.array_equal(view, wide) and not np.array_equal(view, p)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_twin_divides_by_its_denominator(dtype):
    """The GELU twin's forward is y = x / d and s = 1 / d with d = 1 + e^(-2z), bit for bit: y computed as
    x * s rounds differently (about a quarter of float32 entries move by one step), which would change every
    training run's bits."""
    f = np.dtype(dtype).type

    @numba.njit(fastmath=kernels.FASTMATH)
    def by_hand(x):
        y, s = np.empty_like(x), np.empty_like(x)
        for n in range(x.shape[0]):
            for m in range(x.shape[1]):
                xi = x[n, m]
                d = f(1) + kernels.fast_exp(-f(2) * (f(kernels.GELU_C) * (xi + f(0.044715) * xi * xi * xi)))
                y[n, m], s[n, m] = xi / d, f(1) / d
        return y, s
    x = np.random.default_rng(3).normal(size=(50, 40)).astype(dtype)
    y, s = kernels.gelu_forward_kernel(x)
    y_hand, s_hand = by_hand(x)
    assert y.tobytes() == y_hand.tobytes() and s.tobytes() == s_hand.tobytes()
    assert dtype == np.float64 or (x * s != y).any()           # where x * s would have given other bits


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_match_references(dtype):
    rng = np.random.default_rng(8)
    r = lambda *s: rng.normal(size=s).astype(dtype)
    x, g, b, dy = r(13, 24), r(24), r(24), r(13, 24)
    pair = lambda name, *args: (getattr(kernels, name)(*args), getattr(layers, name).numpy(*args))
    (y, cache), (y_ref, cache_ref) = pair("layernorm_forward", x, g, b)
    for a, e in ((y, y_ref), (cache[1], cache_ref[1]), (cache[2], cache_ref[2])):
        assert a.dtype == dtype
        _close(a, e, dtype)
    for a, e in zip(*pair("layernorm_backward", dy, cache)):
        assert a.dtype == dtype
        _close(a, e, dtype)
    (y, (x_k, s_k)), (y_ref, (x_ref, t_ref)) = pair("gelu_forward", x)
    assert x_k is x and x_ref is x and s_k.shape == t_ref.shape == x.shape    # the caches: (x, s), (x, tanh z)
    for a, e in ((y, y_ref), (s_k, (1 + t_ref) / 2),
                 (kernels.gelu_backward(dy, (x, s_k)), layers.gelu_backward.numpy(dy, (x, t_ref)))):
        assert a.dtype == dtype
        _close(a, e, dtype)
    w, bias = r(24, 5), r(5)
    (out, lin_cache), (out_ref, lin_cache_ref) = pair("linear_forward", x, w, bias)
    _close(out, out_ref, dtype)
    assert lin_cache[0] is x and lin_cache[1] is w and lin_cache_ref[0] is x and lin_cache_ref[1] is w
    dout = r(13, 5)
    for a, e in zip(*pair("linear_backward", dout, (x, w))):
        _close(a, e, dtype)
    q, k, v, u = r(3, 2, 7, 4), r(3, 2, 7, 4), r(3, 2, 7, 4), r(3, 2, 7, 4)
    o, alpha = kernels.attention_forward(q, k, v)
    o_ref, alpha_ref = ba.attention_forward.numpy(q, k, v)
    assert o.dtype == dtype and alpha.dtype == dtype
    _close(o, o_ref, dtype)
    _close(alpha, alpha_ref, dtype)
    for a, e in zip(kernels.attention_backward(u, alpha, q, k, v), ba.attention_backward.numpy(u, alpha, q, k, v)):
        assert a.dtype == dtype and a.shape == e.shape
        _close(a, e, dtype)
    # the twin's head outputs sit side by side: merging them copies nothing
    assert np.shares_memory(ba.merge_heads(o), o) and not np.shares_memory(ba.merge_heads(o_ref), o_ref)
    # LayerNorm backward sums dg, db over 16 row blocks: 100 rows puts several rows in each block
    x2, dy2 = r(100, 24), r(100, 24)
    _, cache2 = kernels.layernorm_forward(x2, g, b)
    for a, e in zip(kernels.layernorm_backward(dy2, cache2), layers.layernorm_backward.numpy(dy2, cache2)):
        _close(a, e, dtype)
    tokens = rng.integers(0, 4, (1, 13))
    for a, e in zip(*pair("embedding_backward", x[None], (tokens, 5))):
        _close(a, e, dtype)
    logits, w = r(1, 13, 5), (rng.random((1, 13)) < 0.7).astype(np.float64)
    hard, soft = rng.integers(0, 5, (1, 13)), rng.dirichlet(np.ones(5), (1, 13)).astype(dtype)
    for t in (hard, soft):
        loss, dz = kernels.cross_entropy(logits, t, w)
        loss_ref, dz_ref = layers.cross_entropy.numpy(logits, t, w)
        assert dz.dtype == dtype
        _close(loss, loss_ref, dtype)
        _close(dz, dz_ref, dtype)


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "python"])
def test_exp32_matches_exp(compiled):
    """exp32 (the kernels' float32 e^x) against float64 exp: within 1.5e-7 relative wherever e^x is a
    normal float32, 0 below that range, inf above it, NaN for NaN."""
    if compiled and numba.config.DISABLE_JIT:
        pytest.skip("NUMBA_DISABLE_JIT=1: the compiled exp32 is the plain function, tested as 'python'")
    exp32 = kernels.exp32 if compiled else getattr(kernels.exp32, "py_func", kernels.exp32)   # NUMBA_DISABLE_JIT: plain already
    xs = np.linspace(-87.3, 88.7, 200_001 if compiled else 2_001).astype(np.float32)
    xs = np.concatenate([xs, np.float32([0, -0.0, 1e-30, -1e-30, 0.34657359, -0.34657359])])
    got = np.array([exp32(x) for x in xs], dtype=np.float64)
    want = np.exp(xs.astype(np.float64))
    err = np.abs(got - want) / want
    assert err.max() <= 1.5e-7, f"exp32 relative error {err.max():.2e} at x = {xs[err.argmax()]}"
    edge = np.float32([-1000, -88, -87.4, 88.8, 89, 1000, np.inf, -np.inf, np.nan])
    with np.errstate(all="ignore"):                  # plain Python: NumPy warns on the overflowing casts
        got = [exp32(x) for x in edge]
    assert got[:3] == [0, 0, 0] and got[3:7] == [np.inf] * 4 and got[7] == 0 and np.isnan(got[8]), got


def test_kernels_use_exp32_for_float32():
    """Inside compiled code fast_exp must dispatch float32 to exp32 (bit for bit) and float64 to exp."""
    if numba.config.DISABLE_JIT:
        pytest.skip("NUMBA_DISABLE_JIT=1: fast_exp is math.exp by design")
    f = numba.njit(lambda x: kernels.fast_exp(x))
    for v in (-3.7, 0.1, 2.5, 40.0):
        assert f(np.float32(v)) == kernels.exp32(np.float32(v)), v
        assert f(np.float64(v)) == math.exp(v), v


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "python"])
def test_tanh32_matches_tanh(compiled):
    """tanh32 (the kernels' float32 tanh, the LSTM's) against float64 tanh: within 2 float32 steps of the true
    value (2.5 allowed) on both of its branches (the series below |x| = 0.3, the exponential above), odd, +-1 far out, NaN
    for NaN; fast_tanh dispatches float32 to it and float64 to math.tanh."""
    if compiled and numba.config.DISABLE_JIT:
        pytest.skip("NUMBA_DISABLE_JIT=1: the compiled tanh32 is the plain function, tested as 'python'")
    tanh32 = kernels.tanh32 if compiled else getattr(kernels.tanh32, "py_func", kernels.tanh32)
    xs = np.concatenate([np.linspace(-20, 20, 100_001 if compiled else 2_001),
                         np.linspace(-0.35, 0.35, 20_001 if compiled else 501)]).astype(np.float32)
    xs = np.concatenate([xs, np.float32([0.29999998, 0.3, 0.30000001, 1e-30, -1e-30])])
    got = np.array([tanh32(x) for x in xs], dtype=np.float64)
    want = np.tanh(xs.astype(np.float64))
    steps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert steps.max() <= 2.5, f"tanh32 off by {steps.max():.2f} float32 steps at x = {xs[steps.argmax()]}"
    assert float(tanh32(np.float32(0.1))) == pytest.approx(0.0996679946, rel=1e-7)     # the series
    assert float(tanh32(np.float32(-0.5))) == pytest.approx(-0.4621171573, rel=2e-7)   # the exponential
    with np.errstate(all="ignore"):
        edge = [tanh32(x) for x in np.float32([50, -50, 1e30, np.inf, -np.inf, np.nan])]
    assert edge[:5] == [1, -1, 1, 1, -1] and np.isnan(edge[5]), edge
    if compiled:
        f = numba.njit(lambda x: kernels.fast_tanh(x))
        for v in (-3.7, 0.1, 0.29, 2.5):
            assert f(np.float32(v)) == tanh32(np.float32(v)) and f(np.float64(v)) == math.tanh(v), v


@contextmanager
def two_numba_threads():
    """Numba (and the row-block split of the products) on two threads inside; skips the test where
    there are fewer."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two Numba threads")
    old_threads = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        yield
    finally:
        numba.set_num_threads(old_threads)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_matmuls_match_blas(dtype, monkeypatch):
    """matmul / matmul_tn cut the rows into blocks, one BLAS call per thread; matmul_pair runs its two
    products one on each thread. With the size threshold at 0 every product is split: any row count,
    including fewer rows than threads, and a transposed right factor must give the plain product."""
    monkeypatch.setattr(kernels, "SPLIT_FLOPS", 0)
    monkeypatch.setattr(kernels, "PAIR_FLOPS", 0)
    handed = _record_parallel_products(monkeypatch)           # the calls that went to a parallel loop
    with two_numba_threads():
        _check_split_matmuls(dtype)
    assert [handed.count(k) for k in ("rows_kernel", "rows_tn_kernel", "pair_kernel")] == [8, 4, 4]   # 4 sizes


def _record_parallel_products(monkeypatch):
    """Wrap the parallel product loops of kernels so that each call's name is recorded; -> the list of names."""
    handed = []
    for name in ("rows_kernel", "rows_tn_kernel", "pair_kernel"):
        monkeypatch.setattr(kernels, name, lambda *args, f=getattr(kernels, name), name=name: handed.append(name)
                            or f(*args))
    return handed


def test_more_threads_than_products_cut_each_by_rows(monkeypatch):
    """With three threads matmul_pair cuts each product into three row blocks (matmul, matmul_tn) instead of
    running one product a thread: the same products; a product too small to cut but large enough to pair
    still runs one product a thread."""
    monkeypatch.setattr(kernels, "SPLIT_FLOPS", 0)
    monkeypatch.setattr(kernels, "PAIR_FLOPS", 0)
    monkeypatch.setattr(kernels.numba, "get_num_threads", lambda: 3)
    calls = []
    for name in ("matmul", "matmul_tn"):
        monkeypatch.setattr(kernels, name, lambda a, b, f=getattr(kernels, name), name=name: calls.append(name) or f(a, b))
    rng = np.random.default_rng(10)
    a, c, z = rng.normal(size=(7, 6)), rng.normal(size=(7, 4)), rng.normal(size=(5, 4))
    dx, dw = kernels.matmul_pair(c, z.T, a, c)
    assert calls == ["matmul", "matmul_tn"]
    _close(dx, c @ z.T, np.float64)
    _close(dw, a.T @ c, np.float64)
    monkeypatch.setattr(kernels, "SPLIT_FLOPS", 10 ** 9)        # too small to cut, large enough to pair
    handed = _record_parallel_products(monkeypatch)
    calls.clear()
    dx, dw = kernels.matmul_pair(c, z.T, a, c)
    assert calls == [] and handed == ["pair_kernel"]           # a @ b and x^T y, one an iteration
    _close(dx, c @ z.T, np.float64)
    _close(dw, a.T @ c, np.float64)


def test_a_layer_gradient_has_the_same_bits_on_one_thread_and_two(monkeypatch):
    """dW = x^T dout whole on either path: NumPy's x.T @ y on one thread, Numba's np.dot in pair_kernel on two
    (two builds of OpenBLAS, one BLAS thread each): the same bits at a preset's size, the sawtooth's default
    MLP layer ((2496, 64)^T (2496, 256)); dx as well."""
    rng = np.random.default_rng(14)
    x, d = rng.normal(size=(2496, 64)).astype(np.float32), rng.normal(size=(2496, 256)).astype(np.float32)
    w = rng.normal(size=(64, 256)).astype(np.float32)
    handed = _record_parallel_products(monkeypatch)
    with two_numba_threads():
        dx2, dw2 = kernels.matmul_pair(d, w.T, x, d)
    assert handed == ["pair_kernel"]
    assert np.array_equal(dw2, x.T @ d) and np.array_equal(dx2, d @ w.T)


def test_products_of_mixed_or_other_types_go_to_numpy_whole(monkeypatch):
    """Numba's np.dot takes one floating type: a float32 by float64 product, half precision or integers go to
    NumPy's @ whole, whatever their size."""
    monkeypatch.setattr(kernels, "SPLIT_FLOPS", 0)
    monkeypatch.setattr(kernels, "PAIR_FLOPS", 0)
    handed = _record_parallel_products(monkeypatch)
    a = np.arange(12.0).reshape(4, 3)
    cases = [(a.astype(np.float32), a.T.copy()), (a.astype(np.float16), a.T.astype(np.float16)),
             (a.astype(np.int64), a.T.astype(np.int64))]
    with two_numba_threads():
        for x, y in cases:
            assert np.array_equal(kernels.matmul(x, y), x @ y)
            assert np.array_equal(kernels.matmul_tn(x, y.T), x.T @ y.T)
            dx, dw = kernels.matmul_pair(x, y, x, y.T)
            assert np.array_equal(dx, x @ y) and np.array_equal(dw, x.T @ y.T)
        assert handed == []
        kernels.matmul(a, a.T)                                 # float64 alone: the parallel loop
    assert handed == ["rows_kernel"]


def _check_split_matmuls(dtype):
    rng = np.random.default_rng(9)
    for n in (1, 2, 3, 37):
        a, c = rng.normal(size=(n, 6)).astype(dtype), rng.normal(size=(n, 4)).astype(dtype)
        w, z = rng.normal(size=(6, 5)).astype(dtype), rng.normal(size=(5, 4)).astype(dtype)
        out, tn = kernels.matmul(a, w), kernels.matmul_tn(a, c)
        assert out.shape == (n, 5) and out.dtype == dtype and tn.shape == (6, 4) and tn.dtype == dtype
        _close(out, a @ w, dtype)
        _close(kernels.matmul(c, z.T), c @ z.T, dtype)
        _close(tn, a.T @ c, dtype)
        dx, dw = kernels.matmul_pair(c, z.T, a, c)             # a linear layer's backward: one product a thread
        _close(dx, c @ z.T, dtype)
        assert np.array_equal(dw, a.T @ c)                     # dW whole, by one call: the same bits as one thread


def test_run_kernel_picks_threads_by_estimated_time(monkeypatch):
    """A kernel estimated under PARALLEL_MIN_US on one thread runs on one thread; a longer one on all;
    the caller's thread count comes back afterwards, also when the kernel raises. At 0 every kernel takes all
    threads."""
    monkeypatch.setattr(kernels, "PARALLEL_MIN_US", 200.0)
    with two_numba_threads():
        assert kernels.run_kernel(numba.get_num_threads, 1000, 100.0) == 1          # 100 us
        assert numba.get_num_threads() == 2
        assert kernels.run_kernel(numba.get_num_threads, 1000, 200.0) == 2          # 200 us
        monkeypatch.setattr(kernels, "PARALLEL_MIN_US", 0.0)
        assert kernels.run_kernel(numba.get_num_threads, 1, 0.001) == 2

        def fails():
            raise ZeroDivisionError("from inside the kernel")
        with pytest.raises(ZeroDivisionError):
            kernels.run_kernel(fails, 0, 0.0)
        assert numba.get_num_threads() == 2


def test_the_small_kernels_limit_follows_openmps_wait_policy():
    """PARALLEL_MIN_US follows OpenMP's wait policy as the process starts: 200 us where OMP_WAIT_POLICY is
    passive (waking the worker costs more than a small kernel's work), 20 us at the default (it spins: about twice
    the time a parallel loop's start repays, so that a kernel of microseconds does not wait for a busy core)."""
    def limit(policy):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env.update({"OMP_WAIT_POLICY": policy} if policy else {})
        code = "import kernels; print(kernels.PARALLEL_MIN_US)"
        return float(subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)),
                                    env=env, capture_output=True, text=True, check=True).stdout)
    assert (limit("passive"), limit("PASSIVE"), limit(None), limit("active")) == (200.0, 200.0, 20.0, 20.0)


def _page_faults_of_steps(steps=5, arrays=20, mib=2):
    """Minor page faults of steps 2..steps of a pretend training step: arrays of mib MiB made and written
    through, all alive at once (a step's activations), then all freed."""
    import resource
    faults = 0
    for step in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        alive = [np.ones(mib << 18, dtype=np.float32) for _ in range(arrays)]
        del alive
        faults += (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * (step > 0)
    return faults


@pytest.mark.skipif(not kernels.MALLOPT, reason="glibc's mallopt only (Linux)")
def test_freed_arrays_are_reused_without_page_faults():
    """kernels.keep_freed_memory: four more pretend steps of 20 arrays of 2 MiB reuse the first step's heap (a
    few faults); under glibc's own rule (mmap for a block over 128 KiB, or, once one is freed, the heap given
    back when its free top passes twice that) they fault again every step, about 512 times an array: 40,960.
    Here under glibc's defaults, set again for the comparison, and the setting put back after it."""
    assert _page_faults_of_steps() < 512
    import ctypes
    libc = ctypes.CDLL(None)
    try:
        assert libc.mallopt(kernels.M_MMAP_THRESHOLD, 128 << 10) and libc.mallopt(kernels.M_TRIM_THRESHOLD, 128 << 10)
        libc.malloc_trim(0)
        assert _page_faults_of_steps() > 4 * 20 * 400
    finally:
        assert kernels.keep_freed_memory()


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="needs the compiled kernels' threads")
def test_kernels_on_one_thread_match_all_threads(monkeypatch):
    """run_kernel's choice changes no result: every wrapper, held to one thread (the threshold set to
    infinity), returns its bare kernel's numbers on two threads bit for bit. (LayerNorm's dg, db
    add fixed row blocks, not per-thread partials; every other kernel's rows are independent.)"""
    monkeypatch.setattr(kernels, "PARALLEL_MIN_US", math.inf)
    with two_numba_threads():
        _check_one_thread_matches_all()


def _check_one_thread_matches_all():
    rng = np.random.default_rng(12)
    x, dy, h = (rng.normal(size=s).astype(np.float32) for s in ((300, 24), (300, 24), (300, 64)))
    g, b = rng.normal(size=24).astype(np.float32), rng.normal(size=24).astype(np.float32)
    y, cache = kernels.layernorm_forward(x.reshape(3, 100, 24), g, b)
    y_all, mean, rstd = kernels.layernorm_forward_kernel(x, g, b, layers.LN_EPS)
    assert np.array_equal(y.reshape(300, 24), y_all)
    for a, e in zip(kernels.layernorm_backward(dy.reshape(3, 100, 24), cache),
                    kernels.layernorm_backward_kernel(dy, x, mean, rstd, g)):
        assert np.array_equal(a.reshape(e.shape), e)
    y_h, (_, t_h) = kernels.gelu_forward(h)
    assert all(np.array_equal(a, e) for a, e in zip((y_h, t_h), kernels.gelu_forward_kernel(h)))
    assert np.array_equal(kernels.gelu_backward(dy, (x, x)), kernels.gelu_backward_kernel(dy, x, x))
    q, k, v, u = (rng.normal(size=(2, 2, 9, 4)).astype(np.float32) for _ in range(4))
    o, alpha = kernels.attention_forward(q, k, v)
    o_all, alpha_all = kernels.attention_forward_kernel(q, k, v)
    assert np.array_equal(o, kernels.heads_view(o_all)) and np.array_equal(alpha, alpha_all)
    for a, e in zip(kernels.attention_backward(u, alpha, q, k, v), kernels.attention_backward_kernel(u, alpha, q, k, v)):
        assert np.array_equal(a, e)
    logits, targets = x[:, :5].reshape(3, 100, 5).copy(), rng.integers(0, 5, (3, 100))
    mask = (rng.random((3, 100)) < 0.7).astype(np.float64)
    loss, dz = kernels.cross_entropy(logits, targets, mask)
    rows, dz_all = kernels.cross_entropy_hard_kernel(logits.reshape(300, 5), targets.reshape(-1), mask.reshape(-1),
                                                mask.sum())
    assert loss == rows.sum() and np.array_equal(dz.reshape(300, 5), dz_all)


def test_layernorm_backward_of_no_rows():
    """An empty batch: dx has no rows, and dg, db are sums over no rows, zero."""
    x = np.zeros((0, 6), dtype=np.float32)
    g = np.ones(6, dtype=np.float32)
    dx, dg, db = kernels.layernorm_backward_kernel(x, x, np.zeros(0, np.float32), np.zeros(0, np.float32), g)
    assert dx.shape == (0, 6) and np.array_equal(dg, np.zeros(6)) and np.array_equal(db, np.zeros(6))


@pytest.mark.ci_only
@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="counts the compiler's parallel loops")
def test_each_parallel_kernel_has_one_parallel_loop():
    """Each parallel loop starts the worker thread again (about 0.08 ms under OMP_WAIT_POLICY=passive).
    Inside a parallel kernel np.zeros is a parallel loop of its own (before this test, LayerNorm
    backward, attention forward and cross-entropy had two), so a kernel that used one would pay twice. Compiled afresh (not from the cache) to read the compiler's count."""
    rng = np.random.default_rng(13)
    x, dy = rng.normal(size=(40, 8)).astype(np.float32), rng.normal(size=(40, 8)).astype(np.float32)
    g, b = x[0].copy(), x[1].copy()
    _, (_, mean, rstd, _, _) = layers.layernorm_forward.numpy(x, g, b)
    q = rng.normal(size=(2, 2, 5, 4)).astype(np.float32)
    _, alpha = ba.attention_forward.numpy(q, q, q)
    w, hard, soft = np.ones(40), np.zeros(40, dtype=np.int64), np.full((40, 8), 1 / 8, dtype=np.float32)
    cases = [(kernels.layernorm_forward_kernel, (x, g, b, layers.LN_EPS)),
             (kernels.layernorm_backward_kernel, (dy, x, mean, rstd, g)),
             (kernels.gelu_forward_kernel, (x,)), (kernels.gelu_backward_kernel, (dy, x, x)),
             (kernels.attention_forward_kernel, (q, q, q)), (kernels.attention_backward_kernel, (q, alpha, q, q, q)),
             (kernels.cross_entropy_hard_kernel, (x, hard, w, 40.0)), (kernels.cross_entropy_kernel, (x, soft, w, 40.0))]
    for kernel, args in cases:
        fresh = numba.njit(parallel=True, fastmath=kernels.FASTMATH)(kernel.py_func)
        fresh(*args)
        loops = fresh.get_metadata(fresh.signatures[0])["parfor_diagnostics"].get_parfors()
        assert len(loops) == 1, f"{kernel.__name__}: {len(loops)} parallel loops"


# ----------------------------------------------------------------------------
# numerical extremes: each path runs its own attention and cross-entropy (the NumPy code on the "numpy"
# path, the twin in kernels.py on the "numba" path) at logits of order 1e4 and at -inf entries; the
# softmax has one code (layers.softmax, which the attention's NumPy op uses)

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_at_extreme_logits(dtype):
    """e^(-1e4) underflows to exactly 0, so every answer is exact: ties share the mass equally, a logit ahead
    by 1e4 takes all of it, a row of equal huge logits is uniform, and a -inf entry gets exactly 0."""
    softmax = layers.softmax
    inf = np.inf
    logits = np.array([[1e4, -1e4, 0.0, 1e4],             # two tied maxima
                       [1e4, 0.0, 0.0, -1e4],             # one logit dominates
                       [1e4, 1e4, 1e4, 1e4],              # all equal and huge
                       [-1e4, -1e4, -1e4, -1e4],
                       [-inf, 1e4, -inf, 0.0],            # masked entries
                       [-inf, 3.0, -inf, 3.0]], dtype=dtype)
    want = [[0.5, 0, 0, 0.5], [1, 0, 0, 0], [0.25] * 4, [0.25] * 4, [0, 1, 0, 0], [0, 0.5, 0, 0.5]]
    p = softmax(logits)
    assert p.dtype == dtype and np.all(np.isfinite(p)), p
    np.testing.assert_allclose(p, want, rtol=1e-6, atol=0)
    long_row = np.random.default_rng(9).normal(size=(2, 100_000)).astype(dtype) * 1e4
    p = softmax(long_row)
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(-1), 1.0)
    assert np.all(p.argmax(-1) == long_row.argmax(-1))


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_at_extreme_logits(dtype, soft, path):
    """Row 0: logits (1e4, -1e4, 0, 1e4), target class 1: logsumexp = 1e4 + ln 2, so its loss is 2e4 + ln 2 and
    softmax - onehot = (1/2, -1, 0, 1/2). Row 1: all -1e4 (all equal), target 0: ln 4, and (1/4 - 1, 1/4, 1/4, 1/4).
    Both supervised: loss 1e4 + 1.5 ln 2, dlogits halved."""
    cross_entropy = own_op(layers.cross_entropy, path)
    logits = np.array([[[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, -1e4]]], dtype=dtype)
    targets = np.array([[1, 0]])
    if soft:
        targets = np.eye(4, dtype=dtype)[targets]                # the same targets as distributions
    loss, dz = cross_entropy(logits, targets, np.ones((1, 2)))
    assert math.isfinite(loss) and dz.dtype == dtype and np.all(np.isfinite(dz)), (loss, dz)
    assert loss == pytest.approx(1e4 + 1.5 * math.log(2), rel=1e-6)
    np.testing.assert_allclose(dz[0], [[0.25, -0.5, 0, 0.25], [-0.375, 0.125, 0.125, 0.125]], rtol=1e-6, atol=0)


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_with_masked_out_classes(dtype, soft, path):
    """A class masked out with logit -inf has probability 0 and costs nothing where it is not the target.
    Row 0, target 1: (-inf, 1e4, -inf, 0): loss ln(1 + e^-1e4) = 0, dlogits 0. Row 1, unsupervised: -inf
    logits count for nothing. Row 2, target 3: (-inf, 0, -inf, 0): ln 2, softmax - onehot = (0, 1/2, 0, -1/2).
    Two supervised rows: loss ln 2 / 2, dlogits halved."""
    cross_entropy = own_op(layers.cross_entropy, path)
    inf = np.inf
    logits = np.array([[[-inf, 1e4, -inf, 0.0], [-inf, 2.0, 1.0, -inf], [-inf, 0.0, -inf, 0.0]]], dtype=dtype)
    targets = np.array([[1, 0, 3]])
    if soft:
        targets = np.eye(4, dtype=dtype)[targets]
    loss, dz = cross_entropy(logits, targets, np.array([[1.0, 0.0, 1.0]]))
    assert math.isfinite(loss) and np.all(np.isfinite(dz)), (loss, dz)
    assert loss == pytest.approx(math.log(2) / 2, rel=1e-6)
    np.testing.assert_allclose(dz[0], [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0.25, 0, -0.25]], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_at_extreme_scores(dtype, path):
    """Every query is (1e3, 1e3, 1e3, 1e3) and key j is c_j (1, 1, 1, 1), so s_ij = 4e3 c_j / sqrt(4) = 2e3 c_j:
    scores up to 1.2e4, and gaps of at least 2e3 between different c_j, whose e^(-gap) is exactly 0. With
    c = (5, 5, 5, -5, 6, 0) query i attends uniformly to the j <= i with the largest c_j:
        i = 0: j = 0;  i = 1: 0, 1 (1/2 each);  i = 2: 0, 1, 2 (a row of equal scores 1e4, 1/3 each);
        i = 3: 0, 1, 2 (j = 3 scores -1e4);  i = 4, 5: j = 4 alone (one-hot),
    and nothing above the diagonal (-inf before the causal softmax). Then o = alpha v, and the backward is
    the E-step and M-step on that alpha: dv = alpha^T u, ds = alpha (b - b_bar), dq = ds k / 2, dk = ds^T q / 2."""
    attention_forward, attention_backward = own_op(ba.attention_forward, path), own_op(ba.attention_backward, path)
    rng = np.random.default_rng(10)
    T, hs = 6, 4
    c = np.array([5.0, 5.0, 5.0, -5.0, 6.0, 0.0])
    q = np.full((1, 1, T, hs), 1e3, dtype=dtype)
    k = (c[:, None] * np.ones(hs))[None, None].astype(dtype)
    v, u = rng.normal(size=(1, 1, T, hs)).astype(dtype), rng.normal(size=(1, 1, T, hs)).astype(dtype)
    A = np.zeros((T, T))
    A[0, 0] = 1
    A[1, :2] = 1 / 2
    A[2, :3] = A[3, :3] = 1 / 3
    A[4, 4] = A[5, 4] = 1
    o, alpha = attention_forward(q, k, v)
    dq, dk, dv = attention_backward(u, alpha, q, k, v)
    assert all(t.dtype == dtype and np.all(np.isfinite(t)) for t in (o, alpha, dq, dk, dv))
    np.testing.assert_allclose(alpha[0, 0], A, rtol=1e-6, atol=0)
    q64, k64, v64, u64 = (t[0, 0].astype(np.float64) for t in (q, k, v, u))
    b = u64 @ v64.T                                                       # b_ij = u_i . v_j
    ds = A * (b - (A * b).sum(-1, keepdims=True))                         # alpha_ij (b_ij - b_bar_i)
    # each against the size of the terms it sums (dq's are exactly 0: each row of ds sums to 0 over keys
    # that are all equal where alpha is not 0)
    for name, got, want, terms in (("o", o, A @ v64, A @ abs(v64)), ("dv", dv, A.T @ u64, A.T @ abs(u64)),
                                   ("dq", dq, ds @ k64 / 2, abs(ds) @ abs(k64) / 2),
                                   ("dk", dk, ds.T @ q64 / 2, abs(ds).T @ abs(q64) / 2)):
        err = float(np.abs(got[0, 0] - want).max() / terms.max())
        assert err <= KERNEL_TOL[dtype], f"{name}: error {err:.2e} against the hand-built alpha, relative to its terms"
    # random keys under queries of 1e3: scores of order 1e3, every output finite and every row a distribution
    k = np.random.default_rng(11).normal(size=(1, 1, 50, 4)).astype(dtype)
    q = np.full((1, 1, 50, 4), 1e3, dtype=dtype)
    o, alpha = attention_forward(q, k, k)
    dq, dk, dv = attention_backward(np.ones_like(q), alpha, q, k, k)
    assert all(np.all(np.isfinite(t)) for t in (o, alpha, dq, dk, dv))
    np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------
# the whole model: every parameter tensor against finite differences

def tiny_model(pos="learned", seed=0):
    cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=2, n_heads=2,
                    pos=pos, dtype="float64")
    params = ba.init_params(cfg, seed)
    rng = np.random.default_rng(seed + 100)
    for name in params:                                         # non-trivial weights everywhere
        params[name] = params[name] + rng.normal(0, 0.3, params[name].shape)
    return cfg, params


def model_gradient_errors(cfg, params, tokens, targets, mask):
    loss, grads = models.loss_and_grads("transformer", params, tokens, targets, mask, cfg)
    assert set(grads) == set(params), set(grads) ^ set(params)
    f = lambda _: np.array(models.loss_and_grads("transformer", params, tokens, targets, mask, cfg)[0])
    numeric = {name: numerical_grad(f, params[name], np.array(1.0)) for name in params}
    # b_k shifts every score of a query by the same q_i . b_k: softmax ignores it, and
    # sum_j dk_j = sum_i q_i sum_j ds_ij = 0 because each row of ds sums to zero.
    for name in [n for n in params if n.endswith("attn.bk")]:
        assert np.abs(grads[name]).max() < 1e-12 and np.abs(numeric[name]).max() < 1e-8, name
        del numeric[name]
    return assert_grads(grads, numeric)


@pytest.mark.parametrize("soft", [False, True], ids=["hard-targets", "soft-targets"])
@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_model_gradients(soft, pos, path):
    cfg, params = tiny_model(pos)
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, 7, (2, 5))
    mask = np.array([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]], dtype=float)
    targets = rng.dirichlet(np.ones(5), size=(2, 5)) if soft else rng.integers(0, 5, (2, 5))
    errors = model_gradient_errors(cfg, params, tokens, targets, mask)
    where = "the NumPy ops as written" if path == "numpy" else "their Numba twins (kernels.enabled())"
    print(f"\nworst relative error per tensor, {pos} positions, {'soft' if soft else 'hard'} targets, on {where}:\n"
          + "\n".join(f"  {k:22s} {v:.2e}" for k, v in errors.items()))


def test_clamped_positions_share_the_last_row(path):
    cfg, params = tiny_model()
    clamped = ba.Config(**{**cfg.to_dict(), "pos_limit": 3})
    rng = np.random.default_rng(14)
    tokens, targets, mask = rng.integers(0, 7, (2, 5)), rng.integers(0, 5, (2, 5)), np.ones((2, 5))
    model_gradient_errors(clamped, params, tokens, targets, mask)     # every tensor, wpe rows 0..2 included
    _, grads = models.loss_and_grads("transformer", params, tokens, targets, mask, clamped)
    assert np.all(grads["wpe"][3:] == 0) and np.any(grads["wpe"][2] != 0)
    copied = dict(params, wpe=params["wpe"].copy())
    copied["wpe"][3:5] = params["wpe"][2]                               # t = 3, 4 read row 2
    np.testing.assert_allclose(ba.forward(params, tokens, clamped)[0], ba.forward(copied, tokens, cfg)[0],
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="pos_limit=7: allowed are 0 .no limit. to max_len=6"):
        ba.Config(**{**cfg.to_dict(), "pos_limit": 7})


def test_head_mask_gradients_and_ablation(path):
    cfg, params = tiny_model()
    rng = np.random.default_rng(12)
    tokens, targets, mask = rng.integers(0, 7, (2, 5)), rng.integers(0, 5, (2, 5)), np.ones((2, 5))
    head_mask = np.array([[1.0, 0.0], [1.0, 1.0]])
    logits, cache = ba.forward(params, tokens, cfg, head_mask=head_mask)
    assert np.all(cache["layers"][0]["head_out"][:, 1] == 0)
    loss, dlogits = layers.cross_entropy(logits, targets, mask)
    grads = ba.backward(dlogits, cache, params, cfg)
    f = lambda _: np.array(layers.cross_entropy(ba.forward(params, tokens, cfg, head_mask=head_mask)[0], targets, mask)[0])
    name = "blocks.0.attn.wq"
    assert_grads({name: grads[name]}, {name: numerical_grad(f, params[name], np.array(1.0))})
    hs = cfg.d_model // cfg.n_heads                             # the ablated head's query columns get nothing
    assert np.all(grads[name][:, hs:] == 0)


def test_cache_exposes_geometry():
    cfg, params = tiny_model()
    tokens = np.random.default_rng(13).integers(0, 7, (3, 5))
    logits, cache = ba.forward(params, tokens, cfg)
    assert logits.shape == (3, 5, 5) and len(cache["layers"]) == 2 and len(cache["resid"]) == 3
    layer = cache["layers"][1]
    assert layer["alpha"].shape == (3, 2, 5, 5) and layer["q"].shape == (3, 2, 5, 4)
    np.testing.assert_allclose(layer["alpha"].sum(-1), 1.0)
    assert np.all(np.triu(layer["alpha"][0, 0], 1) == 0)        # causal
    # causality of the whole model: changing a later token leaves earlier logits unchanged
    t2 = tokens.copy()
    t2[:, 3] = (t2[:, 3] + 1) % 7
    np.testing.assert_array_equal(ba.forward(params, t2, cfg)[0][:, :3], logits[:, :3])


# ----------------------------------------------------------------------------
# optimiser and training

def test_adamw_hand_computed_step():
    params = {"a.w": np.array([1.0, -2.0]), "a.b": np.array([0.5])}
    grads = {"a.w": np.array([0.1, -0.3]), "a.b": np.array([2.0])}
    state = optim.adamw_init(params)
    lr, b1, b2, eps, wd = 0.1, 0.9, 0.99, 1e-8, 0.5
    optim.adamw_step(params, grads, state, lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, decay={"a.w"})
    # t = 1: m = 0.1 g, v = 0.01 g^2, mhat = g, vhat = g^2, so the Adam step is lr * g / (|g| + eps)
    w_expected = np.array([1.0, -2.0]) * (1 - lr * wd) - lr * np.array([0.1, -0.3]) / (np.array([0.1, 0.3]) + eps)
    b_expected = 0.5 - lr * 2.0 / (2.0 + eps)                  # biases are not decayed
    np.testing.assert_allclose(params["a.w"], w_expected, rtol=1e-12)
    np.testing.assert_allclose(params["a.b"], [b_expected], rtol=1e-12)
    np.testing.assert_allclose(state["m"]["a.w"], 0.1 * np.array([0.1, -0.3]))
    # t = 2 with the same gradient: mhat = g, vhat = g^2 again (bias correction)
    optim.adamw_step(params, grads, state, lr, beta1=b1, beta2=b2, eps=eps, weight_decay=0.0)
    np.testing.assert_allclose(params["a.b"], [b_expected - lr * 2.0 / (2.0 + eps)], rtol=1e-12)
    # decay=None: matrices decay, vectors do not. With zero gradients the Adam term is 0, so a matrix
    # shrinks by exactly (1 - lr wd) and a vector stays
    params = {"m": np.array([[1.0, -2.0]]), "g": np.array([1.0, -2.0])}
    optim.adamw_step(params, {k: np.zeros_like(v) for k, v in params.items()}, optim.adamw_init(params), lr,
                     weight_decay=wd)
    np.testing.assert_allclose(params["m"], [[1.0 * (1 - lr * wd), -2.0 * (1 - lr * wd)]], rtol=1e-15)
    np.testing.assert_array_equal(params["g"], [1.0, -2.0])


def test_clip_and_schedule():
    grads = {"x": np.array([3.0, 4.0])}
    assert optim.clip_grad_norm(grads, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(grads["x"], [0.6, 0.8])
    assert optim.lr_schedule(0, 1.0, 10, 100) == pytest.approx(0.1)
    assert optim.lr_schedule(9, 1.0, 10, 100) == pytest.approx(1.0)
    assert optim.lr_schedule(55, 1.0, 10, 100) == pytest.approx(0.5)
    assert optim.lr_schedule(100, 1.0, 10, 100, min_lr=0.1) == pytest.approx(0.1)


def test_tiny_model_overfits_one_batch(path):
    cfg = ba.Config(vocab_size=10, n_classes=6, max_len=8, d_model=16, n_layers=2, n_heads=2, dtype="float64")
    params = ba.init_params(cfg, 0)
    state = optim.adamw_init(params)
    rng = np.random.default_rng(14)
    tokens, targets, mask = rng.integers(0, 10, (4, 8)), rng.integers(0, 6, (4, 8)), np.ones((4, 8))
    first = None
    for step in range(300):
        loss, grads = models.loss_and_grads("transformer", params, tokens, targets, mask, cfg)
        first = loss if first is None else first
        optim.clip_grad_norm(grads, 1.0)
        optim.adamw_step(params, grads, state, 1e-2)
    assert first > 1.5 and loss < 0.05, f"loss went from {first:.3f} to {loss:.3f}; expected below 0.05"


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="n_heads=3 does not divide d_model=8"):
        ba.Config(vocab_size=5, n_classes=5, d_model=8, n_heads=3)
    with pytest.raises(ValueError, match="dtype='float16'"):
        ba.Config(vocab_size=5, n_classes=5, dtype="float16")
    with pytest.raises(ValueError, match="d_model=0"):
        ba.Config(vocab_size=5, n_classes=5, d_model=0)
    with pytest.raises(ValueError, match="pos='rope'"):
        ba.Config(vocab_size=5, n_classes=5, pos="rope")
    cfg, params = tiny_model()
    with pytest.raises(ValueError, match="token ids must lie in 0..6"):
        models.forward("transformer", params, np.array([[0, 7]]), cfg)
    with pytest.raises(ValueError, match="class targets must lie in 0..4"):
        layers.cross_entropy(np.zeros((1, 2, 5)), np.array([[0, 5]]), np.ones((1, 2)))
    with pytest.raises(ValueError, match="exceeds max_len=6"):
        ba.forward(params, np.zeros((1, 7), dtype=int), cfg)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal"])
def test_param_shapes_are_init_params_shapes(pos):
    from families import mlp_baseline as mb
    cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=2, n_heads=2, pos=pos)
    assert ba.param_shapes(cfg) == {k: v.shape for k, v in ba.init_params(cfg).items()}
    assert models.param_shapes("transformer", cfg) == ba.param_shapes(cfg)
    for inputs in mb.INPUTS:
        mcfg = mb.Config(vocab_size=7, n_classes=5, max_len=6, d_model=4, n_layers=2, inputs=inputs)
        assert mb.param_shapes(mcfg) == {k: v.shape for k, v in mb.init_params(mcfg).items()}
