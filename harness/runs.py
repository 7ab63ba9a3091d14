"""runs: a run directory, runs/<name>/: the names of its files, replacing them, and one owner at a time.

A run writes, for the model named by --model: checkpoint.npz, metrics.json, log.csv, snapshots/; for a
baseline trained after it: <name>.npz, metrics_<name>.json, log_<name>.csv; and geometry.json and
figures named after the run (<run>_*.png, geometry_<run>_*.png). Nothing else in the directory is
ever touched. While a run trains it holds the directory's lock, .lock: a second run into the same
directory is refused while the first is alive. Every command that writes into a run directory (train.py's
runs, --eval-only and Paper II's experiments, geometry/run.py) takes it through `take`, which checks the name,
that the directory can be written and whether it already holds a finished run, before anything is written.
"""

import errno
import json
import os
import socket
import tempfile
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
# taking a run directory: its name, whether it can be written, its owner, what it already holds

class Refused(Exception):
    """A run directory that cannot be taken; the message is one line naming the flag and the value."""


def name_problem(path):
    """What is wrong with a file or directory name a user typed, or None: empty, a control character (a
    newline would break the printed commands), or bytes that are not UTF-8 (the figure titles show it)."""
    if path == "":
        return "an empty name; give a directory or file name"
    if any(0xDC80 <= ord(c) <= 0xDCFF for c in path):          # undecodable bytes (Python's surrogateescape)
        return "a name with bytes that are not UTF-8; allowed are UTF-8 names"
    if not path.isprintable():
        return "a name with a newline or another control character; allowed are printable names"
    return None


def kind_problem(path, want_dir):
    """What is wrong with what path is on disk, or None: a symbolic link loop, a dangling link, a file where a
    directory is wanted (want_dir) or, where a file is wanted, a directory, FIFO, device or socket."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing" if os.path.islink(path) else None
    except OSError as e:
        return "a symbolic link loop" if e.errno == errno.ELOOP else f"a path that cannot be read ({e.strerror})"
    if want_dir:
        return None if stat.S_ISDIR(mode) else "a file, not a directory"
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    return None if stat.S_ISREG(mode) else "not a regular file (a FIFO, a device or a socket)"


def writable(folder):
    """Create folder if needed and write a file of a fresh unique name there (removed at once; no file of the
    user's is ever opened); -> None, or why it cannot be written ("is a file, not a directory", ...)."""
    problem = name_problem(folder) or kind_problem(folder, want_dir=True)
    if problem:
        return f"is {problem}"
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        os.close(fd)
        os.remove(tmp)
    except OSError as e:
        return f"cannot be written ({e.strerror})"
    return None


def take(run_dir, flag, what, held=(), keep=False, instead=None, resumable=True):
    """Take run_dir for a command that writes into it, before it writes anything: its name, that it can be
    written, its lock (what: the command, for the message a second command sees), and the never-overwrite
    rule: held (the files of a run of this command already there, see run_files) refuses unless keep
    (--resume or --overwrite). flag names the value in the message; instead, the flag that gives another
    directory (default flag; "": none does); resumable: whether the held run can be continued (--resume).
    -> the lock's path; Refused with one line, the directory as it was (no lock left)."""
    problem = writable(run_dir)
    if problem:
        raise Refused(f"{flag} {run_dir!r} {problem}")
    try:
        path = acquire(run_dir, what)
    except RunDirectoryBusy as e:
        raise Refused(f"{flag} {e}; wait for it to end" + (f", or give another {instead or flag}"
                                                               if instead != "" else "")) from None
    if held and not keep:
        release(run_dir)
        raise Refused(f"{flag} {run_dir!r} already holds a run ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): "
                      f"{'continue it with --resume, ' if resumable else ''}replace it with --overwrite, or give "
                      f"another {instead or flag}")
    return path


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
                                       f"{owner.get('host')}, since {owner.get('since')}: {owner.get('what')})") from None
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
