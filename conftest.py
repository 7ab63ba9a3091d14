"""pytest loads this before any test module: pin OpenBLAS to one thread before NumPy is first imported.

Several test modules import NumPy before bayesattn (which sets the same defaults). Without this,
OpenBLAS would start its own worker threads, and they busy-wait after every matrix product, taking
the core that Numba's parallel kernels need. setdefault: a value already in the environment wins.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")
