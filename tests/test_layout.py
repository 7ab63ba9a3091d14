"""The house: the root is the card and the reading path, each wing a folder named by its subject, imports
folder-qualified and pointing one way in the order the README states, nothing imports the command line, the
registries (models.FAMILIES, tunnels/tasks.TASKS) load their members and not the other way round, no module is
reached under two names, and the one switch between the NumPy path and the Numba path changes which code runs,
not the numbers, and only inside its block."""

import ast
import glob
import json
import os
import re
import subprocess
import sys

import numba
import numpy as np
import pytest

import bayesattn as ba
import kernels
import layers
import models
import optim
import training
from tunnels import tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository's folder
READING_PATH = {"bayesattn", "layers", "kernels", "models", "optim", "training", "evaluation"}
CARD = {"train", "manifold"}                 # the card's other modules at the root (and test_bayesattn.py)
WINGS = ("tunnels", "families", "harness", "geometry", "dynamics", "primitives", "bench")


def module_files(root=ROOT):
    """{dotted module name: path} of the project's code: the root's modules and each wing's, not the tests."""
    found = {}
    for path in glob.glob(os.path.join(root, "*.py")) + glob.glob(os.path.join(root, "*", "*.py")):
        rel = os.path.relpath(path, root)
        if rel.startswith(("tests" + os.sep, ".")) or os.path.basename(rel).startswith(("test_", "conftest")):
            continue
        found[rel[:-3].replace(os.sep, ".")] = path
    return found


FILES = module_files()
MODULES = set(FILES)


def imported_names(path):
    """Every module name a file's import statements name, at any depth of its code (function-level imports
    too): `import a.b` -> a.b; `from a import b` -> a.b where that is a module, else a; `from a.b import x` -> a.b."""
    tree = ast.parse(open(path).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            subs = {f"{node.module}.{a.name}" for a in node.names} & MODULES
            found |= subs or {node.module}
    return found


def project_imports(name):
    """The project modules a module imports."""
    return imported_names(FILES[name]) & MODULES - {name}


def registered(registry):
    """The module names a registry dict holds: name -> module name, or name -> (module name, fixed fields)."""
    return {entry if isinstance(entry, str) else entry[0] for entry in registry.values()}


FAMILY_MODULES = registered(models.FAMILIES)        # bayesattn, families.mlp_baseline, families.lstm, families.mamba
TWIN_MODULES = {models.module(name).TWINS for name in models.FAMILIES if hasattr(models.module(name), "TWINS")}
TASK_MODULES = registered(tasks.TASKS) | {"tunnels.sticky"}   # the token wind tunnels, and Paper II's chain


def import_graph():
    """module -> the project modules it imports; a registry also "imports" every module it loads by name
    (importlib), so a member that imported its registry would show up as a cycle."""
    graph = {m: project_imports(m) for m in MODULES}
    graph["models"] |= FAMILY_MODULES | TWIN_MODULES      # models.family() loads a family's twins with it
    graph["tunnels.tasks"] |= registered(tasks.TASKS)
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
    assert {"models", "tunnels.tasks", "harness.runs", "layers", "kernels", "tunnels.windtunnels"} <= MODULES
    assert FAMILY_MODULES | TASK_MODULES <= MODULES, (FAMILY_MODULES | TASK_MODULES) - MODULES  # registered = files
    importers = {m: d for m, d in graph.items() if "train" in d}
    assert not importers, f"nothing imports the command line train.py: {importers}"
    above = {m for m, d in graph.items() if "primitives.matrix" in d}   # matrix runs train.py per cell, above it:
    assert above <= {"primitives.depth", "primitives.depth_sweep", "primitives.chainsteps"}, above   # the experiments
                                                                 # run through it, only
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_each_layer_imports_only_what_lies_below_it():
    graph = {m: project_imports(m) for m in MODULES}            # the static imports alone
    assert graph["layers"] == set() and graph["kernels"] == {"layers"}    # the leaves of the model code
    for family in FAMILY_MODULES:        # a family is its math on layers.py: no twins, no registry, no data
        assert graph[family] <= {"layers"}, f"{family} imports {graph[family] - {'layers'}}"
    assert {"families.lstm_twins", "families.mamba_twins"} <= TWIN_MODULES <= MODULES, TWIN_MODULES
    for twins in TWIN_MODULES:           # a family's twins: the Numba machinery of kernels.py, nothing above it
        assert graph[twins] <= {"kernels", "layers"}, f"{twins} imports {graph[twins]}"
    assert graph["models"] <= {"layers"}, graph["models"]   # the families come in by name, not by import
    assert graph["tunnels.tasks"] == set(), graph["tunnels.tasks"]           # the tasks likewise
    assert graph["tunnels.windtunnels"] == set(), graph["tunnels.windtunnels"]   # the shared math of every tunnel
    model_code = FAMILY_MODULES | {"layers", "kernels", "models", "harness.checkpoints", "training", "optim"}
    for task in TASK_MODULES:            # a wind tunnel knows its math, never a model or the registry
        assert graph[task] <= {"tunnels.windtunnels"} | TASK_MODULES, f"{task} imports {graph[task] - TASK_MODULES}"
        assert not graph[task] & model_code
    assert not graph["harness.checkpoints"] & FAMILY_MODULES, "checkpoints reads the family from models.FAMILIES"
    assert graph["harness.runs"] == set(), graph["harness.runs"]   # run-directory files and a lock, nothing else


# ----------------------------------------------------------------------------
# the house: the root, the wings, their order, one name per module

def readme_order():
    """The order of the house as the README states it: its line '**The order of the house**: a → b → ...',
    each name a wing's folder or `root`."""
    text = open(os.path.join(ROOT, "README.md")).read()
    line = re.search(r"\*\*The order of the house\*\*:(.*)", text)
    assert line, "the README states the order of the wings in a line '**The order of the house**: ...'"
    return [re.sub(r"[`/ ]|\(.*?\)", "", part) for part in line.group(1).split("→")]


def level(module, order):
    """Where a module sits in the order: its wing's index; at the root, `root`'s, except the card's geometry
    probes (manifold.py, with geometry) and train.py (above every wing: nothing imports it)."""
    wing = module.split(".")[0] if "." in module else {"manifold": "geometry"}.get(module, "root")
    if module == "train":
        return len(order)
    return order.index(wing)


def upward(graph, order):
    """The static imports that point from a module to one later in the order: [(module, imported)]."""
    return sorted((m, d) for m, deps in graph.items() for d in deps if level(d, order) > level(m, order))


def test_the_root_is_the_card_and_the_reading_path():
    root = {m for m in MODULES if "." not in m}
    assert root == READING_PATH | CARD, root ^ (READING_PATH | CARD)
    assert len(root) <= 10, sorted(root)
    names = set(os.listdir(ROOT))
    assert {"README.md", "requirements.txt", "test_bayesattn.py", "figures", "conftest.py"} <= names
    assert not glob.glob(os.path.join(ROOT, "test_*.py")) or \
        [os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "test_*.py"))] == ["test_bayesattn.py"]
    assert {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "*.md"))} <= {"README.md", "RESULTS.md"}


def test_each_wing_is_a_plain_folder_with_its_readme():
    """A wing: a folder named by its subject, its README, no __init__ (a plain namespace), a name that shadows
    no standard-library module and no root module, and is not the runs/ folder that runs write (results/ keeps
    what the long runs wrote, beside the documents that read it)."""
    folders = {d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith((".", "_"))}
    assert set(WINGS) <= folders and folders - set(WINGS) <= {"tests", "docs", "figures", "runs", "results"}, folders
    for wing in WINGS:
        assert os.path.exists(os.path.join(ROOT, wing, "README.md")), wing
        assert not os.path.exists(os.path.join(ROOT, wing, "__init__.py")), f"{wing}/__init__.py: a plain folder"
        assert wing not in sys.stdlib_module_names and wing != "runs", wing
        assert not os.path.exists(os.path.join(ROOT, wing + ".py")), f"{wing}.py beside {wing}/"
    for m in MODULES:                   # and no module takes the name of a folder at the root
        assert m.split(".")[-1] not in WINGS or "." not in m, m


def test_imports_follow_the_order_the_readme_states():
    order = readme_order()
    assert sorted(order) == sorted(["root", *WINGS]), order
    graph = {m: project_imports(m) for m in MODULES}
    assert upward(graph, order) == [], upward(graph, order)
    # the check can fail: a family importing the geometry probes, a tunnel importing the model
    assert upward({"families.lstm": {"geometry.measures"}}, order) == [("families.lstm", "geometry.measures")]
    assert upward({"tunnels.hmm": {"layers"}}, order) == [("tunnels.hmm", "layers")]
    assert upward({"bench.transformer": {"train"}}, order) == [("bench.transformer", "train")]


def test_every_import_names_a_module_by_its_one_name():
    """Imports are folder-qualified: no file (code or test) imports a wing's module by its bare name, so no module
    is loaded twice under two names (two copies of the kernel switch's registry); and no file changes the
    import path (none of the three ways below, anywhere)."""
    bare = {m.split(".")[-1]: m for m in MODULES if "." in m}
    files = [*FILES.values(), *glob.glob(os.path.join(ROOT, "tests", "*.py")), os.path.join(ROOT, "test_bayesattn.py"),
             os.path.join(ROOT, "conftest.py"), *glob.glob(os.path.join(ROOT, ".ci", "*"))]
    forbidden = ["sys." + "path", "PYTHON" + "PATH", "syspath" + "_prepend"]
    for path in files:
        if path.endswith(".py"):
            wrong = sorted(n for n in imported_names(path) if n in bare)
            assert not wrong, f"{os.path.relpath(path, ROOT)} imports {wrong[0]!r}: write {bare[wrong[0]]!r}"
        text = open(path).read()
        for word in forbidden:
            assert word not in text, f"{os.path.relpath(path, ROOT)} names {word}"
    for entry in [*registered(models.FAMILIES), *TWIN_MODULES, *registered(tasks.TASKS)]:
        assert entry in MODULES, f"a registry names {entry!r}, not a module's one name"


def test_one_copy_of_every_module_and_the_fast_path_runs_every_familys_twins(monkeypatch):
    """After every family is loaded, sys.modules holds each project module under its one name only, and inside
    kernels.enabled() each family's own @twin ops run their Numba twins (a second copy of a twins module would
    register into another table, and the fast path would silently run NumPy)."""
    for name in models.FAMILIES:
        models.family(name)
    bare = {m.split(".")[-1] for m in MODULES if "." in m}
    assert not bare & set(sys.modules), sorted(bare & set(sys.modules))
    for name in models.FAMILIES:
        mod = models.module(name)
        if not hasattr(mod, "TWINS"):
            continue
        twins = sys.modules[mod.TWINS]
        with kernels.enabled():
            for op in twins.TWINS:
                assert layers.FAST[op] is getattr(twins, op), (name, op)


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
    assert set(called) == set(kernels.TWINS) - {"adamw_update"}              # AdamW is the training step's
    del called[:]
    with kernels.enabled():
        training.train_step(lambda *a: models.loss_and_grads("transformer", *a, cfg), params, optim.adamw_init(params),
                            tokens, targets, mask, 1e-3)
    assert set(called) == set(kernels.TWINS)
    assert loss_fast == pytest.approx(loss_numpy, rel=1e-12)
    for name in params:
        np.testing.assert_allclose(grads_fast[name], grads_numpy[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_the_switch_does_not_leak(monkeypatch):
    """After `with kernels.enabled():` ends, normally or by an exception, layers.FAST is what it was before
    and every op runs its NumPy code again; blocks nest, each restoring what the one around it had."""
    before = dict(layers.FAST)
    called = []
    spy_on_twins(monkeypatch, called)
    x = np.array([[0.0, 1.0, -2.0]])
    gelu = layers.gelu_forward.numpy(x)[0]                      # 0, 0.841..., -0.045...

    def ops_run_numpy():
        """Each op's dispatch lands on its NumPy function, and calling one runs no twin."""
        for name in kernels.TWINS:
            op = getattr(layers, name, None) or getattr(ba, name, None) or getattr(optim, name)
            assert layers.FAST.get(name, op.numpy) is op.numpy, name
        del called[:]
        np.testing.assert_allclose(layers.gelu_forward(x)[0], gelu)
        assert called == []

    with kernels.enabled():
        assert set(layers.FAST) == set(kernels.twins())      # kernels.py's and the loaded families' twins
        assert all(layers.FAST[name] is getattr(kernels, name) for name in kernels.TWINS)
        np.testing.assert_allclose(layers.gelu_forward(x)[0], gelu, rtol=1e-12)
        assert called == ["gelu_forward"]
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

    marker = lambda x: layers.gelu_forward.numpy(x)                  # a switch that was on before is on after
    with layers.use_twins({"gelu_forward": marker}):
        with pytest.raises(KeyError):
            with kernels.enabled():
                raise KeyError("again")
        assert layers.FAST == {"gelu_forward": marker} and layers.FAST["gelu_forward"] is marker
    assert layers.FAST == before


def test_train_main_leaves_the_switch_and_threads_as_it_found_them(tmp_path):
    """train.main in-process (the fast path by default) restores layers.FAST and Numba's thread count,
    after a run and after a run that fails inside the switch (an --out that cannot be made)."""
    import train
    before = dict(layers.FAST)
    marker = lambda x: layers.gelu_forward.numpy(x)                  # a state train.main cannot have made itself
    threads = numba.get_num_threads()
    quick = ["--preset", "quick", "--steps", "2", "--no-baseline", "--no-geometry", "--quiet", "--eval-seqs", "8",
             "--threads", "1"]
    with layers.use_twins({"gelu_forward": marker}):
        train.main(quick + ["--out", str(tmp_path / "r")])
        assert layers.FAST == {"gelu_forward": marker} and layers.FAST["gelu_forward"] is marker
        assert numba.get_num_threads() == threads
        (tmp_path / "a-file").write_text("")
        with pytest.raises(SystemExit) as e:                    # fails after the switch is on
            train.main(quick + ["--out", str(tmp_path / "a-file" / "r")])
        assert e.value.code == 2
        assert layers.FAST == {"gelu_forward": marker} and layers.FAST["gelu_forward"] is marker
        assert numba.get_num_threads() == threads
    assert (tmp_path / "r" / "metrics.json").exists()
    assert layers.FAST == before


@pytest.mark.ci_only                     # two train.py runs, one on the NumPy path
def test_train_py_on_the_numpy_path_gives_the_numbers_of_the_fast_path(tmp_path):
    metrics = {}
    for path in ("numpy", "numba"):
        out = tmp_path / path
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--preset", "quick", "--quiet",
                               "--no-baseline", "--no-geometry", "--steps", "6", "--eval-seqs", "50", "--threads", "1",
                               "--kernels", path, "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, proc.stderr
        metrics[path] = json.loads((out / "metrics.json").read_text())
        assert (out / f"{path}_traces.png").exists()            # a run's figures stay in its directory
    for key in ("entropy_mae_bits", "kl_bits"):                 # float32 sums in another order: close, not equal
        assert metrics["numpy"][key] == pytest.approx(metrics["numba"][key], rel=1e-3), key


# ----------------------------------------------------------------------------
# what a user has from before the house moved into its wings

BEFORE_THE_MOVE = os.path.join(ROOT, "tests", "data", "before-the-move")   # written by 2594f32, the last flat commit


def test_runs_written_before_the_move_still_load(tmp_path, capsys):
    """A finished run is evaluated again, and a stopped run (an LSTM: a family whose module and twins moved)
    continues to its end, from run directories the flat layout wrote (checkpoints name the family and the task
    as a user types them, never a module)."""
    import shutil
    import train
    runs_dir = tmp_path / "runs"
    shutil.copytree(BEFORE_THE_MOVE, runs_dir)
    finished = runs_dir / "bijection-transformer"
    m = train.main(["--eval-only", str(finished / "checkpoint.npz"), "--figures", str(tmp_path / "figures")])
    written = json.loads((finished / "metrics.json").read_text())
    assert m["kl_bits"] == pytest.approx(written["kl_bits"], rel=1e-6)       # the same held-out set, the same model
    stopped = runs_dir / "sawtooth-lstm-stopped"
    train.main(["--task", "sawtooth", "--model", "lstm", "--preset", "quick", "--width", "8", "--layers", "1",
                "--steps", "4", "--no-baseline", "--no-geometry", "--eval-seqs", "8", "--quiet", "--resume",
                "--out", str(stopped)])
    assert json.loads((stopped / "metrics.json").read_text())["steps"] == 4
    assert "resume" not in capsys.readouterr().err


WING_COMMANDS = ("primitives.matrix", "primitives.depth", "primitives.depth_sweep", "primitives.chainsteps",
                 "geometry.run", "dynamics.run", "bench.transformer", "bench.recurrent", "harness.compare")


@pytest.mark.parametrize("command", WING_COMMANDS)
def test_a_wing_command_run_as_a_file_says_how_to_run_it(command):
    """`python primitives/matrix.py` (a file, not a module) cannot resolve folder-qualified imports: one line
    that names the command's form, no traceback."""
    path = command.replace(".", os.sep) + ".py"
    proc = subprocess.run([sys.executable, path], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"{path}: run it as python -m {command}, from the repository's folder"


def test_a_task_setting_is_set_by_one_flag():
    """Two tasks may share a flag (one setting, each task its own check), never two flags one setting: that
    would mark both flags typed (a --K for the HMM read as transport's --obs, found by CI)."""
    from harness import flags
    by_setting = {}
    for flag, row in flags.flag_table().items():
        if row.get("setting"):
            by_setting.setdefault(row["dest"], []).append(flag)
    shared = {d: f for d, f in by_setting.items() if len(f) > 1}
    assert not shared, shared
    assert "hops" in flags.flag_table()["--queries"]["help"] and "recall" in flags.flag_table()["--queries"]["help"]
