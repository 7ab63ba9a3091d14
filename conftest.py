"""pytest loads this before any test module: pin OpenBLAS to one thread before NumPy is first imported.

Several test modules import NumPy before bayesattn (which sets the same defaults). Without this,
OpenBLAS would start its own worker threads, and they busy-wait after every matrix product, taking
the core that Numba's parallel kernels need. setdefault: a value already in the environment wins.
"""

import os

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "ci_only: a slower test that .ci/run runs (BAYESATTN_CI_ONLY=1 python -m "
                                       "pytest -q -m ci_only); the README's test command skips it")
    config.addinivalue_line("markers", "plain_python: a kernel or gradient check that .ci/run runs again with "
                                       "NUMBA_DISABLE_JIT=1 (a module marks itself: pytestmark)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("BAYESATTN_CI_ONLY") == "1":
        return
    skip = pytest.mark.skip(reason="slower: .ci/run runs it (BAYESATTN_CI_ONLY=1)")
    for item in items:
        if "ci_only" in item.keywords:
            item.add_marker(skip)


ROOT = os.path.dirname(os.path.abspath(__file__))      # the repository's folder
COPIED = ("figures", "docs", "README.md", "RESULTS.md")   # what a command may write into or a test may edit


def _checkout(path):
    """A scratch checkout of the repository at path, as a user's clone looks: every code file and folder linked
    to the repository's own (one copy of each module, and the Numba cache the repository already has), the
    figures and documents copied (a command may redraw a figure), nothing else (no runs/)."""
    import shutil
    os.makedirs(path, exist_ok=True)
    for name in sorted(os.listdir(ROOT)):
        if name.startswith(".") or name in ("runs", "__pycache__"):
            continue
        src, dst = os.path.join(ROOT, name), os.path.join(path, name)
        if name in COPIED:
            (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
        else:
            os.symlink(src, dst)
    return path



@pytest.fixture
def checkout(tmp_path):
    """The folder of a scratch checkout (conftest._checkout): documented commands run there as written, from
    the repository's folder as a user runs them, and what they write stays in tmp_path."""
    return _checkout(str(tmp_path / "repo"))



DRAWN = set()          # the figure functions (plot_*) that some test of this session drew in its own process


def figure_modules():
    from dynamics import plots_dynamics
    from geometry import plots_geometry
    from harness import plots
    return plots, plots_geometry, plots_dynamics


def figure_functions():
    """The name of every function that draws a figure: plot_* of the three figure modules."""
    import inspect
    return {name for module in figure_modules() for name, f in inspect.getmembers(module, inspect.isfunction)
            if name.startswith("plot_") and f.__module__ == module.__name__}


@pytest.fixture
def figure_function_names():
    """figure_functions(), for a test."""
    return figure_functions()


@pytest.fixture(autouse=True)
def figures_keep_their_rules(monkeypatch):
    """Every figure a test draws in its own process keeps plots.figure_problems' rules (a ValueError if not),
    and the figure function that drew it is recorded (DRAWN: pytest_sessionfinish reads it)."""
    import inspect
    modules = figure_modules()
    monkeypatch.setattr(modules[0], "STRICT", True)
    save = modules[0]._save

    def recorded(fig, path, dpi=120):
        DRAWN.update(f.function for f in inspect.stack()[1:4] if f.function.startswith("plot_"))
        return save(fig, path, dpi)
    for module in modules:
        if module._save is save:                   # a test's own stand-in for _save stays as it is
            monkeypatch.setattr(module, "_save", recorded)


def full_run(config):
    """Is this session the README's command, python -m pytest -q from the repository's folder, selecting
    nothing (so every test is collected)?"""
    args, opt = tuple(config.invocation_params.args), config.option
    return not (args not in ((), ("-q",)) or os.environ.get("BAYESATTN_CI_ONLY") == "1" or opt.keyword
                or opt.markexpr or getattr(opt, "deselect", None) or os.environ.get("PYTEST_ADDOPTS")
                or os.path.realpath(config.invocation_params.dir) != os.path.realpath(ROOT))


@pytest.fixture
def readme_command(request):
    """True when this session is the README's whole test command (full_run)."""
    return full_run(request.config)


def pytest_sessionfinish(session, exitstatus):
    """After the README's whole command: every figure function was drawn by some test in this process, so under
    the figure rules; one that none drew fails the session, named (tests/test_figures.py indexes who draws each)."""
    if exitstatus != 0 or not full_run(session.config):
        return
    missing = sorted(figure_functions() - DRAWN)
    if missing:
        session.config.get_terminal_writer().line(
            f"figure functions no test drew in this process, so never checked by the figure rules: {missing}", red=True)
        session.exitstatus = 1
