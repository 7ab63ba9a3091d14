"""The layout: imports point one way, nothing imports the command line, the registries (models.FAMILIES,
tasks.TASKS) load their members and not the other way round, and the one switch between the NumPy path
and the Numba path changes which code runs, not the numbers, and only inside its block."""

import ast
import glob
import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest

import bayesattn as ba
import kernels
import layers
import models
import tasks

HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "*.py")) if not
           os.path.basename(p).startswith(("test_", "conftest"))}


def project_imports(name):
    """The project modules a module imports, at any depth of its code (function-level imports count too)."""
    tree = ast.parse(open(os.path.join(HERE, name + ".py")).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found & MODULES - {name}


def registered(registry):
    """The module names a registry dict holds: name -> module name, or name -> (module name, fixed fields)."""
    return {entry if isinstance(entry, str) else entry[0] for entry in registry.values()}


FAMILY_MODULES = registered(models.FAMILIES)        # bayesattn, mlp_baseline, lstm, mamba
TWIN_MODULES = {models.module(name).TWINS for name in models.FAMILIES if hasattr(models.module(name), "TWINS")}
TASK_MODULES = registered(tasks.TASKS) | {"sticky"}   # the token wind tunnels, and Paper II's chain


def import_graph():
    """module -> the project modules it imports; a registry also "imports" every module it loads by name
    (importlib), so a member that imported its registry would show up as a cycle."""
    graph = {m: project_imports(m) for m in MODULES}
    graph["models"] |= FAMILY_MODULES | TWIN_MODULES      # models.family() loads a family's twins with it
    graph["tasks"] |= registered(tasks.TASKS)
    return graph


def find_cycle(graph):
    """A list [a, b, ..., a] of modules each importing the next, or None if the imports have no cycle
    (depth-first search; a module still open when it is reached again closes a cycle)."""
    state = {}

    def visit(m, path):
        if state.get(m) == "done":
            return None
        if state.get(m) == "open":
            return path[path.index(m):] + [m]
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            cycle = visit(d, path + [m])
            if cycle:
                return cycle
        state[m] = "done"
        return None
    for m in sorted(graph):
        cycle = visit(m, [])
        if cycle:
            return cycle
    return None


def test_find_cycle_finds_cycles():
    """The check itself: a planted cycle is found, a one-way graph passes."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None          # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a"}, "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    graph = import_graph()
    graph["layers"] = graph["layers"] | {"models"}                                # models -> layers -> models
    assert find_cycle(graph) is not None
    graph = import_graph()
    graph["bayesattn"] = graph["bayesattn"] | {"models"}                          # through the registry
    assert find_cycle(graph) is not None


def test_imports_point_one_way():
    graph = import_graph()
    assert {"models", "tasks", "runs", "layers", "kernels", "windtunnels"} <= MODULES
    assert FAMILY_MODULES | TASK_MODULES <= MODULES, (FAMILY_MODULES | TASK_MODULES) - MODULES  # registered = files
    importers = {m: d for m, d in graph.items() if "train" in d}
    assert not importers, f"nothing imports the command line train.py: {importers}"
    above = {m for m, d in graph.items() if "matrix" in d}      # matrix.py runs train.py per cell, above it:
    assert above <= {"depth", "chainsteps"}, above               # only the experiments run through it import it
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_each_layer_imports_only_what_lies_below_it():
    graph = {m: project_imports(m) for m in MODULES}            # the static imports alone
    assert graph["layers"] == set() and graph["kernels"] == {"layers"}    # the leaves of the model code
    for family in FAMILY_MODULES:        # a family is its math on layers.py: no twins, no registry, no data
        assert graph[family] <= {"layers"}, f"{family} imports {graph[family] - {'layers'}}"
    assert {"lstm_twins", "mamba_twins"} <= TWIN_MODULES <= MODULES, TWIN_MODULES
    for twins in TWIN_MODULES:           # a family's twins: the Numba machinery of kernels.py, nothing above it
        assert graph[twins] <= {"kernels", "layers"}, f"{twins} imports {graph[twins]}"
    assert graph["models"] <= {"layers"}, graph["models"]   # the families come in by name, not by import
    assert graph["tasks"] == set(), graph["tasks"]           # the tasks likewise
    assert graph["windtunnels"] == set(), graph["windtunnels"]   # the shared math of every wind tunnel
    model_code = FAMILY_MODULES | {"layers", "kernels", "models", "checkpoints", "training", "optim"}
    for task in TASK_MODULES:            # a wind tunnel knows its math, never a model or the registry
        assert graph[task] <= {"windtunnels"} | TASK_MODULES, f"{task} imports {graph[task] - TASK_MODULES}"
        assert not graph[task] & model_code
    assert not graph["checkpoints"] & FAMILY_MODULES, "checkpoints reads the family from models.FAMILIES"
    assert graph["runs"] == set(), graph["runs"]             # run-directory files and a lock, nothing else


# ----------------------------------------------------------------------------
# the switch: `with kernels.enabled():` runs the twins inside the block, and only there

def spy_on_twins(monkeypatch, called):
    """Replace every twin in kernels.py with a wrapper that records its name in `called`, then runs it
    (kernels.enabled() reads the twins when it is entered, so it hands out the wrappers)."""
    for name in kernels.TWINS:
        monkeypatch.setattr(kernels, name, (lambda f, n: lambda *a: called.append(n) or f(*a))(getattr(kernels, name), name))


def test_the_switch_chooses_the_code_that_runs(monkeypatch):
    """With the fast path off, no twin runs; with it on, every op of a training step runs its twin."""
    cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=1, n_heads=2, dtype="float64")
    params = ba.init_params(cfg, 0)
    rng = np.random.default_rng(0)
    tokens, targets, mask = rng.integers(0, 7, (2, 6)), rng.integers(0, 5, (2, 6)), np.ones((2, 6))
    called = []
    spy_on_twins(monkeypatch, called)
    with layers.use_twins({}):
        loss_numpy, grads_numpy = models.loss_and_grads("transformer", params, tokens, targets, mask, cfg)
    assert called == []
    with kernels.enabled():
        loss_fast, grads_fast = models.loss_and_grads("transformer", params, tokens, targets, mask, cfg)
    assert set(called) == set(kernels.TWINS) - {"softmax"}  # the model fuses its softmax into attention
    assert loss_fast == pytest.approx(loss_numpy, rel=1e-12)
    for name in params:
        np.testing.assert_allclose(grads_fast[name], grads_numpy[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_the_switch_does_not_leak(monkeypatch):
    """After `with kernels.enabled():` ends, normally or by an exception, layers.FAST is what it was before
    and every op runs its NumPy code again; blocks nest, each restoring what the one around it had."""
    before = dict(layers.FAST)
    called = []
    spy_on_twins(monkeypatch, called)
    x = np.array([[0.0, np.log(3.0)]])                          # softmax: (1/4, 3/4)

    def ops_run_numpy():
        """Each op's dispatch lands on its NumPy function, and calling one runs no twin."""
        for name in kernels.TWINS:
            op = getattr(layers, name, None) or getattr(ba, name)
            assert layers.FAST.get(name, op.numpy) is op.numpy, name
        del called[:]
        np.testing.assert_allclose(layers.softmax(x), [[0.25, 0.75]])
        assert called == []

    with kernels.enabled():
        assert set(layers.FAST) == set(kernels.twins())      # kernels.py's and the loaded families' twins
        assert all(layers.FAST[name] is getattr(kernels, name) for name in kernels.TWINS)
        np.testing.assert_allclose(layers.softmax(x), [[0.25, 0.75]])
        assert called == ["softmax"]
        with layers.use_twins({}):                              # the NumPy path inside the fast one
            assert layers.FAST == {}
            ops_run_numpy()
        assert all(layers.FAST[name] is getattr(kernels, name) for name in kernels.TWINS)
    assert layers.FAST == before
    if not before:
        ops_run_numpy()

    with pytest.raises(RuntimeError, match="inside the block"):
        with kernels.enabled():
            assert set(layers.FAST) == set(kernels.twins())
            raise RuntimeError("inside the block")
    assert layers.FAST == before
    if not before:
        ops_run_numpy()

    marker = lambda s: layers.softmax.numpy(s)                  # a switch that was on before is on after
    with layers.use_twins({"softmax": marker}):
        with pytest.raises(KeyError):
            with kernels.enabled():
                raise KeyError("again")
        assert layers.FAST == {"softmax": marker} and layers.FAST["softmax"] is marker
    assert layers.FAST == before


def test_train_main_leaves_the_switch_and_threads_as_it_found_them(tmp_path):
    """train.main in-process (the fast path by default) restores layers.FAST and Numba's thread count,
    after a run and after a run that fails inside the switch (an --out that cannot be made)."""
    import train
    before = dict(layers.FAST)
    marker = lambda s: layers.softmax.numpy(s)                  # a state train.main cannot have made itself
    threads = numba.get_num_threads()
    quick = ["--preset", "quick", "--steps", "2", "--no-baseline", "--no-geometry", "--quiet", "--eval-seqs", "8",
             "--threads", "1"]
    with layers.use_twins({"softmax": marker}):
        train.main(quick + ["--out", str(tmp_path / "r")])
        assert layers.FAST == {"softmax": marker} and layers.FAST["softmax"] is marker
        assert numba.get_num_threads() == threads
        (tmp_path / "a-file").write_text("")
        with pytest.raises(SystemExit) as e:                    # fails after the switch is on
            train.main(quick + ["--out", str(tmp_path / "a-file" / "r")])
        assert e.value.code == 2
        assert layers.FAST == {"softmax": marker} and layers.FAST["softmax"] is marker
        assert numba.get_num_threads() == threads
    assert (tmp_path / "r" / "metrics.json").exists()
    assert layers.FAST == before


def test_train_py_on_the_numpy_path_gives_the_numbers_of_the_fast_path(tmp_path):
    metrics = {}
    for path in ("numpy", "numba"):
        out = tmp_path / path
        proc = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--preset", "quick", "--quiet",
                               "--no-baseline", "--no-geometry", "--steps", "6", "--eval-seqs", "50", "--threads", "1",
                               "--kernels", path, "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr
        metrics[path] = json.loads((out / "metrics.json").read_text())
        assert (out / f"{path}_traces.png").exists()            # a run's figures stay in its directory
    for key in ("entropy_mae_bits", "kl_bits"):                 # float32 sums in another order: close, not equal
        assert metrics["numpy"][key] == pytest.approx(metrics["numba"][key], rel=1e-3), key
