"""Checks for mlp_baseline.py: per-tensor finite-difference gradients, the fast input layer
against the dense one-hot reference, causality, capacity matching, and a one-batch overfit.

Finite differences are centred (h = 1e-5) in float64 on tiny shapes, as in test_bayesattn.py.
Relative error = max|a - n| / max(max|a|, max|n|) per tensor.
"""

import numpy as np
import pytest

import bayesattn as ba
import optim
import mlp_baseline as mb

# the same finite-difference helpers as the transformer's checks (one copy, in test_bayesattn.py)
from test_bayesattn import GRAD_TOL, H, assert_grads, numerical_grad, rel_error  # noqa: E402,F401


def tiny_mlp(seed=0, max_len=5, inputs="prefix"):
    mcfg = mb.MLPConfig(vocab_size=4, n_classes=3, max_len=max_len, width=4, n_blocks=2, dtype="float64",
                        inputs=inputs)
    params = mb.mlp_init_params(mcfg, seed)
    rng = np.random.default_rng(seed + 100)
    for name in params:                                         # non-trivial weights everywhere
        params[name] = params[name] + rng.normal(0, 0.3, params[name].shape)
    return mcfg, params


# ----------------------------------------------------------------------------
# the input layer: dense one-hot reference, fast gather + cumulative sum

def test_prefix_onehot_layout():
    x = mb.prefix_onehot(np.array([[2, 0, 1]]), max_len=4, V=3)  # (1, 3, 12)
    assert x.shape == (1, 3, 12)
    np.testing.assert_array_equal(x[0, 1].reshape(4, 3), [[0, 0, 1],   # slot 0: token 2
                                                           [1, 0, 0],   # slot 1: token 0
                                                           [0, 0, 0],   # slot 2: not yet seen
                                                           [0, 0, 0]])  # slot 3: padding
    np.testing.assert_array_equal(x[0].sum(-1), [1, 2, 3])       # t + 1 filled slots at position t


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_input_layer_equals_dense_reference(dtype):
    rng = np.random.default_rng(1)
    V, T_max, Hd = 5, 7, 4
    tokens = rng.integers(0, V, (3, 6))                         # T = 6 < T_max: slot 6 is always padding
    w, b = rng.normal(size=(T_max * V, Hd)).astype(dtype), rng.normal(size=Hd).astype(dtype)
    dh = rng.normal(size=(3, 6, Hd)).astype(dtype)
    h, idx = mb.prefix_linear_forward(tokens, w, b, V)
    h_ref, x = mb.prefix_linear_ref(tokens, w, b, V)
    dw, db = mb.prefix_linear_backward(dh, idx, w)
    _, dw_ref, db_ref = ba.linear_backward(dh, x, w)            # dense: dW = x^T dh, db = sum dh
    tol = 1e-12 if dtype == np.float64 else 1e-5
    for name, a, e in (("h", h, h_ref), ("dw", dw, dw_ref), ("db", db, db_ref)):
        assert a.dtype == dtype, name
        err = rel_error(a.astype(np.float64), e.astype(np.float64))
        assert err <= tol, f"{name}: fast vs dense relative error {err:.2e} > {tol:g}"
    assert np.all(dw.reshape(T_max, V, Hd)[6] == 0)             # padding slots get no gradient


def test_input_layer_backward():
    rng = np.random.default_rng(2)
    V, tokens = 3, np.array([[0, 2, 2, 1], [1, 1, 0, 2]])        # repeated (slot, token) rows must add up
    w, b, dh = rng.normal(size=(5 * V, 4)), rng.normal(size=4), rng.normal(size=(2, 4, 4))
    _, idx = mb.prefix_linear_forward(tokens, w, b, V)
    dw, db = mb.prefix_linear_backward(dh, idx, w)
    f = lambda _: mb.prefix_linear_forward(tokens, w, b, V)[0]
    assert_grads({"w": dw, "b": db}, {"w": numerical_grad(f, w, dh), "b": numerical_grad(f, b, dh)})


# ----------------------------------------------------------------------------
# the whole MLP: every parameter tensor against finite differences

@pytest.mark.parametrize("inputs", mb.INPUTS)
@pytest.mark.parametrize("soft", [False, True], ids=["hard-targets", "soft-targets"])
def test_mlp_gradients(soft, inputs):
    mcfg, params = tiny_mlp(inputs=inputs)
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 4, (2, 4))                          # T = 4 < max_len = 5: padding is exercised
    mask = np.array([[1, 1, 0, 1], [0, 1, 1, 1]], dtype=float)
    targets = rng.dirichlet(np.ones(3), size=(2, 4)) if soft else rng.integers(0, 3, (2, 4))
    loss, grads = mb.mlp_loss_and_grads(params, tokens, targets, mask, mcfg)
    assert set(grads) == set(params)
    f = lambda _: np.array(ba.cross_entropy(mb.mlp_forward(params, tokens, mcfg)[0], targets, mask)[0])
    numeric = {name: numerical_grad(f, params[name], np.array(1.0)) for name in params}
    errors = assert_grads(grads, numeric)
    print("\nworst relative error per tensor:\n" + "\n".join(f"  {k:22s} {v:.2e}" for k, v in errors.items()))


def test_token_mlp_sees_only_its_token_and_position():
    """The authors' MLP: changing any other token leaves a position's output alone; its own token does not."""
    mcfg, params = tiny_mlp(inputs="token")
    tokens = np.random.default_rng(4).integers(0, 4, (3, 5))
    logits = mb.mlp_forward(params, tokens, mcfg)[0]
    for t in range(5):
        changed = tokens.copy()
        changed[:, t] = (changed[:, t] + 1) % 4
        other = mb.mlp_forward(params, changed, mcfg)[0]
        keep = np.arange(5) != t
        np.testing.assert_array_equal(other[:, keep], logits[:, keep])
        assert np.all(np.abs(other[:, t] - logits[:, t]).max(-1) > 1e-6)
    # the same token at two positions gives two outputs: the position is an input
    same = np.zeros((1, 5), dtype=int)
    out = mb.mlp_forward(params, same, mcfg)[0][0]
    assert np.abs(out[0] - out[1]).max() > 1e-6


def test_causality():
    mcfg, params = tiny_mlp()
    tokens = np.random.default_rng(4).integers(0, 4, (3, 5))
    logits, cache = mb.mlp_forward(params, tokens, mcfg)
    assert logits.shape == (3, 5, 3) and len(cache["resid"]) == mcfg.n_blocks + 1
    t2 = tokens.copy()
    t2[:, 3] = (t2[:, 3] + 1) % 4
    logits2 = mb.mlp_forward(params, t2, mcfg)[0]
    np.testing.assert_array_equal(logits2[:, :3], logits[:, :3])  # earlier positions cannot see token 3
    assert np.all(np.abs(logits2[:, 3:] - logits[:, 3:]).max(-1) > 1e-6)  # later ones do
    t3 = tokens.copy()
    t3[:, 0] = (t3[:, 0] + 1) % 4                                 # the last position sees the first token
    assert np.all(np.abs(mb.mlp_forward(params, t3, mcfg)[0][:, -1] - logits[:, -1]).max(-1) > 1e-6)


def test_predict_proba():
    mcfg, params = tiny_mlp()
    tokens = np.random.default_rng(5).integers(0, 4, (5, 5))
    p = mb.mlp_predict_proba(params, tokens, mcfg, batch=2)     # three chunks
    assert p.shape == (5, 5, 3) and p.dtype == np.float64
    np.testing.assert_allclose(p.sum(-1), 1.0)
    np.testing.assert_allclose(p, ba.softmax.numpy(mb.mlp_forward(params, tokens, mcfg)[0]), rtol=1e-12)


def test_float32_stays_float32():
    mcfg = mb.MLPConfig(vocab_size=4, n_classes=3, max_len=5, width=8, n_blocks=2)
    params = mb.mlp_init_params(mcfg)
    tokens = np.random.default_rng(6).integers(0, 4, (2, 5))
    loss, grads = mb.mlp_loss_and_grads(params, tokens, tokens % 3, np.ones((2, 5)), mcfg)
    assert all(v.dtype == np.float32 for v in params.values())
    assert all(grads[k].dtype == np.float32 and grads[k].shape == params[k].shape for k in params)


# ----------------------------------------------------------------------------
# capacity matching

@pytest.mark.parametrize("inputs", mb.INPUTS)
def test_param_count_and_decay(inputs):
    for width, n_blocks in ((3, 1), (17, 4)):
        mcfg = mb.MLPConfig(vocab_size=40, n_classes=20, max_len=38, width=width, n_blocks=n_blocks, inputs=inputs)
        params = mb.mlp_init_params(mcfg)
        assert ba.count_params(params) == mb.mlp_param_count(40, 20, 38, width, n_blocks, inputs)
    decayed = {k for k in params if optim.default_decay(k)}        # matrices decay; biases and LN gains do not
    assert decayed == {k for k, v in params.items() if v.ndim == 2}


@pytest.mark.parametrize("inputs", mb.INPUTS)
@pytest.mark.parametrize("d_model, n_layers", [(64, 4), (128, 6)])
def test_match_width_is_capacity_matched(d_model, n_layers, inputs):
    cfg = ba.Config(vocab_size=40, n_classes=20, max_len=38, d_model=d_model, n_layers=n_layers, n_heads=4)
    target = ba.count_params(ba.init_params(cfg))
    mcfg = mb.match_width(40, 20, 38, n_layers, target, inputs=inputs)
    assert mcfg.inputs == inputs
    n = ba.count_params(mb.mlp_init_params(mcfg))
    assert abs(n - target) <= 0.05 * target, f"MLP {n} vs transformer {target} parameters"
    for other in (mcfg.width - 1, mcfg.width + 1):              # and no other width is closer
        assert abs(mb.mlp_param_count(40, 20, 38, other, n_layers, inputs) - target) >= abs(n - target)


def test_match_width_rejects_unreachable_target():
    with pytest.raises(ValueError, match="within 5%"):
        mb.match_width(40, 20, 38, 4, 100)                      # even width 1 has more parameters


def test_config_and_inputs_rejected():
    with pytest.raises(ValueError, match="width=0"):
        mb.MLPConfig(vocab_size=4, n_classes=3, max_len=5, width=0, n_blocks=1)
    with pytest.raises(ValueError, match="dtype='float16'"):
        mb.MLPConfig(vocab_size=4, n_classes=3, max_len=5, width=4, n_blocks=1, dtype="float16")
    with pytest.raises(ValueError, match="inputs='grid': allowed are 'token', 'prefix'"):
        mb.MLPConfig(vocab_size=4, n_classes=3, max_len=5, width=4, n_blocks=1, inputs="grid")
    mcfg, params = tiny_mlp()
    with pytest.raises(ValueError, match="token ids must lie in 0..3"):
        mb.mlp_forward(params, np.array([[0, 4]]), mcfg)
    with pytest.raises(ValueError, match="exceeds max_len=5"):
        mb.mlp_forward(params, np.zeros((1, 6), dtype=int), mcfg)
    assert mb.MLPConfig(**mcfg.to_dict()) == mcfg


# ----------------------------------------------------------------------------
# training

def test_tiny_mlp_overfits_one_batch():
    mcfg = mb.MLPConfig(vocab_size=10, n_classes=6, max_len=8, width=16, n_blocks=2, dtype="float64")
    params = mb.mlp_init_params(mcfg, 0)
    state = optim.adamw_init(params)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 10, (4, 8))
    tokens[:, 0] = rng.permutation(10)[:4]                      # distinct first tokens: every prefix is unique
    targets, mask = rng.integers(0, 6, (4, 8)), np.ones((4, 8))
    first = None
    for step in range(100):
        loss, grads = mb.mlp_loss_and_grads(params, tokens, targets, mask, mcfg)
        first = loss if first is None else first
        optim.clip_grad_norm(grads, 1.0)
        optim.adamw_step(params, grads, state, 1e-2)
    assert first > 1.5 and loss < 0.05, f"loss went from {first:.3f} to {loss:.3f}; expected below 0.05"
