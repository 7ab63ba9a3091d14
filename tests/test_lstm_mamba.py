"""Checks of the two recurrent families' own ops (families/lstm.py, families/mamba.py) and of their twins (families/lstm_twins.py,
families/mamba_twins.py); tests/test_families.py checks the whole models as it checks every family.

  - every new op against centred finite differences in float64, projected onto a random upstream gradient:
    sigmoid, tanh, SiLU, softplus, the causal convolution, the LSTM step, and the two sequences (the LSTM
    layer and the selective scan) unrolled over T_LONG = 13 steps;
  - each sequence backward against a step-by-step chain written out here (every named intermediate of every
    step, carried back by hand), with a control: the same chain with the carry sent to the wrong step differs;
  - each twin against its NumPy op in float32 and float64, the caches exchanged both ways;
  - the initialisation the docstrings state, the weight-decay rules, the cost estimates by hand;
  - the twin switch: a name twinned twice fails at import, an op whose twins were never loaded fails loudly.
"""

import dataclasses

import numpy as np
import pytest

import layers as ly  # first: it pins OpenBLAS to one thread before NumPy loads
import kernels
from families import lstm
from families import lstm_twins
from families import mamba
from families import mamba_twins
import models

pytestmark = pytest.mark.plain_python   # .ci/run checks this module again without the JIT

T_LONG = 13                 # an unrolled sequence long enough that a carry sent to the wrong step shows
TOL64 = 1e-7                # finite differences in float64 (centred, h = 1e-5): relative error per input
TWIN_TOL = {np.float64: 1e-12, np.float32: 2e-5}   # a twin against its NumPy op, relative to the largest entry


def rel_error(a, b, floor=1e-12):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), np.max(np.abs(b)), floor))


def numeric_grads(f, inputs, dout, h=1e-5):
    """Centred finite differences of sum(f(*inputs) * dout) with respect to every input (float64 arrays)."""
    grads = []
    for x in inputs:
        g = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            old = x[i]
            x[i] = old + h
            up = np.sum(f(*inputs) * dout)
            x[i] = old - h
            down = np.sum(f(*inputs) * dout)
            x[i] = old
            g[i] = (up - down) / (2 * h)
        grads.append(g)
    return grads


def check_grads(name, f, inputs, dout, analytic):
    worst = {i: rel_error(a, n) for i, (a, n) in enumerate(zip(analytic, numeric_grads(f, inputs, dout)))}
    assert max(worst.values()) < TOL64, f"{name}: worst relative error per input {worst}"


# ----------------------------------------------------------------------------
# the elementwise ops and the convolution

@pytest.mark.parametrize("pair", [(ly.sigmoid_forward, ly.sigmoid_backward), (lstm.tanh_forward, lstm.tanh_backward),
                                  (mamba.silu_forward, mamba.silu_backward),
                                  (mamba.softplus_forward, mamba.softplus_backward)], ids=lambda p: p[0].__name__)
def test_elementwise_ops_against_finite_differences(pair):
    fwd, bwd = pair
    rng = np.random.default_rng(0)
    x = rng.normal(0, 3, (4, 5))
    dout = rng.standard_normal(x.shape)
    check_grads(fwd.__name__, lambda x: fwd(x)[0], [x], dout, [bwd(dout, fwd(x)[1])])


def test_elementwise_ops_by_hand():
    """sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4; silu(ln 3) = (3/4) ln 3; softplus(ln 3) = ln 4; no overflow at +-800."""
    x = np.array([0.0, np.log(3.0), 800.0, -800.0])
    np.testing.assert_allclose(ly.sigmoid_forward(x)[0], [0.5, 0.75, 1.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(mamba.silu_forward(x[:2])[0], [0.0, 0.75 * np.log(3.0)], atol=1e-15)
    np.testing.assert_allclose(mamba.softplus_forward(x)[0], [np.log(2.0), np.log(4.0), 800.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(lstm.tanh_forward(np.array([np.log(2.0)]))[0], [0.6])   # (4 - 1) / (4 + 1)


def test_causal_convolution():
    """By hand: width 2, w = (w_0, w_1) = (2, 3): y_t = b + 2 x_{t-1} + 3 x_t, and x_{-1} = 0 (causal);
    and against finite differences."""
    x = np.array([[[1.0], [10.0], [100.0]]])                        # (B=1, T=3, D=1)
    y, _ = mamba.causal_conv_forward(x, np.array([[2.0, 3.0]]), np.array([0.5]))
    np.testing.assert_allclose(y[0, :, 0], [0.5 + 3, 0.5 + 2 + 30, 0.5 + 20 + 300])
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 7, 3)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    dout = rng.standard_normal((2, 7, 3))
    analytic = mamba.causal_conv_backward(dout, mamba.causal_conv_forward(x, w, b)[1])
    check_grads("causal_conv", lambda x, w, b: mamba.causal_conv_forward(x, w, b)[0], [x, w, b], dout, analytic)


# ----------------------------------------------------------------------------
# the LSTM: the step, the unrolled sequence, and the sequence against a chain of steps written out here

def lstm_inputs(rng, B=2, T=T_LONG, Cin=3, C=4, dtype=np.float64):
    x = rng.standard_normal((B, T, Cin)).astype(dtype)
    w = (0.6 * rng.standard_normal((Cin + C, 4 * C))).astype(dtype)
    b = (0.3 * rng.standard_normal(4 * C)).astype(dtype)
    return x, w, b


def test_lstm_step_against_finite_differences():
    """All five inputs, with gradients arriving at both h and c (the upstream is sum(dh h) + sum(dc c))."""
    rng = np.random.default_rng(2)
    B, Cin, C = 2, 3, 4
    x, hp, cp = rng.standard_normal((B, Cin)), rng.standard_normal((B, C)), rng.standard_normal((B, C))
    w, b = 0.6 * rng.standard_normal((Cin + C, 4 * C)), 0.3 * rng.standard_normal(4 * C)
    dh, dc = rng.standard_normal((B, C)), rng.standard_normal((B, C))
    f = lambda *a: np.concatenate(lstm.lstm_step_forward(*a)[:2], axis=1)   # [h, c]
    _, _, cache = lstm.lstm_step_forward(x, hp, cp, w, b)
    check_grads("lstm_step", f, [x, hp, cp, w, b], np.concatenate([dh, dc], axis=1),
                lstm.lstm_step_backward(dh, dc, cache))


@pytest.mark.parametrize("path", ["numpy", "twin"])
def test_lstm_sequence_against_finite_differences(path):
    """The whole layer unrolled over T_LONG steps: x, w, b."""
    fwd, bwd = ((lstm.lstm_forward.numpy, lstm.lstm_backward.numpy) if path == "numpy"
                else (lstm_twins.lstm_forward, lstm_twins.lstm_backward))
    rng = np.random.default_rng(3)
    x, w, b = lstm_inputs(rng)
    dh = rng.standard_normal((x.shape[0], x.shape[1], w.shape[1] // 4))
    check_grads(f"lstm sequence ({path})", lambda *a: fwd(*a)[0], [x, w, b], dh, bwd(dh, fwd(x, w, b)[1]))


def lstm_chain(x, w, b, dh, wrong_step=False):
    """The layer's gradients through every named intermediate of every step, written out here: the forward keeps
    each step's [x_t, h_{t-1}], a_t, i, f, g, o, c_{t-1}, c_t; the backward runs t = T-1..0 carrying dh_next and
    dc_next. wrong_step: the cell's gradient carried to step t-2 instead of t-1 (the control)."""
    B, T, Cin = x.shape
    C = w.shape[1] // 4
    sig = lambda a: 1 / (1 + np.exp(-a))
    h, c, keep = np.zeros((B, C)), np.zeros((B, C)), []
    for t in range(T):
        xh = np.concatenate([x[:, t], h], axis=1)
        a = xh @ w + b
        i, f, g, o = sig(a[:, :C]), sig(a[:, C:2 * C]), np.tanh(a[:, 2 * C:3 * C]), sig(a[:, 3 * C:])
        c_prev, c = c, f * c + i * g
        h = o * np.tanh(c)
        keep.append((xh, i, f, g, o, c_prev, c))
    dx, dw, db = np.zeros_like(x), np.zeros_like(w), np.zeros_like(b)
    dh_next, dc_next, dc_late = np.zeros((B, C)), np.zeros((B, C)), np.zeros((B, C))
    for t in reversed(range(T)):
        xh, i, f, g, o, c_prev, c = keep[t]
        dh_t = dh[:, t] + dh_next
        dc_t = dc_next + dh_t * o * (1 - np.tanh(c) ** 2)             # dc through h_t = o tanh(c_t)
        do = dh_t * np.tanh(c)
        di, df, dg = dc_t * g, dc_t * c_prev, dc_t * i
        da = np.concatenate([di * i * (1 - i), df * f * (1 - f), dg * (1 - g * g), do * o * (1 - o)], axis=1)
        dw += xh.T @ da
        db += da.sum(axis=0)
        dxh = da @ w.T
        dx[:, t], dh_next = dxh[:, :Cin], dxh[:, Cin:]
        if wrong_step:
            dc_next, dc_late = dc_late, dc_t * f
        else:
            dc_next = dc_t * f
    return dx, dw, db


def test_lstm_sequence_against_a_chain_of_steps():
    """lstm_backward (NumPy and twin) equals the chain written out above; the chain with the cell's gradient
    carried one step too far differs (so the comparison can fail)."""
    rng = np.random.default_rng(4)
    x, w, b = lstm_inputs(rng)
    dh = rng.standard_normal((x.shape[0], x.shape[1], w.shape[1] // 4))
    chain = lstm_chain(x, w, b, dh)
    for fwd, bwd in ((lstm.lstm_forward.numpy, lstm.lstm_backward.numpy), (lstm_twins.lstm_forward, lstm_twins.lstm_backward)):
        got = bwd(dh, fwd(x, w, b)[1])
        for name, a, e in zip(("dx", "dw", "db"), got, chain):
            assert rel_error(a, e) < 1e-12, (bwd.__module__, name, rel_error(a, e))
    wrong = lstm_chain(x, w, b, dh, wrong_step=True)
    assert min(rel_error(a, e) for a, e in zip(wrong[1:], chain[1:])) > 1e-3


# ----------------------------------------------------------------------------
# the selective scan: the unrolled sequence, and the scan against a chain of steps written out here

def scan_inputs(rng, B=2, T=T_LONG, D=3, N=4, dtype=np.float64):
    x = rng.standard_normal((B, T, D))
    dt = np.exp(rng.uniform(np.log(0.05), np.log(1.0), (B, T, D)))   # steps large enough that the decay matters
    A = -np.exp(rng.normal(0, 0.5, (D, N)))
    Bm, Cm, Dskip = rng.standard_normal((B, T, N)), rng.standard_normal((B, T, N)), rng.standard_normal(D)
    return [a.astype(dtype) for a in (x, dt, A, Bm, Cm, Dskip)]


@pytest.mark.parametrize("path", ["numpy", "twin"])
def test_selective_scan_against_finite_differences(path):
    """All six inputs of the scan unrolled over T_LONG steps."""
    fwd, bwd = ((mamba.selective_scan_forward.numpy, mamba.selective_scan_backward.numpy) if path == "numpy"
                else (mamba_twins.selective_scan_forward, mamba_twins.selective_scan_backward))
    rng = np.random.default_rng(5)
    inputs = scan_inputs(rng)
    dy = rng.standard_normal(inputs[0].shape)
    check_grads(f"selective scan ({path})", lambda *a: fwd(*a)[0], inputs, dy, bwd(dy, fwd(*inputs)[1]))


def scan_chain(x, dt, A, Bm, Cm, Dskip, dy, wrong_step=False):
    """The scan's gradients through every named intermediate of every step, written out here:
        a_t = exp(dt_t A),  u_t = dt_t x_t B_t,  h_t = a_t h_{t-1} + u_t,  y_t = C_t . h_t + Dskip x_t,
    backward from t = T-1 to 0 carrying dh (the gradient at h_t from step t+1). wrong_step: dh carried
    through a_t instead of a_{t+1} (the control)."""
    Bsz, T, D = x.shape
    h, keep = np.zeros((Bsz, D, A.shape[1])), []
    for t in range(T):
        a = np.exp(dt[:, t, :, None] * A)
        u = (dt[:, t] * x[:, t])[:, :, None] * Bm[:, t, None, :]
        h_prev, h = h, a * h + u
        keep.append((a, h_prev, h))
    grads = [np.zeros_like(v) for v in (x, dt, A, Bm, Cm, Dskip)]
    dx, ddt, dA, dBm, dCm, dD = grads
    dh_carry = np.zeros_like(h)
    for t in reversed(range(T)):
        a, h_prev, h = keep[t]
        dh = dh_carry + dy[:, t, :, None] * Cm[:, t, None, :]              # y_t = C_t . h_t + ...
        dCm[:, t] = np.einsum("bd,bdn->bn", dy[:, t], h)
        dD += (dy[:, t] * x[:, t]).sum(axis=0)
        dx[:, t] += dy[:, t] * Dskip
        du = dh                                                             # h_t = a_t h_{t-1} + u_t
        da = dh * h_prev
        dBm[:, t] = np.einsum("bdn,bd->bn", du, dt[:, t] * x[:, t])        # u_t = dt_t x_t B_t
        dudtx = np.einsum("bdn,bn->bd", du, Bm[:, t])
        dx[:, t] += dudtx * dt[:, t]
        ddt[:, t] += dudtx * x[:, t]
        dexp = da * a                                                       # a_t = exp(dt_t A)
        ddt[:, t] += np.einsum("bdn,dn->bd", dexp, A)
        dA += np.einsum("bdn,bd->dn", dexp, dt[:, t])
        dh_carry = dh * (keep[t - 1][0] if wrong_step and t > 0 else a)   # to h_{t-1}: through a_t
    return grads


def test_selective_scan_against_a_chain_of_steps():
    """selective_scan_backward (NumPy and twin) equals the chain written out above; the chain carrying dh
    through the wrong step's decay differs."""
    rng = np.random.default_rng(6)
    inputs = scan_inputs(rng)
    dy = rng.standard_normal(inputs[0].shape)
    chain = scan_chain(*inputs, dy)
    for fwd, bwd in ((mamba.selective_scan_forward.numpy, mamba.selective_scan_backward.numpy),
                     (mamba_twins.selective_scan_forward, mamba_twins.selective_scan_backward)):
        got = bwd(dy, fwd(*inputs)[1])
        for name, a, e in zip(("dx", "ddt", "dA", "dB", "dC", "dD"), got, chain):
            assert rel_error(a, e) < 1e-12, (bwd.__module__, name, rel_error(a, e))
    wrong = scan_chain(*inputs, dy, wrong_step=True)
    assert rel_error(wrong[2], chain[2]) > 1e-3 and rel_error(wrong[0], chain[0]) > 1e-3


def test_selective_scan_by_hand():
    """One channel, one state, A = -1, dt = ln 2 (so a = 1/2), B = C = 1, Dskip = 0, x = (1, 0, 0):
    h = (ln 2, ln 2 / 2, ln 2 / 4) and y = h."""
    x = np.array([1.0, 0.0, 0.0]).reshape(1, 3, 1)
    dt = np.full((1, 3, 1), np.log(2.0))
    ones = np.ones((1, 3, 1))
    y, _ = mamba.selective_scan_forward.numpy(x, dt, np.array([[-1.0]]), ones, ones, np.zeros(1))
    np.testing.assert_allclose(y.ravel(), np.log(2.0) * np.array([1.0, 0.5, 0.25]))


# ----------------------------------------------------------------------------
# each twin against its NumPy op, in float32 and float64, the caches exchanged both ways

@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_lstm_twins_match_the_numpy_ops(dtype):
    rng = np.random.default_rng(7)
    x, w, b = lstm_inputs(rng, B=3, Cin=5, C=4, dtype=dtype)
    (h, cache), (h_ref, cache_ref) = lstm_twins.lstm_forward(x, w, b), lstm.lstm_forward.numpy(x, w, b)
    assert h.dtype == dtype and rel_error(h, h_ref) < TWIN_TOL[dtype]
    dh = rng.standard_normal(h.shape).astype(dtype)
    ref = lstm.lstm_backward.numpy(dh, cache_ref)
    for got in (lstm_twins.lstm_backward(dh, cache), lstm_twins.lstm_backward(dh, cache_ref),
                lstm.lstm_backward.numpy(dh, cache)):
        for name, a, e in zip(("dx", "dw", "db"), got, ref):
            assert a.dtype == dtype and rel_error(a, e) < TWIN_TOL[dtype], (name, rel_error(a, e))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_scan_twins_match_the_numpy_ops(dtype):
    rng = np.random.default_rng(8)
    inputs = scan_inputs(rng, B=3, D=5, N=6, dtype=dtype)
    (y, cache), (y_ref, cache_ref) = (mamba_twins.selective_scan_forward(*inputs),
                                      mamba.selective_scan_forward.numpy(*inputs))
    assert y.dtype == dtype and rel_error(y, y_ref) < TWIN_TOL[dtype]
    assert rel_error(cache[-1], cache_ref[-1]) < TWIN_TOL[dtype]                 # the states h_t
    dy = rng.standard_normal(y.shape).astype(dtype)
    ref = mamba.selective_scan_backward.numpy(dy, cache_ref)
    for got in (mamba_twins.selective_scan_backward(dy, cache), mamba_twins.selective_scan_backward(dy, cache_ref),
                mamba.selective_scan_backward.numpy(dy, cache)):
        for name, a, e in zip(("dx", "ddt", "dA", "dB", "dC", "dD"), got, ref):
            assert a.dtype == dtype and rel_error(a, e) < TWIN_TOL[dtype], (name, rel_error(a, e))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_elementwise_twins_match_the_numpy_ops(dtype):
    """SiLU and the softplus's backward: the twins against the NumPy ops, on (2, 3, 7) arrays that reach far
    into both tails (|x| up to 60, where exp(-x) overflows float32 without the |x| form)."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((2, 3, 7)) * 20).astype(dtype)
    x[0, 0, :3] = (-60, 60, 0)
    dy = rng.standard_normal(x.shape).astype(dtype)
    (y, (cx, s)), (y_ref, (_, s_ref)) = mamba_twins.silu_forward(x), mamba.silu_forward.numpy(x)
    assert y.dtype == dtype and y.shape == x.shape and cx is x and rel_error(y, y_ref) < TWIN_TOL[dtype]
    assert rel_error(s, s_ref) < TWIN_TOL[dtype] and s[0, 0, 2] == 0.5 and s[0, 0, 0] < 1e-20
    for got in (mamba_twins.silu_backward(dy, (x, s)), mamba_twins.silu_backward(dy, (x, s_ref))):
        assert got.dtype == dtype and rel_error(got, mamba.silu_backward.numpy(dy, (x, s_ref))) < TWIN_TOL[dtype]
    got = mamba_twins.softplus_backward(dy, x)
    assert got.dtype == dtype and rel_error(got, mamba.softplus_backward.numpy(dy, x)) < TWIN_TOL[dtype]
    assert got[0, 0, 2] == pytest.approx(dy[0, 0, 2] / 2, rel=1e-6)          # sigmoid(0) = 1/2


# ----------------------------------------------------------------------------
# initialisation, decay, the cost estimates

def test_initialisation_as_stated():
    cfg = lstm.Config(vocab_size=5, n_classes=3, d_model=6, n_layers=2)
    p = lstm.init_params(cfg, 0)
    for l in range(2):                                   # gate order i, f, g, o: only the forget block is 1
        np.testing.assert_array_equal(p[f"lstm.{l}.b"], np.r_[np.zeros(6), np.ones(6), np.zeros(12)])
    cfg = mamba.Config(vocab_size=5, n_classes=3, d_model=40, n_layers=1)
    assert cfg.dt_rank == 3                              # ceil(40 / 16)
    p = mamba.init_params(cfg, 0)
    np.testing.assert_allclose(-np.exp(p["blocks.0.A_log"]), -np.tile(np.arange(1, 17), (80, 1)), rtol=1e-6)
    np.testing.assert_array_equal(p["blocks.0.D"], np.ones(80))
    dt = mamba.softplus_forward(p["blocks.0.dt_proj.b"].astype(np.float64))[0]   # the first steps (r = 0)
    assert dt.min() >= 0.999 * mamba.DT_MIN and dt.max() <= 1.001 * mamba.DT_MAX
    assert dt.max() / dt.min() > 20                      # spread over the range, log-uniform
    # the two draws of the dense matrices and the embedding: fan-in N(0, 1/fan_in) and N(0, 1); gpt2 N(0, 0.02)
    # for both; the scan's own parameters the same either way
    big = mamba.Config(vocab_size=50, n_classes=3, d_model=400, n_layers=1)
    fan, gpt = mamba.init_params(big, 0), mamba.init_params(mamba.Config(50, 3, d_model=400, n_layers=1,
                                                                          init="gpt2"), 0)
    assert abs(fan["blocks.0.in_proj.w"].std() - 1 / 20) < 0.001 and abs(fan["wte"].std() - 1) < 0.01
    assert abs(gpt["blocks.0.in_proj.w"].std() - 0.02) < 0.0005 and abs(gpt["wte"].std() - 0.02) < 0.0005
    for name in ("blocks.0.A_log", "blocks.0.D", "blocks.0.dt_proj.b", "blocks.0.conv.w"):
        np.testing.assert_array_equal(fan[name], gpt[name])
    with pytest.raises(ValueError, match="init='xavier': allowed are 'fan-in', 'gpt2'"):
        mamba.Config(5, 3, init="xavier")


def test_weight_decay_per_tensor():
    assert models.decay_set("lstm", models.init_params("lstm", lstm.Config(5, 3, d_model=4, n_layers=1))) == \
        {"wte", "lstm.0.w", "unembed.w"}
    got = models.decay_set("ssm", models.init_params("ssm", mamba.Config(5, 3, d_model=4, n_layers=1)))
    assert got == {"wte", "unembed.w"} | {f"blocks.0.{k}.w" for k in ("in_proj", "conv", "x_proj", "dt_proj", "out_proj")}


def test_cost_estimates_by_hand():
    """C = 8, L = 2, K = 5, B = 2, T = 3 (float32, 4 bytes).
    LSTM FLOPs: per token 2 (2 * 16 * 32 + 30 * 8) + 2 * 8 * 5 = 2608; x 3 (forward and backward) x 6 tokens.
    LSTM parameters: 5 * 8 + 2 (16 * 32 + 32) + 16 + 40 + 5 = 1189; memory 4 (2 * 2 * 10 * 6 * 8 + 4 * 1189 + 3 * 6 * 5).
    SSM (D = 16, N = 16, R = 1, W = 4) FLOPs: per token 2 (512 + 1056 + 32 + 256 + 128 + 1536) + 80 = 7120, x 3 x 6.
    SSM memory per block: 6 * 16 * 16 + 16 * 6 * 16 + 6 * 6 * 8 = 3360."""
    cfg = lstm.Config(vocab_size=5, n_classes=5, d_model=8, n_layers=2)
    assert models.step_flops("lstm", cfg, 2, 3) == 3 * 2608 * 6
    assert models.count_params(models.param_shapes("lstm", cfg)) == 1189
    assert models.step_memory_bytes("lstm", cfg, 2, 3) == 4 * (2 * 2 * 10 * 6 * 8 + 4 * 1189 + 3 * 6 * 5)
    cfg = mamba.Config(vocab_size=5, n_classes=5, d_model=8, n_layers=2)
    assert models.step_flops("ssm", cfg, 2, 3) == 3 * 7120 * 6
    n = models.count_params(models.param_shapes("ssm", cfg))
    assert models.step_memory_bytes("ssm", cfg, 2, 3) == 4 * (2 * 3360 + 4 * n + 3 * 6 * 5)


# ----------------------------------------------------------------------------
# the twin switch

def test_a_name_twinned_twice_fails_at_import():
    """layers.twin refuses a second NumPy op of a taken name from another module; kernels.add_twins a second
    twin of a taken name; a module re-imported (the same op again) is fine."""
    def lstm_forward(x, w, b):                           # another module's op of the LSTM's name
        return x
    lstm_forward.__module__ = "another_family"
    with pytest.raises(ValueError, match="lstm_forward.*twinned already by families.lstm"):
        ly.twin(lstm_forward)
    ly.twin(lstm.lstm_forward.numpy)                      # the same op again: no complaint
    with pytest.raises(ValueError, match="gelu_forward.*taken already by kernels"):
        kernels.add_twins("another_family_twins", {"gelu_forward": lambda s: s})
    with pytest.raises(ValueError, match="selective_scan_forward.*taken already by families.mamba_twins"):
        kernels.add_twins("another_family_twins", {"selective_scan_forward": lambda *a: a})
    kernels.add_twins("families.mamba_twins", {"selective_scan_forward": mamba_twins.selective_scan_forward})
    assert kernels.twins()["lstm_forward"] is lstm_twins.lstm_forward


def test_an_op_without_its_twin_loaded_fails_loudly(monkeypatch):
    """An op marked @twin whose twins module was never imported: kernels.enabled() refuses to start (rather
    than run that op's NumPy code on the fast path without a word)."""
    monkeypatch.setitem(ly.TWINNED, "orphan_op", "orphan_family")
    with pytest.raises(RuntimeError, match="'orphan_op' of orphan_family has no twin loaded"):
        with kernels.enabled():
            pass
    assert ly.FAST == {}


def test_a_family_loaded_inside_the_fast_path_runs_its_twins():
    """A family's twins module imported inside `with kernels.enabled():` (a family first named there, as
    bench/recurrent.py did) joins the fast path at once, and leaves with it; outside the block, loading does not
    turn anything on."""
    def fake_twin(x):
        return x
    try:
        with kernels.enabled():
            assert ly.FAST                                          # on
            kernels.add_twins("_late_family_twins", {"_late_op": fake_twin})
            assert ly.FAST["_late_op"] is fake_twin
        assert "_late_op" not in ly.FAST
        with ly.use_twins({}):                                      # the NumPy path: nothing joins
            kernels.add_twins("_late_family_twins", {"_late_op": fake_twin})
            assert not ly.FAST
        with kernels.enabled():                                     # registered: on with the rest
            assert ly.FAST["_late_op"] is fake_twin
    finally:
        kernels.FAMILY_TWINS.pop("_late_op", None)


def test_models_loads_a_familys_twins():
    for name, twins in (("lstm", lstm_twins), ("ssm", mamba_twins)):
        assert models.module(name).TWINS == twins.__name__
        with kernels.enabled():
            assert all(ly.FAST[op] is getattr(twins, op) for op in twins.TWINS)


def test_lstm_learned_positions_clamped_past_the_limit():
    """pos "learned" with pos_limit 8 on 13 positions: positions 7..12 share row 7, so the gradient of row 7 is
    the sum of theirs (finite differences on the embeddings and a layer's parameters; tests/test_families.py checks
    the rest), and rows 8.. get none."""
    cfg = lstm.Config(vocab_size=5, n_classes=3, max_len=13, d_model=4, n_layers=2, dtype="float64", pos="learned",
                      pos_limit=8)
    rng = np.random.default_rng(9)
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in lstm.init_params(cfg, 0).items()}
    tokens, targets, mask = rng.integers(0, 5, (2, 13)), rng.integers(0, 3, (2, 13)), np.ones((2, 13))
    loss = lambda: models.loss_and_grads("lstm", params, tokens, targets, mask, cfg)[0]
    _, grads = models.loss_and_grads("lstm", params, tokens, targets, mask, cfg)
    assert np.all(grads["wpe"][8:] == 0) and np.all(grads["wpe"][7] != 0)
    for name in ("wpe", "wte", "lstm.0.b", "lstm.1.w"):
        p = params[name]
        num = np.zeros_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + 1e-5
            up = loss()
            p[i] = old - 1e-5
            num[i] = (up - loss()) / 2e-5
            p[i] = old
        assert rel_error(grads[name], num) < TOL64, (name, rel_error(grads[name], num))


def test_the_shared_a_variant_against_finite_differences():
    """--shared-a (the authors' variant): one A_log (N,) for every channel; its gradient sums the per-channel
    one over the channels. Checked against finite differences in float64 on 13 positions, every tensor, and
    against the per-channel model whose rows all equal it (same logits, the channel sum of its A_log gradient)."""
    import models
    cfg = models.make_config("ssm", vocab_size=5, n_classes=4, max_len=13, d_model=8, n_layers=1, dtype="float64",
                             shared_a=True)
    rng = np.random.default_rng(0)
    params = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in models.init_params("ssm", cfg, 0).items()}
    assert params["blocks.0.A_log"].shape == (cfg.d_state,)
    tokens, targets = rng.integers(0, 5, (2, 13)), rng.integers(0, 4, (2, 13))
    loss = lambda p: models.loss_and_grads("ssm", p, tokens, targets, np.ones((2, 13)), cfg)
    _, grads = loss(params)
    h = 1e-5
    for k, p in params.items():
        for i in [tuple(rng.integers(0, d) for d in p.shape) for _ in range(3)]:
            old = p[i]
            p[i] = old + h
            up = loss(params)[0]
            p[i] = old - h
            down = loss(params)[0]
            p[i] = old
            assert rel_error(grads[k][i], (up - down) / (2 * h)) < 1e-6, (k, i)
    full_cfg = models.make_config("ssm", **{**dataclasses.asdict(cfg), "shared_a": False})
    D = cfg.expand * cfg.d_model
    full = {**params, "blocks.0.A_log": np.tile(params["blocks.0.A_log"], (D, 1))}
    full_loss, full_grads = models.loss_and_grads("ssm", full, tokens, targets, np.ones((2, 13)), full_cfg)
    assert full_loss == pytest.approx(loss(params)[0], rel=1e-12)
    assert np.allclose(full_grads["blocks.0.A_log"].sum(0), grads["blocks.0.A_log"], rtol=1e-10, atol=1e-14)


def test_the_sweeps_choices_are_the_families_presets():
    """The learning rate and initialisation each family's sweep chose (families/README.md) reach its runs through the
    presets, over the task's own; a typed flag still wins."""
    import train
    a = train.parse_args(["--model", "lstm", "--task", "hmm", "--preset", "paper"])
    assert (a.lr, a.init, a.steps) == (3e-3, "fan-in", 17000)           # the HMM's task preset says lr 1.5e-3
    a = train.parse_args(["--model", "lstm", "--task", "transport"])
    assert (a.lr, a.init) == (3e-3, "uniform")                          # the task's 2e-3, the Config's fan-in
    a = train.parse_args(["--model", "lstm", "--task", "bijection", "--lr", "5e-3"])
    assert (a.lr, a.init) == (5e-3, "fan-in")
    a = train.parse_args(["--model", "ssm", "--task", "recall"])
    assert (a.lr, a.init) == (1e-2, "fan-in")                           # the task's 3e-3
    a = train.parse_args(["--model", "transformer", "--task", "hmm", "--preset", "paper"])
    assert a.lr == 1.5e-3                                               # other families keep the task's
