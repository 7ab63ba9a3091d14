"""checkpoints: what a run writes to disk, written atomically (a temporary file, then a rename).

A checkpoint is one .npz: the model's config and a JSON "meta" dict (model, task, step, ...) as strings,
the parameters as "param:<name>", optionally the AdamW state as "adam_t", "adam_m:<name>",
"adam_v:<name>". The meta's "model" names the family (models.FAMILIES), which reads the config and
says what the parameters must be. Loading never unpickles anything. `write_json` is the one JSON
writer of the project: numpy numbers become plain ones, NaN and inf become null.
"""

import json
import math
import os
import tempfile
import zipfile

import numpy as np

import models


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
    arrays = {"config": np.array(json.dumps(cfg.to_dict())), "meta": np.array(json.dumps(meta or {}))}
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
    """The versions of Python, NumPy, SciPy and Numba this process runs: every metrics.json and geometry.json
    records them (a result is reproduced bit for bit only with the same ones; requirements-lock.txt pins them)."""
    import platform

    import numba
    import scipy
    return {"python": platform.python_version(), "numpy": np.__version__, "scipy": scipy.__version__,
            "numba": numba.__version__}


MAX_LOAD_BYTES = 2 ** 31    # a checkpoint declaring more than 2 GiB of arrays is refused before reading


def load_checkpoint(path):
    """-> (params, cfg, meta, opt_state or None), cfg the Config of the family meta["model"] names. Raises
    ValueError with one clear line if the file is missing, truncated, too large, names no registered model,
    or holds parameters of the wrong names or shapes for its own config."""
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
        if name not in models.FAMILIES:
            raise ValueError(f"checkpoint {path!r} holds a model {name!r}, which is not registered (known: "
                             f"{', '.join(models.FAMILIES)})")
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
    return params, cfg, meta, opt_state


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
