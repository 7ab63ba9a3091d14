"""Checks for families/mlp_baseline.py: per-tensor finite-difference gradients, the fast input layer
against the dense one-hot reference, causality, capacity matching (models.match_capacity), older
checkpoints' field names, and a one-batch overfit.

Finite differences are centred (h = 1e-5) in float64 on tiny shapes, as in test_bayesattn.py.
Relative error = max|a - n| / max(max|a|, max|n|) per tensor.
"""

import json

import numpy as np
import pytest

import bayesattn as ba
from harness import checkpoints
import layers
import models
import optim
from families import mlp_baseline as mb

# the same finite-difference helpers as the transformer's checks (one copy, in test_bayesattn.py)
from test_bayesattn import assert_grads, numerical_grad, rel_error  # noqa: E402

pytestmark = pytest.mark.plain_python   # .ci/run checks this module again without the JIT


FAMILY = {"token": "mlp", "prefix": "prefix-mlp"}   # models.FAMILIES: the registered name of each input kind


def tiny_mlp(seed=0, max_len=5, inputs="prefix"):
    mcfg = mb.Config(vocab_size=4, n_classes=3, max_len=max_len, d_model=4, n_layers=2, dtype="float64",
                     inputs=inputs)
    params = mb.init_params(mcfg, seed)
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
    h, cache = mb.prefix_linear_forward(tokens, w, b, V)
    h_ref, dense_cache = mb.prefix_linear_ref(tokens, w, b, V)   # cache (x, w), x the one-hot prefix grid
    dw, db = mb.prefix_linear_backward(dh, cache)
    _, dw_ref, db_ref = layers.linear_backward(dh, dense_cache)   # dense: dW = x^T dh, db = sum dh
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
    _, cache = mb.prefix_linear_forward(tokens, w, b, V)
    dw, db = mb.prefix_linear_backward(dh, cache)
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
    loss, grads = models.loss_and_grads(FAMILY[inputs], params, tokens, targets, mask, mcfg)
    assert set(grads) == set(params)
    f = lambda _: np.array(layers.cross_entropy(mb.forward(params, tokens, mcfg)[0], targets, mask)[0])
    numeric = {name: numerical_grad(f, params[name], np.array(1.0)) for name in params}
    errors = assert_grads(grads, numeric)
    print("\nworst relative error per tensor:\n" + "\n".join(f"  {k:22s} {v:.2e}" for k, v in errors.items()))


def test_token_mlp_sees_only_its_token_and_position():
    """The authors' MLP: changing any other token leaves a position's output alone; its own token does not."""
    mcfg, params = tiny_mlp(inputs="token")
    tokens = np.random.default_rng(4).integers(0, 4, (3, 5))
    logits = mb.forward(params, tokens, mcfg)[0]
    for t in range(5):
        changed = tokens.copy()
        changed[:, t] = (changed[:, t] + 1) % 4
        other = mb.forward(params, changed, mcfg)[0]
        keep = np.arange(5) != t
        np.testing.assert_array_equal(other[:, keep], logits[:, keep])
        assert np.all(np.abs(other[:, t] - logits[:, t]).max(-1) > 1e-6)
    # the same token at two positions gives two outputs: the position is an input
    same = np.zeros((1, 5), dtype=int)
    out = mb.forward(params, same, mcfg)[0][0]
    assert np.abs(out[0] - out[1]).max() > 1e-6


def test_causality():
    mcfg, params = tiny_mlp()
    tokens = np.random.default_rng(4).integers(0, 4, (3, 5))
    logits, cache = mb.forward(params, tokens, mcfg)
    assert logits.shape == (3, 5, 3) and len(cache["resid"]) == mcfg.n_layers + 1
    t2 = tokens.copy()
    t2[:, 3] = (t2[:, 3] + 1) % 4
    logits2 = mb.forward(params, t2, mcfg)[0]
    np.testing.assert_array_equal(logits2[:, :3], logits[:, :3])  # earlier positions cannot see token 3
    assert np.all(np.abs(logits2[:, 3:] - logits[:, 3:]).max(-1) > 1e-6)  # later ones do
    t3 = tokens.copy()
    t3[:, 0] = (t3[:, 0] + 1) % 4                                 # the last position sees the first token
    assert np.all(np.abs(mb.forward(params, t3, mcfg)[0][:, -1] - logits[:, -1]).max(-1) > 1e-6)


def test_predict_proba():
    mcfg, params = tiny_mlp()
    tokens = np.random.default_rng(5).integers(0, 4, (5, 5))
    p = models.predict_proba("prefix-mlp", params, tokens, mcfg, batch=2)     # three chunks
    assert p.shape == (5, 5, 3) and p.dtype == np.float64
    np.testing.assert_allclose(p.sum(-1), 1.0)
    np.testing.assert_allclose(p, layers.softmax(mb.forward(params, tokens, mcfg)[0]), rtol=1e-12)


def test_float32_stays_float32():
    mcfg = mb.Config(vocab_size=4, n_classes=3, max_len=5, d_model=8, n_layers=2)
    params = mb.init_params(mcfg)
    tokens = np.random.default_rng(6).integers(0, 4, (2, 5))
    loss, grads = models.loss_and_grads("prefix-mlp", params, tokens, tokens % 3, np.ones((2, 5)), mcfg)
    assert all(v.dtype == np.float32 for v in params.values())
    assert all(grads[k].dtype == np.float32 and grads[k].shape == params[k].shape for k in params)


# ----------------------------------------------------------------------------
# capacity matching

def mlp_param_count(V, K, T_max, H, N, inputs):
    """The parameter count by hand: the input layer (wte V x H and wpe T_max x H, or W_in (T_max V) x H and
    b_in H), N blocks of LN (2H), W_1 b_1 (H M + M), W_2 b_2 (M H + H) with M = 4H, the final LN (2H) and
    the head (H K + K)."""
    M = 4 * H
    first = V * H + T_max * H if inputs == "token" else T_max * V * H + H
    return first + N * (2 * H + H * M + M + M * H + H) + 2 * H + H * K + K


@pytest.mark.parametrize("inputs", mb.INPUTS)
def test_param_count_and_decay(inputs):
    for width, n_layers in ((3, 1), (17, 4)):
        mcfg = mb.Config(vocab_size=40, n_classes=20, max_len=38, d_model=width, n_layers=n_layers, inputs=inputs)
        params = mb.init_params(mcfg)
        want = mlp_param_count(40, 20, 38, width, n_layers, inputs)
        assert models.count_params(params) == want
        assert models.count_params(models.param_shapes(FAMILY[inputs], mcfg)) == want
    decayed = models.decay_set(FAMILY[inputs], params)          # matrices decay; biases and LN gains do not
    assert decayed == {k for k, v in params.items() if v.ndim == 2}


@pytest.mark.parametrize("inputs", mb.INPUTS)
@pytest.mark.parametrize("d_model, n_layers", [(64, 4), (128, 6)])
def test_match_capacity_is_capacity_matched(d_model, n_layers, inputs):
    cfg = ba.Config(vocab_size=40, n_classes=20, max_len=38, d_model=d_model, n_layers=n_layers, n_heads=4)
    target = models.count_params(ba.init_params(cfg))
    fields = dict(vocab_size=40, n_classes=20, max_len=38, n_layers=n_layers)
    mcfg = models.match_capacity(FAMILY[inputs], fields, target)
    assert isinstance(mcfg, mb.Config) and mcfg.inputs == inputs and mcfg.n_layers == n_layers
    n = models.count_params(mb.init_params(mcfg))
    assert abs(n - target) <= 0.05 * target, f"MLP {n} vs transformer {target} parameters"
    for other in (mcfg.d_model - 1, mcfg.d_model + 1):          # and no other width is closer
        assert abs(mlp_param_count(40, 20, 38, other, n_layers, inputs) - target) >= abs(n - target)


def test_match_capacity_rejects_unreachable_target():
    with pytest.raises(ValueError, match="within 5%"):          # even width 1 has more parameters
        models.match_capacity("prefix-mlp", dict(vocab_size=40, n_classes=20, max_len=38, n_layers=4), 100)


def test_config_and_inputs_rejected():
    with pytest.raises(ValueError, match="d_model=0"):
        mb.Config(vocab_size=4, n_classes=3, max_len=5, d_model=0, n_layers=1)
    with pytest.raises(ValueError, match="n_layers=0"):
        mb.Config(vocab_size=4, n_classes=3, max_len=5, d_model=4, n_layers=0)
    with pytest.raises(ValueError, match="dtype='float16'"):
        mb.Config(vocab_size=4, n_classes=3, max_len=5, d_model=4, n_layers=1, dtype="float16")
    with pytest.raises(ValueError, match="inputs='grid': allowed are 'token', 'prefix'"):
        mb.Config(vocab_size=4, n_classes=3, max_len=5, d_model=4, n_layers=1, inputs="grid")
    with pytest.raises(ValueError, match="model 'mlp' has inputs='token', not 'prefix'"):
        models.make_config("mlp", vocab_size=4, n_classes=3, max_len=5, inputs="prefix")
    mcfg, params = tiny_mlp()
    with pytest.raises(ValueError, match="token ids must lie in 0..3"):
        models.forward("mlp", params, np.array([[0, 4]]), mcfg)
    with pytest.raises(ValueError, match="exceeds max_len=5"):
        mb.forward(params, np.zeros((1, 6), dtype=int), mcfg)
    assert mb.Config(**mcfg.to_dict()) == mcfg


# ----------------------------------------------------------------------------
# older checkpoints: the config fields width, n_blocks (before the shared names d_model, n_layers)

def test_upgrade_fields_renames_only_the_old_names():
    old = dict(vocab_size=4, n_classes=3, max_len=5, width=6, n_blocks=2, dtype="float32", inputs="token")
    assert mb.upgrade_fields(old) == dict(vocab_size=4, n_classes=3, max_len=5, d_model=6, n_layers=2,
                                          dtype="float32", inputs="token")
    assert mb.upgrade_fields(mb.upgrade_fields(old)) == mb.upgrade_fields(old)      # today's names stay
    assert models.config_from_dict("mlp", old) == mb.Config(4, 3, 5, d_model=6, n_layers=2, inputs="token")


@pytest.mark.parametrize("model, inputs", [("mlp", "token"), ("prefix-mlp", "prefix")])
def test_checkpoint_with_old_field_names_loads(model, inputs, tmp_path):
    """A checkpoint as the code before the shared names wrote it (MLPConfig.to_dict(): width, n_blocks) loads
    into today's Config with the same parameters, bit for bit."""
    cfg = mb.Config(vocab_size=4, n_classes=3, max_len=5, d_model=6, n_layers=2, inputs=inputs)
    params = mb.init_params(cfg, seed=3)
    old_fields = dict(vocab_size=4, n_classes=3, max_len=5, width=6, n_blocks=2, dtype="float32", inputs=inputs)
    meta = {"model": model, "task": "bijection", "step": 7}
    path = tmp_path / "checkpoint_mlp.npz"
    np.savez(path, config=np.array(json.dumps(old_fields)), meta=np.array(json.dumps(meta)),
             **{f"param:{k}": v for k, v in params.items()})
    loaded, lcfg, lmeta, opt_state = checkpoints.load_checkpoint(str(path))
    assert lcfg == cfg and lmeta == meta and opt_state is None
    assert set(loaded) == set(params)
    for k in params:
        assert loaded[k].dtype == params[k].dtype and np.array_equal(loaded[k], params[k]), k
    tokens = np.random.default_rng(8).integers(0, 4, (2, 5))  # and it runs as the model it was
    np.testing.assert_array_equal(mb.forward(loaded, tokens, lcfg)[0], mb.forward(params, tokens, cfg)[0])


# ----------------------------------------------------------------------------
# training

def test_tiny_mlp_overfits_one_batch():
    mcfg = mb.Config(vocab_size=10, n_classes=6, max_len=8, d_model=16, n_layers=2, dtype="float64")
    params = mb.init_params(mcfg, 0)
    state = optim.adamw_init(params)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 10, (4, 8))
    tokens[:, 0] = rng.permutation(10)[:4]                      # distinct first tokens: every prefix is unique
    targets, mask = rng.integers(0, 6, (4, 8)), np.ones((4, 8))
    first = None
    for step in range(100):
        loss, grads = models.loss_and_grads("prefix-mlp", params, tokens, targets, mask, mcfg)
        first = loss if first is None else first
        optim.clip_grad_norm(grads, 1.0)
        optim.adamw_step(params, grads, state, 1e-2)
    assert first > 1.5 and loss < 0.05, f"loss went from {first:.3f} to {loss:.3f}; expected below 0.05"
