"""checkpoints: what a run writes to disk, written atomically (a temporary file, then a rename).

A checkpoint is one .npz: the model's config and a JSON "meta" dict (model, task, step, ...) as strings,
the parameters as "param:<name>", optionally the AdamW state as "adam_t", "adam_m:<name>",
"adam_v:<name>". The meta's "model" names the family (models.FAMILIES), which reads the config and
says what the parameters must be. Loading never unpickles anything. `write_json` is the one JSON
writer of the project: numpy numbers become plain ones, NaN and inf become null.
"""

import dataclasses
import functools
import json
import math
import os
import tempfile
import zipfile

import numpy as np

import models
from harness import runs
from tunnels import tasks


_UMASK = os.umask(0)
os.umask(_UMASK)


def _atomic_write(path, write):
    """write(file) into a temporary file beside path, then rename it over path: a reader sees the old
    file or the new one, never half of one."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_UMASK)                   # mkstemp's 0600 would differ from every other output
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save_arrays(path, arrays):
    """A dict of arrays as an .npz at path, atomically."""
    _atomic_write(path, lambda f: np.savez(f, **arrays))


class CheckpointNotSaved(Exception):
    """A checkpoint was not written (a weight is not finite, or the disk refused); the message says which."""


def save_checkpoint(path, params, cfg, meta=None, opt_state=None):
    """params, cfg (its family's Config), meta (a dict naming at least the model) as an .npz at path, atomically."""
    arrays = {"config": np.array(json.dumps(dataclasses.asdict(cfg))), "meta": np.array(json.dumps(meta or {}))}
    arrays.update({f"param:{k}": v for k, v in params.items()})
    if opt_state is not None:
        arrays["adam_t"] = np.array(opt_state["t"])
        arrays.update({f"adam_m:{k}": v for k, v in opt_state["m"].items()})
        arrays.update({f"adam_v:{k}": v for k, v in opt_state["v"].items()})
    _atomic_write(path, lambda f: np.savez(f, **arrays))


def save_checked(path, params, cfg, meta, opt_state=None):
    """save_checkpoint, refusing weights that are not finite; CheckpointNotSaved (the file at path kept) if a
    weight is not finite or the file cannot be written."""
    bad = [name for name, p in params.items() if not np.isfinite(p).all()]
    if bad:
        raise CheckpointNotSaved(f"weights {', '.join(bad[:3])} are not finite; not saved, {path} keeps the "
                                 f"last good checkpoint")
    try:
        save_checkpoint(path, params, cfg, meta, opt_state)
    except OSError as e:
        raise CheckpointNotSaved(f"{path} cannot be written ({e.strerror}); the previous file stays") from None


def versions():
    """The versions of Python, NumPy, SciPy and Numba this process runs, the CPU Numba compiles for (LLVM's
    name of the host) and the code's commit: every metrics.json and geometry.json records them (a result is
    reproduced bit for bit only with the same versions, which requirements-lock.txt pins, on the same kind of
    CPU: the compiled kernels use the host's vector instructions, and sums in another order round
    differently; and with the same code, which a kernel's change of rounding moves). Read once a process, at
    its first call (a run's first checkpoint), so that every checkpoint of a run records the same, whatever is
    checked out later (the code a process runs is the code it imported, before that first call)."""
    return dict(_versions())


@functools.lru_cache(maxsize=None)
def _versions():
    import platform

    import llvmlite.binding
    import numba
    import scipy
    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "numba": numba.__version__, "cpu": llvmlite.binding.get_host_cpu_name(), "commit": commit()}


def commit(folder=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))):
    """The git commit the code in folder (the repository's) was checked out at, "+changes" after it where a
    tracked file differs from it; None outside a git checkout or without git."""
    import subprocess
    try:
        git = lambda *a: subprocess.run(["git", "-C", folder, *a], capture_output=True, text=True, timeout=10)
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0:
            return None
        changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+changes" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return None


MAX_LOAD_BYTES = 2 ** 31    # a checkpoint declaring more than 2 GiB of arrays is refused before reading


def load_checkpoint(path):
    """-> (params, cfg, meta, opt_state or None), cfg the Config of the family meta["model"] names. Raises
    ValueError with one clear line if the file is missing, truncated, too large, names no registered model,
    or holds parameters of the wrong names or shapes for its own config."""
    problem = runs.name_problem(path) or runs.kind_problem(path, want_dir=False)    # a FIFO would hang the read
    if problem:
        raise ValueError(f"checkpoint {path!r} is {problem}")
    try:
        with zipfile.ZipFile(path) as z:                # the sizes the archive declares, before reading any
            declared = sum(info.file_size for info in z.infolist())
        if declared > MAX_LOAD_BYTES:
            raise ValueError(f"checkpoint {path!r} declares {declared / 2**30:.1f} GiB of arrays (at most "
                             f"{MAX_LOAD_BYTES / 2**30:.0f} GiB are loaded)")
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        fields = json.loads(str(data["config"]))
        meta = json.loads(str(data["meta"]))
        if not isinstance(meta, dict) or not isinstance(fields, dict):
            raise TypeError("meta or config is not a dict")
        name = meta.get("model")
        if name is None:
            raise ValueError(f"checkpoint {path!r} does not name its model in its meta (a run writes it; an "
                             f"array file saved otherwise is not a run's checkpoint)")
        if not isinstance(name, str) or name not in models.FAMILIES:
            raise ValueError(f"checkpoint {path!r} holds a model {name!r}, which is not registered (known: "
                             f"{', '.join(models.FAMILIES)})")
        problem = meta_problem(meta)
        if problem:
            raise ValueError(f"checkpoint {path!r}: its meta {problem}")
        try:
            cfg = models.config_from_dict(name, fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"checkpoint {path!r}: its config does not fit model {name!r} ({e})") from None
    except FileNotFoundError:
        raise ValueError(f"checkpoint {path!r} does not exist") from None
    except ValueError as e:
        if str(e).startswith(f"checkpoint {path!r}"):
            raise
        raise ValueError(f"checkpoint {path!r} is truncated or not a bayesattn checkpoint ({type(e).__name__})") from None
    except (OSError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as e:
        raise ValueError(f"checkpoint {path!r} is truncated or not a bayesattn checkpoint ({type(e).__name__})") from None
    params = {k[len("param:"):]: v for k, v in data.items() if k.startswith("param:")}
    shapes = models.param_shapes(name, cfg)
    _check_arrays(path, "parameter", params, shapes)
    opt_state = None
    if "adam_t" in data:
        opt_state = {"t": int(data["adam_t"]),
                     "m": {k[len("adam_m:"):]: v for k, v in data.items() if k.startswith("adam_m:")},
                     "v": {k[len("adam_v:"):]: v for k, v in data.items() if k.startswith("adam_v:")}}
        _check_arrays(path, "AdamW moment", opt_state["m"], shapes)
        _check_arrays(path, "AdamW moment", opt_state["v"], shapes)
        if not 0 <= opt_state["t"] < 2 ** 62:
            raise ValueError(f"checkpoint {path!r}: its AdamW step count adam_t {opt_state['t']} is negative")
    for what, arrays in (("parameter", params), *((("AdamW moment", opt_state["m"]), ("AdamW moment", opt_state["v"]))
                                                   if opt_state else ())):
        bad = next((k for k, v in arrays.items() if not np.isfinite(v).all()), None)
        if bad is not None:
            raise ValueError(f"checkpoint {path!r}: {what} {bad!r} holds values that are not finite (nan or inf); "
                             f"such a checkpoint is not read")
    return params, cfg, meta, opt_state


# what a run's meta may hold, each checked when the checkpoint is read: key -> (test, what is allowed). The
# task's own settings are checked by the task's flags (tunnels/tasks.py: FLAGS); other keys are kept as they are.
_integer = lambda lo, hi=2 ** 63: lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi
_number = lambda ok: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v)
_text = lambda v: v is None or isinstance(v, str)
META = {
    "task": (lambda v: isinstance(v, str), "a task's name"),
    "step": (_integer(0), "an integer >= 0"),
    "steps": (_integer(1), "a positive integer"),
    "baseline_steps": (lambda v: v is None or _integer(1)(v), "a positive integer"),
    "batch": (_integer(1), "a positive integer"),
    "warmup": (_integer(0), "an integer >= 0"),
    "threads": (_integer(1), "a positive integer"),
    "seed": (_integer(0), "an integer in 0..2^63-1"),
    "eval_seqs": (_integer(1), "a positive integer"),
    "lr": (_number(lambda v: v > 0), "a finite number > 0"),
    "lr_floor": (_number(lambda v: 0 <= v <= 1), "a number in [0, 1]"),
    "weight_decay": (_number(lambda v: 0 <= v < 1), "a number in [0, 1)"),
    "seconds": (_number(lambda v: v >= 0), "a finite number >= 0"),
    "soft": (lambda v: isinstance(v, bool), "true or false"),
    "replacement": (lambda v: isinstance(v, bool), "true or false"),
    "pos": (_text, "a name"), "init": (_text, "a name"), "dtype": (_text, "a name"),
}


def meta_problem(meta):
    """What is wrong with a checkpoint's meta (a dict), in a few words naming the key and its value, or None."""
    for key, (ok, allowed) in META.items():
        if key in meta and not ok(meta[key]):
            return f"has {key}={meta[key]!r}; allowed is {allowed}"
    if "step" in meta and "steps" in meta and meta["step"] > meta["steps"]:
        return f"has step={meta['step']}, past its steps={meta['steps']}"
    if meta.get("task") in tasks.TASKS:
        mod = tasks.task(meta["task"])
        settings = {**mod.SETTINGS, **{k: meta[k] for k in mod.SETTINGS if k in meta}}
        for spec in mod.FLAGS.values():
            key = spec["setting"]
            if meta.get(key) is not None:
                value = meta[key]
                if not isinstance(value, spec["type"]) or (isinstance(value, bool) and spec["type"] is not bool):
                    return f"has {key}={value!r}; allowed is a value of type {spec['type'].__name__}"
                problem = spec["check"](value, settings)
                if problem:
                    return f"has {key}={value!r}: {problem}"
    return None


def _check_arrays(path, what, arrays, shapes):
    """ValueError naming the first missing, unexpected or misshapen array."""
    missing, extra = sorted(set(shapes) - set(arrays)), sorted(set(arrays) - set(shapes))
    if missing or extra:
        name = (missing or extra)[0]
        raise ValueError(f"checkpoint {path!r}: {what} {name!r} is {'missing' if missing else 'not part of its config'}")
    for name, shape in shapes.items():
        if arrays[name].shape != tuple(shape) or not np.issubdtype(arrays[name].dtype, np.floating):
            raise ValueError(f"checkpoint {path!r}: {what} {name!r} has shape {arrays[name].shape} "
                             f"{arrays[name].dtype}, its config asks for {tuple(shape)} floats")


def plain(obj):
    """numpy scalars and arrays -> JSON types; non-finite floats -> None."""
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def write_json(path, obj, indent=1):
    """obj as JSON (plain types, NaN -> null) at path, atomically."""
    text = json.dumps(plain(obj), indent=indent, allow_nan=False)
    _atomic_write(path, lambda f: f.write(text.encode()))
