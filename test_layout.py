"""The layout: imports point one way, nothing imports the command line, and the one switch between
the NumPy path and the Numba path changes which code runs, not the numbers."""

import ast
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import bayesattn as ba
import kernels
import layers

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


def test_imports_point_one_way():
    graph = {m: project_imports(m) for m in MODULES}
    assert not any("train" in deps for deps in graph.values()), {m: d for m, d in graph.items() if "train" in d}
    state = {}                                              # depth-first search for a cycle

    def visit(m, path):
        if state.get(m) == "done":
            return
        assert state.get(m) != "open", f"import cycle: {' -> '.join(path + [m])}"
        state[m] = "open"
        for d in sorted(graph[m]):
            visit(d, path + [m])
        state[m] = "done"
    for m in sorted(graph):
        visit(m, [])
    assert graph["kernels"] == {"layers"} and graph["layers"] == set()      # the leaves of the model code
    assert "kernels" not in graph["bayesattn"] and "kernels" not in graph["mlp_baseline"]


def test_the_switch_chooses_the_code_that_runs(monkeypatch):
    """With the fast path off, no twin runs; with it on, every op of a training step runs its twin."""
    cfg = ba.Config(vocab_size=7, n_classes=5, max_len=6, d_model=8, n_layers=1, n_heads=2, dtype="float64")
    params = ba.init_params(cfg, 0)
    rng = np.random.default_rng(0)
    tokens, targets, mask = rng.integers(0, 7, (2, 6)), rng.integers(0, 5, (2, 6)), np.ones((2, 6))
    called = []
    monkeypatch.setattr(layers, "FAST", {})
    for name in kernels.TWINS:                              # count the twins' calls
        monkeypatch.setattr(kernels, name, (lambda f, n: lambda *a: called.append(n) or f(*a))(getattr(kernels, name), name))
    loss_numpy, grads_numpy = ba.loss_and_grads(params, tokens, targets, mask, cfg)
    assert called == []
    kernels.enable()
    loss_fast, grads_fast = ba.loss_and_grads(params, tokens, targets, mask, cfg)
    assert set(called) == set(kernels.TWINS) - {"softmax"}  # the model fuses its softmax into attention
    assert loss_fast == pytest.approx(loss_numpy, rel=1e-12)
    for name in params:
        np.testing.assert_allclose(grads_fast[name], grads_numpy[name], rtol=1e-9, atol=1e-12, err_msg=name)
    kernels.disable()
    assert layers.FAST == {}


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
