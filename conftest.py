"""pytest loads this before any test module: pin OpenBLAS to one thread before NumPy is first imported.

Several test modules import NumPy before bayesattn (which sets the same defaults). Without this,
OpenBLAS would start its own worker threads, and they busy-wait after every matrix product, taking
the core that Numba's parallel kernels need. setdefault: a value already in the environment wins.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def pytest_configure(config):
    config.addinivalue_line("markers", "ci_only: a slower test that .ci/run runs (BAYESATTN_CI_ONLY=1 python -m "
                                       "pytest -q -m ci_only); the README's test command skips it")
    config.addinivalue_line("markers", "plain_python: a kernel or gradient check that .ci/run runs again with "
                                       "NUMBA_DISABLE_JIT=1 (a module marks itself: pytestmark)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("BAYESATTN_CI_ONLY") == "1":
        return
    import pytest
    skip = pytest.mark.skip(reason="slower: .ci/run runs it (BAYESATTN_CI_ONLY=1)")
    for item in items:
        if "ci_only" in item.keywords:
            item.add_marker(skip)
