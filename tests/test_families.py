"""The conformance checks every registered model family passes (the way scikit-learn's check_estimator runs
the same checks on any estimator): a family is tested by being registered in models.FAMILIES.

For each family, on tiny shapes:
  - every parameter's gradient against centred finite differences, float64, hard and soft targets, on the
    NumPy path and on the fast path (the Numba twins), on every task's tiny settings, each at least
    MIN_GRAD_T = 12 positions long (what a recurrence carries to the wrong step shows only over many steps);
  - the fast path against the NumPy path: logits and every gradient;
  - a checkpoint round trip (the family read back from the checkpoint's meta);
  - a short training run on every task, through the project's loop, that must bring the held-out KL below
    its value at initialisation by MARGIN (a backward that returns zeros, or the wrong sign, fails it).
And the registry itself: adding a family is one module and one entry (a toy family, written here to a
temporary module, trains, resumes, evaluates and refuses a flag it lacks through train.py).
"""

import dataclasses
import importlib.util
import json
import os
import sys
import textwrap
import types

import layers as ly  # first: it pins OpenBLAS to one thread before NumPy loads
import kernels
import models
import optim
import numpy as np
import pytest
from tunnels import tasks
import training
from tunnels import windtunnels as wt
from harness.checkpoints import load_checkpoint, save_checked

pytestmark = pytest.mark.plain_python   # .ci/run checks this module again without the JIT

FAMILIES = sorted(models.FAMILIES)
MARGIN = 0.05               # the trained held-out KL must be at most (1 - MARGIN) x the KL at initialisation
TRAIN_STEPS = 40            # steps of the short training run (tiny shapes: seconds)
TOL = {"float64": 1e-6}     # worst relative error of a gradient against finite differences, per tensor
MIN_GRAD_T = 12             # the gradient checks' sequences are at least this long
TINY = {t: tasks.task(t).TINY["train"] for t in tasks.TASKS}        # each task's own: the training runs
GRAD_TINY = {t: tasks.task(t).TINY["grad"] for t in tasks.TASKS}    # ... and the gradient checks (>= 12 positions)


def tiny_config(name, task="bijection", dtype="float64", given=None, n_layers=1):
    """The family's Config at the smallest shapes of a task (TINY, or the given settings): width 8, n_layers
    layers (2 heads where it has them)."""
    s = tasks.settings(task, TINY[task] if given is None else given)
    sizes = tasks.sizes(task, s)
    fields = dict(vocab_size=sizes["vocab"], n_classes=sizes["classes"], max_len=sizes["max_len"], d_model=8,
                  n_layers=n_layers, dtype=dtype)
    if "n_heads" in models.config_fields(name):
        fields["n_heads"] = 2
    return models.make_config(name, **{k: v for k, v in fields.items() if k in models.config_fields(name)}), s


def tiny_batch(task, s, n=3, seed=0):
    return tasks.sample(task, np.random.default_rng(seed), n, s)


def loss_fn(name, cfg, params, batch, soft):
    targets = batch["posterior"] if soft else batch["targets"]
    return models.loss_and_grads(name, params, batch["tokens"], targets, batch["mask"], cfg)


def rel_error(a, b, floor=1e-12):
    """max |a - b| over max(|a|, |b|, floor): floor keeps a gradient that is zero in exact arithmetic (the key
    bias: softmax ignores a shift shared by all keys) from comparing rounding noise with rounding noise."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), np.max(np.abs(b)), floor))


@pytest.fixture(params=["numpy", "numba"])
def path(request):
    """Each check on the NumPy path (as written) and on the fast path (the Numba twins)."""
    if request.param == "numba":
        with kernels.enabled():
            yield request.param
    else:
        with ly.use_twins({}):
            yield request.param


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("task", sorted(tasks.TASKS))
@pytest.mark.parametrize("name", FAMILIES)
def test_every_gradient_against_finite_differences(name, task, soft, path):
    """Two layers (what passes between layers is checked too), sequences of at least MIN_GRAD_T positions;
    the worst relative error per tensor is printed (pytest -s shows it) and named in a failure."""
    cfg, s = tiny_config(name, task, given=GRAD_TINY[task], n_layers=2)
    params = {k: v + 0.3 * np.random.default_rng(1).standard_normal(v.shape)    # away from a symmetric start
              for k, v in models.init_params(name, cfg, 0).items()}
    batch = tiny_batch(task, s, n=2)
    assert batch["tokens"].shape[1] >= MIN_GRAD_T, f"{task}: {batch['tokens'].shape[1]} positions"
    _, grads = loss_fn(name, cfg, params, batch, soft)
    assert set(grads) == set(params)
    h, worst = 1e-5, {}
    rng = np.random.default_rng(2)
    for k, p in params.items():
        idx = [tuple(rng.integers(0, d) for d in p.shape) for _ in range(4)]   # four entries per tensor
        num = []
        for i in idx:
            old = p[i]
            p[i] = old + h
            up = loss_fn(name, cfg, params, batch, soft)[0]
            p[i] = old - h
            down = loss_fn(name, cfg, params, batch, soft)[0]
            p[i] = old
            num.append((up - down) / (2 * h))
        ana = np.array([grads[k][i] for i in idx])
        worst[k] = rel_error(ana, np.array(num)) if np.any(np.abs(num) > 1e-9) or np.any(np.abs(ana) > 1e-9) else 0.0
    print(f"\n{name} {task} {'soft' if soft else 'hard'} {path}: worst relative error per tensor: "
          + ", ".join(f"{k} {e:.1e}" for k, e in worst.items()))
    bad = {k: f"{e:.1e}" for k, e in worst.items() if e > TOL["float64"]}
    assert not bad, f"{name} on {task}: worst relative error per tensor above {TOL['float64']}: {bad}"


@pytest.mark.parametrize("name", FAMILIES)
def test_fast_path_matches_the_numpy_path(name):
    cfg, s = tiny_config(name)
    params = models.init_params(name, cfg, 0)
    batch = tiny_batch("bijection", s)
    with ly.use_twins({}):
        ref_loss, ref = loss_fn(name, cfg, params, batch, True)
        ref_logits, _ = models.module(name).forward(params, batch["tokens"], cfg)
    with kernels.enabled():
        loss, fast = loss_fn(name, cfg, params, batch, True)
        logits, _ = models.module(name).forward(params, batch["tokens"], cfg)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    assert rel_error(logits, ref_logits) < 1e-12
    scale = max(float(np.max(np.abs(g))) for g in ref.values())
    worst = {k: rel_error(fast[k], ref[k], 1e-6 * scale) for k in ref}
    assert max(worst.values()) < 1e-10, worst


@pytest.mark.parametrize("name", FAMILIES)
def test_twins_module_names_exactly_the_ops_marked_twin(name):
    """A family with a TWINS module: its TWINS tuple names exactly the family's own ops marked @twin, each twin
    with its op's signature, and the fast path hands out those twins."""
    import importlib
    import inspect
    mod = models.module(name)
    if not hasattr(mod, "TWINS"):
        pytest.skip(f"{name} has no twins module of its own")
    twins = importlib.import_module(mod.TWINS)
    ops = {k: op for k, op in vars(mod).items() if hasattr(op, "numpy") and op.__module__ == mod.__name__}
    assert ops and set(twins.TWINS) == set(ops)
    for k, op in ops.items():
        assert inspect.signature(getattr(twins, k)).parameters.keys() == inspect.signature(op.numpy).parameters.keys(), k
    with kernels.enabled():
        assert all(ly.FAST[k] is getattr(twins, k) for k in ops)


@pytest.mark.parametrize("name", FAMILIES)
def test_checkpoint_round_trip(name, tmp_path):
    cfg, _ = tiny_config(name, dtype="float32")
    params = models.init_params(name, cfg, 3)
    path = str(tmp_path / "c.npz")
    save_checked(path, params, cfg, {"model": name, "task": "bijection", "step": 7})
    got, got_cfg, meta, opt = load_checkpoint(path)
    assert meta["model"] == name and got_cfg == cfg and opt is None
    assert set(got) == set(params) and all(np.array_equal(got[k], params[k]) for k in params)
    assert models.param_shapes(name, cfg) == {k: v.shape for k, v in params.items()}
    assert models.count_params(params) == sum(v.size for v in params.values())


def held_out_kl(name, cfg, params, batch):
    """Mean KL(posterior || model) over the answer rows of a held-out batch, in bits."""
    q = models.predict_proba(name, params, batch["tokens"], cfg)
    mask = batch["mask"] > 0
    return float(wt.kl_bits(batch["posterior"][mask], q[mask]).mean())


@pytest.mark.parametrize("task", sorted(tasks.TASKS))
@pytest.mark.parametrize("name", FAMILIES)
def test_a_short_training_run_lowers_the_held_out_kl(name, task):
    """Soft targets, AdamW through training.train_step and training.train, from a loud initialisation: the
    held-out KL after TRAIN_STEPS steps is at most (1 - MARGIN) x its value at the start."""
    cfg, s = tiny_config(name, task, dtype="float32")
    rng = np.random.default_rng(5)                              # a loud start: the authors' MLP starts at the
    params = {k: (v + 0.5 * rng.standard_normal(v.shape)).astype(v.dtype)   # prior it learns, so from its own
              for k, v in models.init_params(name, cfg, 0).items()}         # init there is nothing to lower
    held = tiny_batch(task, s, n=64, seed=99)
    before = held_out_kl(name, cfg, params, held)
    opt = optim.adamw_init(params)
    decay = models.decay_set(name, params)

    def step(i):
        b = tasks.sample(task, np.random.default_rng((0, i)), 16, s, i)
        loss, norm = training.train_step(lambda p, t, y, m: models.loss_and_grads(name, p, t, y, m, cfg), params, opt,
                                         b["tokens"], b["posterior"], b["mask"], 1e-2, 0.0, decay=decay)
        return dict(loss=loss, grad_norm=norm)
    with kernels.enabled():
        training.train(step, TRAIN_STEPS)
    after = held_out_kl(name, cfg, params, held)
    assert after <= (1 - MARGIN) * before, f"{name} on {task}: held-out KL {before:.4f} -> {after:.4f} bits"


def test_decay_default_is_by_shape_not_by_name():
    """A family without its own rule: matrices (two or more axes) decay, vectors and gains do not, whatever
    their names (w_ih, A_log)."""
    class Bare:                                               # a module without decayed()
        pass
    models.FAMILIES["_bare"] = "_bare_family"
    sys.modules["_bare_family"] = Bare
    try:
        params = {"w_ih": np.zeros((3, 4)), "A_log": np.zeros(16), "conv": np.zeros((2, 3, 4)), "gain": np.ones(4)}
        assert models.decay_set("_bare", params) == {"w_ih", "conv"}
    finally:
        del models.FAMILIES["_bare"], sys.modules["_bare_family"]


# ----------------------------------------------------------------------------
# adding a family is one module and one registry entry

TOY = '''
"""toy: logits = W[token] + b, a bigram model (one position sees its own token only): a family in four functions,
with only the shared fields it needs and nothing else that models.py does not document."""
from dataclasses import dataclass

import numpy as np


@dataclass
class Config:                                                  # the bare minimum: no width, layers or length
    vocab_size: int
    n_classes: int
    dtype: str = "float32"


def init_params(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {"W": (0.1 * rng.standard_normal((cfg.vocab_size, cfg.n_classes))).astype(cfg.dtype),
            "b": np.zeros(cfg.n_classes, cfg.dtype)}


def forward(params, tokens, cfg):
    return params["W"][tokens] + params["b"], tokens          # logits (B, T, K), cache: the tokens


def backward(dlogits, cache, params, cfg):
    dW = np.zeros_like(params["W"])
    np.add.at(dW, cache, dlogits)                              # forward: logits = W[tokens] + b
    return {"W": dW, "b": dlogits.sum((0, 1))}
'''


def register_toy(tmp_path, monkeypatch):
    """The toy family as a module of its own, families.toy_family (written to tmp_path and loaded from there, as
    if it sat in families/), and its one line in models.FAMILIES; both undone when the test ends."""
    path = tmp_path / "toy_family.py"
    path.write_text(textwrap.dedent(TOY))
    spec = importlib.util.spec_from_file_location("families.toy_family", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "families.toy_family", module)
    monkeypatch.setitem(models.FAMILIES, "toy", "families.toy_family")


def test_a_new_family_is_one_module_and_one_entry(tmp_path, monkeypatch, capsys):
    import train
    register_toy(tmp_path, monkeypatch)
    out = str(tmp_path / "run")
    common = ["--model", "toy", "--preset", "quick", "--steps", "6", "--eval-seqs", "8", "--quiet", "--out", out]
    train.main([*common, "--no-baseline", "--stop-after", "3"])
    capsys.readouterr()
    train.main([*common, "--no-baseline", "--resume"])                # the probes it lacks: one line, no traceback
    skipped = [line for line in capsys.readouterr().out.splitlines() if line.startswith("geometry")]
    assert skipped == ["geometry: skipped: the probes read the streams cache['resid'] and cache['xf'], which --model "
                       "toy's forward does not keep"]
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["model"] == "toy" and metrics["steps"] == 6
    assert load_checkpoint(os.path.join(out, "checkpoint.npz"))[2]["model"] == "toy"
    got = train.main(["--eval-only", os.path.join(out, "checkpoint.npz"), "--eval-seqs", "8"])
    assert got["model"] == "toy" and got["kl_bits"] == pytest.approx(metrics["kl_bits"])
    with pytest.raises(SystemExit) as e:
        train.main(["--model", "toy", "--heads", "2", "--out", str(tmp_path / "other")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--heads" in err[0] and "toy" in err[0]


def test_a_family_declares_its_own_flags(capsys, monkeypatch):
    """A family's FLAGS join the one flag table: they set its Config's field, are refused in one line for a
    family without that field, and one flag declared for two different fields fails when the table is built."""
    from tunnels import tasks
    import train
    args = train.parse_args(["--model", "ssm", "--d-state", "4", "--expand", "3"])
    cfg = train.model_config(args, tasks.sizes(args.task, args.settings), "ssm")
    assert (cfg.d_state, cfg.expand, cfg.d_conv) == (4, 3, 4)               # the one not typed: the Config's default
    for argv, expected in ((["--model", "transformer", "--d-state", "8"],
                            "--d-state does not apply to --model transformer (its Config has no d_state)"),
                           (["--model", "ssm", "--d-state", "0"], "--d-state 0: must be a positive integer"),
                           (["--model", "lstm", "--residual", "maybe"], "--residual 'maybe': allowed are on, off")):
        with pytest.raises(SystemExit) as e:
            train.parse_args(argv) if "lstm" not in argv else train.model_config(
                train.parse_args(argv), tasks.sizes("bijection", train.parse_args(argv).settings), "lstm")
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and expected in err[0], err
    clash = types.ModuleType("_clash_family")
    clash.FLAGS = {"--d-state": dict(field="width_of_state", type=int, help="x")}
    monkeypatch.setitem(sys.modules, "_clash_family", clash)
    monkeypatch.setitem(models.FAMILIES, "_clash", "_clash_family")
    with pytest.raises(ValueError, match="--d-state: --model _clash declares it for its field 'width_of_state'"):
        train.flag_table()


@pytest.mark.parametrize("name", FAMILIES)
def test_params_sizes_every_family_within_five_percent_at_the_best_allowed_width(name):
    """--params N: every parameter counts; the width is the allowed one whose count is nearest N (its
    allowed neighbours are farther), within 5%; the other sizes stay as given (the transformer: 4 heads, so
    a width of a multiple of 4)."""
    import train
    target = 400000                                              # fine enough for 4 heads at 2 layers
    args = train.parse_args(["--model", name, "--task", "sawtooth", "--preset", "quick", "--params", str(target)]
                            + (["--heads", "4"] if name == "transformer" else []))
    cfg = train.model_config(args, tasks.sizes("sawtooth", args.settings), name)
    count = lambda H: models.count_params(models.param_shapes(name, models.make_config(
        name, **{**dataclasses.asdict(cfg), "d_model": H})))
    step = 4 if name == "transformer" else 1
    H = cfg.d_model
    assert H % step == 0 and abs(count(H) - target) <= 0.05 * target
    assert abs(count(H) - target) <= min(abs(count(H + step) - target), abs(count(H - step) - target))
    if "n_layers" in models.config_fields(name):                     # the depth given, kept (a family that has one)
        assert cfg.n_layers == (args.layers or models.config_fields(name)["n_layers"])


def test_params_refuses_what_it_cannot_size(capsys):
    import train
    for argv, expected in ((["--params", "30000", "--width", "64"],
                            "--params 30000 and --width 64: --params finds the width; give one of them"),
                           (["--params", "10"], "--params 10: no width of transformer matches 10 parameters within 5%")):
        with pytest.raises(SystemExit) as e:
            args = train.parse_args(argv)
            train.model_config(args, tasks.sizes(args.task, args.settings), args.model)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and expected in err[0], err


def test_sizes_belong_to_the_family_not_to_the_task():
    """A task's preset sets the optimisation; the sizes are the family's: the transformer's tuned ones where it
    names them, the LSTM's Config defaults where it names none (not the transformer's width 32 and fan-in)."""
    from families import lstm
    import train
    a = train.parse_args(["--task", "bijection", "--preset", "quick", "--model", "lstm"])
    cfg = train.model_config(a, tasks.sizes("bijection", a.settings), "lstm")
    assert (cfg.d_model, cfg.n_layers) == (lstm.Config.d_model, lstm.Config.n_layers) == (64, 2)
    assert (a.batch, a.steps, a.lr) == (32, 60, 3e-3)                        # the task's, for every family
    t = train.parse_args(["--task", "bijection", "--preset", "quick"])
    assert (t.width, t.layers, t.heads) == (32, 2, 2)
    s = train.parse_args(["--task", "sawtooth", "--preset", "quick", "--model", "lstm"])
    assert s.init is None and train.model_config(s, tasks.sizes("sawtooth", s.settings), "lstm").init == lstm.Config.init
    meta = train.run_meta(s, "lstm", 0, 10)
    assert "init" in meta and "heads" not in meta and meta["model"] == "lstm"
    assert "init" not in train.run_meta(s, "mlp", 0, 10)                    # the MLP's Config has no init


def test_tokens_are_checked_once_for_every_family(tmp_path, monkeypatch):
    """The bare toy family checks nothing itself; models.forward (and so the loss and the predictions) refuses
    a token id out of range or a batch that is not (B, T) for it as for every family."""
    register_toy(tmp_path, monkeypatch)
    cfg = models.make_config("toy", vocab_size=5, n_classes=3)
    params = models.init_params("toy", cfg)
    assert models.forward("toy", params, np.array([[0, 4]]), cfg)[0].shape == (1, 2, 3)
    with pytest.raises(ValueError, match="token ids must lie in 0..4, got 0..5"):
        models.loss_and_grads("toy", params, np.array([[0, 5]]), np.array([[0, 1]]), np.ones((1, 2)), cfg)
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, T\), got \(2,\)"):
        models.predict_proba("toy", params, np.array([0, 1]), cfg)


@pytest.mark.parametrize("name", [n for n in FAMILIES if getattr(models.module(n), "PRESETS", {}) and
                                  all("params" in p for t in models.module(n).PRESETS.values() for p in t.values())])
def test_presets_by_count_match_the_transformer_within_five_percent(name):
    """A family whose presets give a parameter count matches the transformer built by the same task preset
    (within 5%, every parameter counted); a typed --width takes over from the preset's count."""
    import train
    for task, presets in models.module(name).PRESETS.items():
        for preset in presets:
            built = {}
            for family in (name, "transformer"):
                a = train.parse_args(["--task", task, "--preset", preset, "--model", family])
                cfg = train.model_config(a, tasks.sizes(task, a.settings), family)
                built[family] = models.count_params(models.param_shapes(family, cfg))
            assert abs(built[name] - built["transformer"]) <= 0.05 * built["transformer"], (task, preset, built)
    a = train.parse_args(["--task", task, "--preset", preset, "--model", name, "--width", "16"])
    assert a.params is None and train.model_config(a, tasks.sizes(task, a.settings), name).d_model == 16


@pytest.mark.ci_only                                            # a short run and the probes per family: minutes
@pytest.mark.parametrize("name", [n for n in FAMILIES if not getattr(models.module(n), "PROBES", False)])
def test_geometry_runs_the_probes_that_read_no_attention(name, tmp_path, capsys):
    """A family without attention: geometry/run.py runs the state probes (the manifold with its controls, the
    readout, the state clusters, the logit lens where it has the shared head), judges the manifold and the
    state clusters only, and says in one
    line what it skipped; the calibration gate reads the model's own KL against a uniform guess's."""
    from geometry import run as geometry
    import train
    out = tmp_path / "run"
    train.main(["--model", name, "--task", "hmm", "--preset", "quick", "--steps", "2", "--eval-seqs", "8",
                "--no-geometry", "--quiet", "--no-baseline", "--out", str(out)])
    capsys.readouterr()
    g = geometry.main([str(out / "checkpoint.npz"), "--n-seqs", "6"])
    printed = capsys.readouterr().out
    assert list(g["verdicts"]) == ["manifold", "state_clusters"] and g["verdicts"]["manifold"]["outcome"] == "not judged"
    assert g["clusters"]["k"] == 5 and len(g["clusters"]["nmi_init_per_seed"]) == 5    # the HMM's hidden states
    assert 0 < g["calibration"]["kl_bits"] and g["calibration"]["uniform_kl_bits"] > 0
    assert g["manifold"]["residual_final"]["pc1_variance"] > 0 and "attn_out_last" not in g["manifold"]
    assert f"probes run on --model {name}:" in printed and "skipped: the key frame" in printed
    assert [os.path.basename(f) for f in g["figures"]][0] == "geometry_run_value_manifold.png"
