"""runs: a run directory, runs/<name>/: the names of its files, replacing them, and one owner at a time.

A run writes, for the model named by --model: checkpoint.npz, metrics.json, log.csv, snapshots/; for a
baseline trained after it: <name>.npz, metrics_<name>.json, log_<name>.csv; and geometry.json and
figures named after the run (<run>_*.png, geometry_<run>_*.png). Nothing else in the directory is
ever touched. While a run trains it holds the directory's lock, .lock: a second run into the same
directory is refused while the first is alive.
"""

import json
import os
import socket
import time

LOCK = ".lock"


def checkpoint_name(model, main=True):
    return "checkpoint.npz" if main else f"{model}.npz"


def metrics_name(model, main=True):
    return "metrics.json" if main else f"metrics_{model}.json"


def log_name(model, main=True):
    return "log.csv" if main else f"log_{model}.csv"


def run_files(run_dir, model_names):
    """The files of a run that are in run_dir (model_names: every registered family, whose baselines'
    files a run may hold), sorted. Nothing else there is ever touched."""
    if not os.path.isdir(run_dir):
        return []
    run = os.path.basename(os.path.normpath(run_dir))
    ours = lambda name: (name in ("checkpoint.npz", "geometry.json", "snapshots")
                         or (name.startswith(("metrics", "log")) and name.endswith((".json", ".csv")))
                         or name in {f"{m}.npz" for m in model_names}
                         or (name.startswith((f"{run}_", f"geometry_{run}_")) and name.endswith(".png")))
    return sorted(name for name in os.listdir(run_dir) if ours(name))


def remove_run(run_dir, names):
    """Delete those files of a run (--overwrite), snapshots/ with its contents."""
    for name in names:
        path = os.path.join(run_dir, name)
        if os.path.isdir(path):
            for snap in os.listdir(path):
                os.remove(os.path.join(path, snap))
            os.rmdir(path)
        else:
            os.remove(path)


def remove_stale_temporaries(run_dir):
    """The .tmp-* files an interrupted atomic write left (checkpoints._atomic_write), in run_dir and snapshots/."""
    for folder in (run_dir, os.path.join(run_dir, "snapshots")):
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(".tmp-"):
                    os.remove(os.path.join(folder, name))


# ----------------------------------------------------------------------------
# one owner at a time. The lock file holds the owner's host, process id and that process's start time
# (/proc/<pid>/stat, field 22, in clock ticks since boot). It is stale when its host is this one and no
# process with that id is alive, or one is but started at another time (the id was reused after the
# owner was killed). A stale lock is removed and taken; a live one refuses the second run.

class RunDirectoryBusy(Exception):
    """Another live process holds the run directory; the message names it."""


def process_start(pid):
    """The start time of process pid (clock ticks since boot), or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])   # field 22; the name in () may hold spaces
    except (OSError, IndexError, ValueError):
        try:
            os.kill(pid, 0)                                       # no /proc: alive or not, start unknown
            return -1
        except ProcessLookupError:
            return None
        except PermissionError:
            return -1


def lock_is_stale(owner):
    """Is the lock of owner {host, pid, start} left by a process that no longer runs?"""
    if owner.get("host") != socket.gethostname():
        return False                                              # another machine's: cannot tell, keep it
    start = process_start(int(owner.get("pid", -1)))
    return start is None or (start != -1 and owner.get("start") not in (None, -1) and start != owner["start"])


def acquire(run_dir, what):
    """Take run_dir's lock for this process (what: the command, for the message a second run sees);
    RunDirectoryBusy if a live process holds it. A stale lock is taken over."""
    path = os.path.join(run_dir, LOCK)
    me = dict(host=socket.gethostname(), pid=os.getpid(), start=process_start(os.getpid()), what=what,
              since=time.strftime("%Y-%m-%d %H:%M:%S"))
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = json.load(f)
            except (OSError, ValueError):
                owner = {}                                        # being written now, or by a process killed then
            if not owner and _age(path) < 5.0:
                owner = {"pid": "?", "host": "this machine", "since": "a moment ago", "what": "starting"}
            if owner and (owner.get("pid") == "?" or not lock_is_stale(owner)):
                raise RunDirectoryBusy(f"{run_dir!r} is in use by another run (process {owner.get('pid')} on "
                                       f"{owner.get('host')}, since {owner.get('since')}: {owner.get('what')}); "
                                       f"wait for it to end, or give another --out") from None
            try:
                os.remove(path)                                   # stale: take it over
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return path
    raise RunDirectoryBusy(f"{run_dir!r}: its lock {path} could not be taken")


def _age(path):
    try:
        return time.time() - os.path.getmtime(path)
    except OSError:
        return float("inf")


def release(run_dir):
    """Remove run_dir's lock if this process holds it."""
    path = os.path.join(run_dir, LOCK)
    try:
        with open(path) as f:
            owner = json.load(f)
        if owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
            os.remove(path)
    except (OSError, ValueError):
        pass
