"""drivers: what every command that drives many runs shares with train.py, written once.

The commands that train or read many cells (primitives.matrix and its sweeps, primitives.depth,
primitives.depth_sweep, primitives.chainsteps, harness.compare) keep train.py's promise through these:
  - their flags are checked before the first run starts (`parser`, `count`, `seeds`, `directory`,
    `figure_file`, `memory`): each error one line, "<command>: error: <the value>: <what is allowed>", exit 2;
  - a directory of cells has one owner at a time (`take`: the lock train.py takes, harness/runs.py) and
    remembers the settings it was made with (RECORD, driver.json: the command, its settings, the cells and
    summaries it wrote); a rerun with other settings is refused unless --overwrite, which removes only what
    that command wrote there, and a directory another command made is refused;
  - a cell's metrics.json is read by one function (`read_metrics`) that names the file and what is wrong with
    it and never raises.
"""
import argparse
import json
import os
import shutil
import sys

from harness import runs
from harness.checkpoints import write_json

RECORD = "driver.json"
MAX_JOBS = 64
MAX_SEED = 2 ** 32 - 1          # NumPy's seeds
CELL_FILES = (".log", ".failed", ".sits_out")   # beside a cell's directory: its log and its markers
METRICS_KEYS = ("task", "model", "steps", "kl_bits")


class Refused(Exception):
    """A command that cannot start; the message is one line naming the flag and the value."""


def parser(prog, description, **kw):
    """An ArgumentParser whose every error is one line, `prog: error: message`, exit 2 (argparse's own prints
    the usage first)."""
    p = argparse.ArgumentParser(prog=prog, description=description, **kw)

    def error(message):
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
    p.error = error
    return p


# ----------------------------------------------------------------------------
# flags: each check -> None, or the one line that says what is wrong

def count(value, flag, lo=1, hi=None):
    """An integer flag within [lo, hi] (hi None: no upper bound)."""
    if value is None or (value >= lo and (hi is None or value <= hi)):
        return None
    return f"{flag} {value}: allowed are " + (f"{lo} to {hi}" if hi is not None else f"{lo} or more")


def jobs(value, flag="--jobs"):
    return count(value, flag, 1, MAX_JOBS)


def seeds(values, flag="--seeds"):
    """Seeds: each from 0 to MAX_SEED, none twice."""
    if values is None:
        return None
    bad = [s for s in values if not 0 <= s <= MAX_SEED]
    if bad:
        return f"{flag} {bad[0]}: allowed are 0 to {MAX_SEED}"
    twice = [s for s in values if values.count(s) > 1]
    return f"{flag} {twice[0]} is given twice: each seed once" if twice else None


def folder_problem(path):
    """What is wrong with a folder to be written, or None: its name, a file or broken link there, or a file
    on the way to it (it need not exist yet)."""
    problem = runs.name_problem(path)
    if problem:
        return problem
    at = os.path.abspath(path)
    while not os.path.lexists(at) and at != os.path.dirname(at):      # the deepest part that exists
        at = os.path.dirname(at)
    if at == os.path.abspath(path):
        return runs.kind_problem(path, want_dir=True)
    return None if os.path.isdir(at) else f"under {at!r}, which is not a directory"


def directory(path, flag):
    """A directory the command will write into (folder_problem)."""
    problem = None if path is None else folder_problem(path)
    return None if problem is None else f"{flag} {path!r} is {problem}"


def existing_directory(path, flag):
    """A directory the command reads from: it must exist."""
    problem = directory(path, flag)
    if problem is None and not os.path.isdir(path):
        return f"{flag} {path!r} does not exist"
    return problem


def figure_formats():
    """The file name endings matplotlib writes (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def figure_file(path, flag):
    """A figure file the command will write: a printable name ending in a format matplotlib writes, not a
    directory, its folder one that can be made."""
    problem = runs.name_problem(path)
    if problem:
        return f"{flag} {path!r} is {problem}"
    ext = os.path.splitext(path)[1][1:].lower()
    if ext not in figure_formats():
        return (f"{flag} {path!r}: {'.' + ext if ext else 'no ending'} is not a figure format matplotlib writes; "
                f"allowed are .png, .pdf, .svg and the rest of {', '.join(figure_formats())}")
    folder = os.path.dirname(path) or "."
    problem = folder_problem(folder)
    if problem:
        return f"{flag} {path!r}: its folder {folder!r} is {problem}"
    problem = runs.kind_problem(path, want_dir=False)
    return None if problem is None else f"{flag} {path!r} is {problem}"


def memory(bytes_needed, what):
    """What the command would hold at once against this machine's available memory."""
    import models
    have = models.available_memory_bytes()
    if bytes_needed <= have:
        return None
    return f"{what} needs about {bytes_needed / 2 ** 30:.1f} GiB; this machine has {have / 2 ** 30:.1f} GiB available"


def check(p, *problems):
    """Every problem found (None where a check passed) -> the first one as p's one-line error, exit 2."""
    for problem in problems:
        if problem:
            p.error(problem)


# ----------------------------------------------------------------------------
# a cell's files

def read_metrics(run_dir):
    """A cell's metrics.json -> (metrics, None); (None, None) where there is none; (None, what is wrong) where
    it cannot be read as a run's metrics (truncated, not JSON, not a run's). Never raises."""
    return read_metrics_file(os.path.join(run_dir, "metrics.json"))


def read_metrics_file(path):
    """read_metrics of a metrics file itself (a baseline's metrics_mlp.json)."""
    if not os.path.isfile(path):
        return None, None
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        return None, f"{path} cannot be read ({getattr(e, 'strerror', None) or e.__class__.__name__})"
    except json.JSONDecodeError:
        return None, f"{path} is truncated or not JSON"
    if not isinstance(m, dict) or any(k not in m for k in METRICS_KEYS):
        return None, f"{path} is not a run's metrics.json (it lacks {', '.join(k for k in METRICS_KEYS if not isinstance(m, dict) or k not in m)})"
    return m, None


def read_json(path, what, keys=()):
    """A summary file a command reads (depth-sweep.json, ...) -> its dict; Refused in one line naming the file
    where it is missing, truncated or lacks keys."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        raise Refused(f"{path}: no {what} there") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise Refused(f"{path} is truncated or not JSON: not a {what}") from None
    lacking = [k for k in keys if not isinstance(d, dict) or k not in d]
    if lacking:
        raise Refused(f"{path} is not a {what} (it lacks {lacking[0]})")
    return d


# ----------------------------------------------------------------------------
# a directory of cells: one owner, its settings remembered

def record_of(out):
    """The directory's RECORD, {} where there is none, None where it cannot be read."""
    path = os.path.join(out, RECORD)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        return d if isinstance(d, dict) and "command" in d and "settings" in d else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def differ(old, new):
    """The first setting whose value differs, as "name old (now new)", or None."""
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            return f"{k} {old.get(k)!r} (now {new.get(k)!r})"
    return None


def take(out, command, settings, overwrite=False, flag="--out"):
    """Take out for `command` before it writes anything: that it can be written, its lock (one owner: a second
    command is refused), and its record: a directory made with other settings is refused unless overwrite,
    which first removes what this command wrote there (the cells and summaries its record names); a
    directory another command made is refused. Refused in one line, with nothing left behind (the lock
    released). -> None; release with runs.release(out)."""
    problem = runs.writable(out)
    if problem:
        raise Refused(f"{flag} {out!r} {problem}")
    try:
        runs.acquire(out, command)
    except runs.RunDirectoryBusy as e:
        raise Refused(f"{flag} {e}; wait for it to end, or give another {flag}") from None

    def refuse(message):
        runs.release(out)
        raise Refused(message)
    record = record_of(out)
    if record is None:
        if not overwrite:
            refuse(f"{flag} {out!r}: its {RECORD} cannot be read: give another {flag}, or --overwrite to replace "
                   f"what {command} wrote there")
        record = {}
    if record and record["command"] != command:
        refuse(f"{flag} {out!r} holds the cells of {record['command']}, not {command}'s: give another {flag}")
    changed = differ(record.get("settings", {}), settings) if record else None
    if changed and not overwrite:
        refuse(f"{flag} {out!r} was made with {changed}: give another {flag}, or --overwrite to replace what "
               f"{command} wrote there")
    if changed and overwrite:
        remove_written(out, record)
        record = {}
    write_json(os.path.join(out, RECORD), dict(command=command, settings=settings, cells=record.get("cells", []),
                                               summaries=record.get("summaries", [])))


def remove_written(out, record):
    """Remove what a record says its command wrote in out: each cell's directory, log and markers, and each
    summary; nothing else."""
    for name in record.get("cells", []):
        path = os.path.join(out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        for end in CELL_FILES:
            if os.path.isfile(path + end):
                os.remove(path + end)
    for name in record.get("summaries", []):
        if os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))


def note(out, cells=(), summaries=()):
    """Add cells and summaries to out's record (where it has one: a directory taken by `take`)."""
    record = record_of(out)
    if not record:
        return
    record["cells"] = sorted(set(record["cells"]) | set(cells))
    record["summaries"] = sorted(set(record["summaries"]) | set(summaries))
    write_json(os.path.join(out, RECORD), record)
