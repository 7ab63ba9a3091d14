"""The promise to a careless or unlucky user, by class of hostile input: a bad value gets one line naming it
and what is allowed, exit code 2, and nothing already written changes (every file of the run directory is
hashed before and after); a run directory has one owner; a finished run is never overwritten silently.

The classes: 1 memory a flag sizes, 2 a checkpoint's meta, 3 non-finite weights, 4 one owner and one writer
for every command, 5 flags that cannot apply, 6 values that mean nothing together, 7 paths, 8 special files,
9 a damaged log.csv on --resume. Most cases run in-process (train.main, geometry.main) and are refused
before any training; those that could hang (FIFOs) or need bytes in argv run as a subprocess with a timeout.
"""

import hashlib
import json
import importlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from harness import checkpoints
from harness import runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository's folder
QUICK = ["--preset", "quick", "--quiet", "--no-baseline", "--no-geometry", "--eval-seqs", "8", "--threads", "1"]
SAME = [*QUICK, "--steps", "4", "--seed", "3"]          # the flags of the runs below


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A finished run (4 steps, seed 3) and one stopped at step 2 of 4, made once; each case copies one."""
    import train
    base = tmp_path_factory.mktemp("hostile")
    train.main([*SAME, "--out", str(base / "finished"), "--figures", str(base / "figures")])
    train.main([*SAME, "--stop-after", "2", "--out", str(base / "stopped"), "--figures", str(base / "figures")])
    return base


def tree(folder):
    """Every entry under folder: a file's SHA-256, a directory, a link's target, or what else it is (a FIFO is
    never opened)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            key = os.path.relpath(path, folder)
            if os.path.islink(path):
                out[key] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                out[key] = "dir"
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[key] = hashlib.sha256(f.read()).hexdigest()
            else:
                out[key] = "special"
    return out


def edit_meta(**changes):
    def edit(run):
        path = os.path.join(run, "checkpoint.npz")
        params, cfg, meta, state = checkpoints.load_checkpoint(path)
        checkpoints.save_checkpoint(path, params, cfg, {**meta, **changes}, state)
    return edit


def edit_arrays(which, name):
    def edit(run):
        path = os.path.join(run, "checkpoint.npz")
        params, cfg, meta, state = checkpoints.load_checkpoint(path)
        (params if which == "param" else state[which])[name].flat[0] = np.nan if which == "param" else np.inf
        checkpoints.save_checkpoint(path, params, cfg, meta, state)
    return edit


def edit_log(line, text):
    """Replace line `line` (1: the header) of log.csv by text (bytes), or append it (line None)."""
    def edit(run):
        path = os.path.join(run, "log.csv")
        with open(path, "rb") as f:
            lines = f.read().splitlines()
        if line is None:
            lines.append(text)
        else:
            lines[line - 1] = text
        with open(path, "wb") as f:
            f.write(b"\r\n".join(lines) + (b"" if line is None else b"\r\n"))
    return edit


def replace(name, make):
    """Put another kind of thing at run/name: "fifo", "dir", a symbolic link loop ("loop")."""
    def edit(run):
        path = os.path.join(run, name)
        if os.path.lexists(path):
            os.remove(path)
        if make == "fifo":
            os.mkfifo(path)
        elif make == "dir":
            os.mkdir(path)
        else:
            os.symlink(path + ".b", path + ".a")
            os.symlink(path + ".a", path + ".b")
            os.symlink(path + ".b", path)
    return edit


def write(name, data):
    def edit(run):
        with open(os.path.join(run, name), "wb") as f:
            f.write(data)
    return edit


def mkdir_with(folder, name, data):
    def edit(run):
        os.mkdir(os.path.join(run, folder))
        write(os.path.join(folder, name), data)(run)
    return edit


def live_lock(run):
    """The directory held by a live process: this one (its own id and start time: not stale)."""
    with open(os.path.join(run, runs.LOCK), "w") as f:
        json.dump({"host": runs.socket.gethostname(), "pid": os.getpid(), "start": runs.process_start(os.getpid()),
                   "since": "earlier", "what": "train.py --steps 100000"}, f)


CKPT = "{run}/checkpoint.npz"
# (class, base run, change to it, command, argv ({run}: the copy), what the one line must hold)
CASES = [
    # 1. memory: every allocation a flag sizes, refused before anything is deleted or trained, naming the flag
    (1, "finished", None, "train", [*SAME, "--eval-seqs", "100000000", "--overwrite", "--out", "{run}"],
     "--eval-seqs 100000000: the held-out evaluation of 100,000,000 sequences would need about"),
    (1, "finished", None, "train", ["--V", "5000", "--out", "{run}"], "--V 5000: a training step would need about"),
    (1, "finished", None, "train", ["--task", "hmm", "--K", "100000", "--out", "{run}"],
     "--K 100000: a training step would need about"),
    (1, "finished", None, "train", ["--eval-only", CKPT, "--eval-seqs", "100000000"],
     "--eval-seqs 100000000: the held-out evaluation of 100,000,000 sequences"),
    (1, "finished", None, "geometry", [CKPT, "--n-seqs", "100000000"], "--n-seqs 100000000: the probes would need about"),
    # 2. a checkpoint's meta, checked by type and range when it is read; log.csv is not touched before
    (2, "stopped", edit_meta(step=-5), "train", [*SAME, "--resume", "--out", "{run}"],
     "its meta has step=-5; allowed is an integer >= 0"),
    (2, "stopped", edit_meta(task=["bijection"]), "train", [*SAME, "--resume", "--out", "{run}"],
     "its meta has task=['bijection']; allowed is a task's name"),
    (2, "finished", edit_meta(seed="3"), "train", ["--eval-only", CKPT], "its meta has seed='3'; allowed is an integer"),
    (2, "finished", edit_meta(step=99), "geometry", [CKPT], "its meta has step=99, past its steps=4"),
    (2, "finished", edit_meta(V=1), "train", ["--eval-only", CKPT], "its meta has V=1: the bijection needs at least 2 keys"),
    (2, "stopped", edit_meta(lr=float("inf")), "train", [*SAME, "--resume", "--out", "{run}"],
     "its meta has lr=inf; allowed is a finite number > 0"),
    (2, "finished", edit_meta(model=["transformer"]), "train", ["--eval-only", CKPT],
     "holds a model ['transformer'], which is not registered"),
    # 3. non-finite weights, refused at load naming the tensor
    (3, "finished", edit_arrays("param", "blocks.0.attn.wq"), "train", ["--eval-only", CKPT],
     "parameter 'blocks.0.attn.wq' holds values that are not finite"),
    (3, "finished", edit_arrays("param", "wte"), "geometry", [CKPT], "parameter 'wte' holds values that are not finite"),
    (3, "stopped", edit_arrays("m", "lnf.g"), "train", [*SAME, "--resume", "--out", "{run}"],
     "AdamW moment 'lnf.g' holds values that are not finite"),
    # 4. one owner, one writer: every command that writes into a run directory
    (4, "finished", live_lock, "train", ["--eval-only", CKPT], ("is in use by another run (process", "its folder")),
    (4, "finished", live_lock, "geometry", [CKPT], "its run directory"),
    (4, "finished", live_lock, "dynamics", ["--out", "{run}"], "--out '{run}' is in use by another run"),
    (4, "finished", live_lock, "dynamics", ["--deep", "--out", "{run}"], "is in use by another run"),
    (4, "finished", write("sticky_metrics.json", b"{}"), "dynamics", ["--out", "{run}"],
     "already holds a run (sticky_metrics.json): replace it with --overwrite, or give another --out"),
    (4, "finished", write("dynamics.json", b"{}"), "dynamics", ["--compare-em", "--out", "{run}"],
     "already holds a run (dynamics.json): replace it with --overwrite"),
    (4, "finished", write("deep_variant.json", b"{}"), "dynamics", ["--deep", "--out", "{run}"],
     "already holds a run (deep_variant.json): replace it with --overwrite"),
    (4, "finished", write("deep_seed42.json", b"{}"), "dynamics", ["--deep", "--out", "{run}"],
     "already holds a run (deep_seed42.json): continue it with --resume, replace it with --overwrite"),
    (4, "finished", write("sticky_metrics.json", b"{}"), "dynamics", ["--resume", "--out", "{run}"],
     "the one-head run in --out '{run}' is finished (sticky_metrics.json written); --overwrite replaces it"),
    (4, "finished", write("sticky_progress.npz", b"not an archive"), "dynamics", ["--resume", "--out",
     "{run}"], "sticky_progress.npz' is damaged or not the one-head run's"),
    (4, "finished", write("dynamics.json", b"{}"), "dynamics", ["--compare-em", "--resume", "--out",
     "{run}"], "the comparison (--compare-em) in --out '{run}' is finished (dynamics.json written)"),
    (4, "finished", mkdir_with("progress", "notes.txt", b"mine"), "dynamics", ["--compare-em",
     "--resume", "--out", "{run}"], "progress/notes.txt' is not one of compare-em's runs"),
    (4, "finished", mkdir_with("progress", "transformer.json", json.dumps(dict(
        seeds=[42], steps=5, quick=False, mstep_steps=None, transformer_steps=None, chain="exact", lr=0.01,
        name="transformer", seconds=1.0, result={})).encode()), "dynamics",
     ["--compare-em", "--resume", "--out", "{run}"],
     "progress/transformer.json' has seeds=[42] but this run asks for [42, 2024, 1337, 7777, 9999]"),
    (4, "finished", write("deep_variant.json", b"{}"), "dynamics", ["--deep", "--resume", "--out", "{run}"],
     "the deep variant in --out '{run}' is finished (deep_variant.json written); --overwrite replaces it"),
    (4, "finished", None, "dynamics", ["--deep", "--resume", "--out", "{run}"],
     "--out '{run}' holds no progress of the deep variant to continue"),
    (4, "finished", None, "dynamics", ["--resume", "--out", "{run}"],
     "holds no progress of the one-head run to continue"),
    (4, "finished", write("deep_seed42.npz", b"not an archive"), "dynamics",
     ["--deep", "--resume", "--out", "{run}"], "deep_seed42.npz' is damaged or not the deep variant's"),
    # 5. flags that cannot apply
    (5, "finished", None, "train", ["--eval-only", CKPT, "--resume"], "--resume does not apply to --eval-only"),
    (5, "finished", None, "train", ["--eval-only", CKPT, "--task", "hmm"], "--task does not apply to --eval-only"),
    (5, "finished", None, "train", ["--eval-only", CKPT, "--V", "10"], "--V does not apply to --eval-only"),
    (5, "finished", None, "train", ["--eval-only", CKPT, "--seed", "4"], "--seed does not apply to --eval-only"),
    (5, "finished", None, "train", ["--baseline", "transformer", "--out", "{run}"],
     "--baseline transformer: it is the --model itself"),
    (5, "finished", None, "train", ["--no-baseline", "--baseline-steps", "5", "--out", "{run}"],
     "--baseline-steps and --no-baseline: there is no baseline to set"),
    (5, "finished", None, "train", [*SAME, "--resume", "--out", "{run}"],
     "--resume: the run in --out '{run}' is finished (step 4 of 4; metrics.json written)"),
    (5, "finished", None, "train", [*SAME, "--resume", "--kernels", "numpy", "--out", "{run}"], "is finished"),
    (5, "finished", None, "dynamics", ["--compare-em", "--resume", "--out", "{run}"],
     "holds no progress of the comparison (--compare-em) to continue"),
    # 6. values that pass their own checks but not together
    (6, "finished", None, "train", ["--warmup", "100", "--steps", "60", "--out", "{run}"],
     "--warmup 100: longer than the run (--steps 60); allowed are 0..60"),
    (6, "finished", None, "train", ["--steps", "60", "--stop-after", "60", "--out", "{run}"],
     "--stop-after 60: the run ends at step 60 anyway"),
    (6, "finished", None, "train", ["--task", "sawtooth", "--curriculum", "5:100", "--steps", "60", "--out", "{run}"],
     "--curriculum '5:100': its last stage ends at step 100, not before the run's end (--steps 60)"),
    (6, "finished", None, "dynamics", ["--sigma", "1e-200", "--out", "{run}"],
     "--sigma 1e-200: must lie in 1e-06..1e+06"),
    (6, "finished", None, "dynamics", ["--deep", "--steps", "10", "--stop-after", "10", "--out", "{run}"],
     "--stop-after 10: each seed ends at step 10 anyway"),
    (6, "finished", None, "dynamics", ["--stop-after", "1000", "--out", "{run}"],
     "--stop-after 1000: the run ends at step 1000 anyway"),
    (6, "finished", None, "dynamics", ["--compare-em", "--stop-after", "33", "--out", "{run}"],
     "--stop-after 33: --compare-em has 33 runs (each arm of each seed, and three more); allowed are 1..32"),
    (6, "finished", None, "dynamics", ["--compare-em", "--preset", "quick", "--stop-after", "15",
     "--out", "{run}"], "--compare-em --preset quick has 15 runs"),
    (6, "stopped", None, "train", [*SAME, "--resume", "--stop-after", "1", "--out", "{run}"], "--stop-after 1: the checkpoint"),
    # 7. paths
    (7, "finished", None, "train", ["--out", ""], "--out '': an empty name; give a directory or file name"),
    (7, "finished", None, "train", ["--out", "{run}/a\nb"], "a name with a newline or another control character"),
    (7, "finished", None, "train", ["--figures", "", "--out", "{run}"], "--figures '': an empty name"),
    (7, "finished", write(".write-test", b"mine"), "train", [*SAME, "--out", "{run}"],
     "already holds a run"),                                          # the writability check left the user's file
    (7, "finished", None, "train", ["--out", "{run}/metrics.json"], "--out '{run}/metrics.json' is a file, not a directory"),
    (7, "finished", replace("sub", "loop"), "train", ["--out", "{run}/sub"], "--out '{run}/sub' is a symbolic link loop"),
    (7, "finished", None, "geometry", [CKPT, "--seed", "-1"], "--seed -1: must be an integer in 0..2^63-1"),
    (7, "finished", None, "geometry", [CKPT, "--figures", ""], "--figures '': an empty name"),
    # 8. special files: refused as not regular files, never opened (a FIFO would hang the read)
    (8, "finished", replace("checkpoint.npz", "fifo"), "train", ["--eval-only", CKPT],
     "checkpoint '{run}/checkpoint.npz' is not a regular file (a FIFO, a device or a socket)"),
    (8, "finished", replace("checkpoint.npz", "fifo"), "geometry", [CKPT], "is not a regular file"),
    (8, "finished", None, "train", ["--eval-only", "{run}"], "checkpoint '{run}' is a directory, not a file"),
    (8, "finished", None, "train", ["--eval-only", "/dev/null"], "checkpoint '/dev/null' is not a regular file"),
    (8, "finished", replace("checkpoint.npz", "loop"), "train", ["--eval-only", CKPT], "is a symbolic link loop"),
    (8, "stopped", replace("log.csv", "fifo"), "train", [*SAME, "--resume", "--out", "{run}"],
     "the log '{run}/log.csv' is not a regular file"),
    (8, "stopped", replace("log.csv", "dir"), "train", [*SAME, "--resume", "--out", "{run}"], "is a directory, not a file"),
    # 9. log.csv on --resume: a damaged log refused in one line, untouched
    (9, "stopped", edit_log(2, b"1.0,4.3,3.2,3.000e-04,0.37,1.9"), "train", [*SAME, "--resume", "--out", "{run}"],
     "the log '{run}/log.csv' is damaged at line 2 (not a row this run writes), at or before the checkpoint's step 2"),
    (9, "stopped", edit_log(3, b"hello,world"), "train", [*SAME, "--resume", "--out", "{run}"], "is damaged at line 3"),
    (9, "stopped", edit_log(2, b"1,4.3,\xff\xfe,3.000e-04,0.37,1.9"), "train", [*SAME, "--resume", "--out", "{run}"],
     "is damaged at line 2"),
    (9, "stopped", edit_log(1, b"garbage"), "train", [*SAME, "--resume", "--out", "{run}"],
     "does not start with the header a run writes"),
    (9, "stopped", edit_log(3, b"2,4.3"), "train", [*SAME, "--resume", "--out", "{run}"], "is damaged at line 3"),
]
COMMANDS = {"train": ("train", "train.py"), "geometry": ("geometry.run", "python -m geometry.run"),
            "dynamics": ("dynamics.run", "python -m dynamics.run")}
SUBPROCESS = {8}                       # a regression there would hang: run those with a timeout


@pytest.mark.parametrize("cls, base, change, command, argv, expected", CASES,
                         ids=[f"class{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_hostile_input_gets_one_line_and_changes_nothing(cls, base, change, command, argv, expected, made, tmp_path,
                                                         capsys, monkeypatch):
    run = str(tmp_path / "run")
    shutil.copytree(made / base, run)
    if change is not None:
        change(run)
    before = tree(run)
    argv = [a.replace("{run}", run) for a in argv]
    expected = (expected,) if isinstance(expected, str) else expected
    monkeypatch.chdir(tmp_path)
    module, prog = COMMANDS[command]
    if cls in SUBPROCESS:
        line = ([os.path.join(ROOT, "train.py")] if command == "train"       # the root's command, from anywhere
                else ["-m", module])                                       # a wing's, from the repository's folder
        proc = subprocess.run([sys.executable, *line, *argv], cwd=tmp_path if command == "train" else ROOT,
                              capture_output=True, text=True, timeout=300)
        code, err = proc.returncode, proc.stderr
    else:
        with pytest.raises(SystemExit) as stop:
            importlib.import_module(module).main(argv)
        code, err = stop.value.code, capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and len(lines) == 1, (code, err)
    assert lines[0].startswith(f"{prog}: error: "), lines
    for part in expected:
        assert part.replace("{run}", run) in lines[0], (part, lines[0])
    assert tree(run) == before                              # nothing already written changed (no lock left)


def test_bytes_that_are_not_utf8_in_a_name_are_refused_before_anything(tmp_path):
    """A name from bytes that are not UTF-8 (Python sees them as lone surrogates) is refused up front."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--out", b"runs/bad\xff"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "a name with bytes that are not UTF-8" in lines[0], proc.stderr
    assert os.listdir(tmp_path) == []


def test_eval_only_of_a_folder_that_cannot_be_written_names_the_flag_typed(made, tmp_path, monkeypatch, capsys):
    """--eval-only of a checkpoint whose folder cannot be written (here: every temporary file there refused, as
    a read-only directory would) is refused before it evaluates, naming --eval-only, never a --figures the user
    did not type; with --figures elsewhere it runs."""
    import tempfile
    import train
    run = tmp_path / "ro"
    shutil.copytree(made / "finished", run)
    mkstemp = tempfile.mkstemp

    def refuse_in_run(*a, dir=None, **k):
        if os.path.abspath(dir) == str(run):
            raise PermissionError(13, "Permission denied")
        return mkstemp(*a, dir=dir, **k)
    monkeypatch.setattr(tempfile, "mkstemp", refuse_in_run)
    before = tree(run)
    with pytest.raises(SystemExit) as stop:
        train.main(["--eval-only", str(run / "checkpoint.npz"), "--threads", "1"])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and err.count("\n") == 1 and out == "", (out, err)
    assert err.startswith(f"train.py: error: --eval-only '{run}/checkpoint.npz': its folder '{run}' cannot be "
                          f"written (Permission denied)"), err
    assert "--figures '" not in err and tree(run) == before
    m = train.main(["--eval-only", str(run / "checkpoint.npz"), "--threads", "1", "--figures", str(tmp_path / "f")])
    assert m["model"] == "transformer" and tree(run) == before


def test_resume_repairs_half_a_row_past_the_checkpoint(made, tmp_path):
    """A run killed while writing a row leaves half a line after the checkpoint's step: --resume drops it (the
    rows after the checkpoint are rewritten anyway) and the log ends as a run's own."""
    import train
    run = tmp_path / "run"
    shutil.copytree(made / "stopped", run)
    edit_log(None, b"3,4.32")(str(run))
    train.main([*SAME, "--resume", "--out", str(run), "--figures", str(tmp_path / "f")])
    rows = [r.split(",") for r in (run / "log.csv").read_text().splitlines()]
    assert rows[0] == train.LOG_HEADER and [r[0] for r in rows[1:]] == ["1", "2", "3", "4"]
    assert all(len(r) == len(train.LOG_HEADER) for r in rows)


def test_the_deep_variant_resumes_seed_by_seed_to_the_same_numbers(tmp_path):
    """--stop-after saves the seed in progress, --resume continues it and the seeds after it: the same held-out
    numbers as a run never stopped (a tiny chain, two seeds)."""
    from dynamics import experiments as dynamics
    kw = dict(seeds=(3, 4), steps=4, T=32, lr=3e-3)
    whole = dynamics.deep_variant(**kw)
    with pytest.raises(dynamics.Stopped, match="at step 2 of 4 of seed 3"):
        dynamics.deep_variant(**kw, out_dir=str(tmp_path), stop=2)
    assert sorted(os.listdir(tmp_path)) == ["deep_seed3.npz"]
    with pytest.raises(ValueError, match="has steps=4 but this run asks for 5"):
        dynamics.deep_progress(str(tmp_path), **{**kw, "steps": 5})
    progress = dynamics.deep_progress(str(tmp_path), **kw)
    assert list(progress["states"]) == [3] and progress["states"][3][3] == 2
    resumed = dynamics.deep_variant(**kw, out_dir=str(tmp_path), progress=progress)
    assert sorted(os.listdir(tmp_path)) == ["deep_seed3.json", "deep_seed4.json"]     # rows kept, state gone
    again = dynamics.deep_variant(**kw, out_dir=str(tmp_path), progress=dynamics.deep_progress(str(tmp_path), **kw))
    for key in ("test_loss_bits", "test_kl_bits", "train_loss_final_bits"):
        assert [r[key] for r in resumed["per_seed"]] == [r[key] for r in whole["per_seed"]], key
        assert [r[key] for r in again["per_seed"]] == [r[key] for r in whole["per_seed"]], key   # read, not trained
    assert resumed["per_seed"][0]["train_loss_bits"] == whole["per_seed"][0]["train_loss_bits"]


def test_the_one_head_run_resumes_to_the_same_numbers(tmp_path):
    """--stop-after keeps the one-head run's step, its curves and its weights; --resume continues them (twice
    here) to the numbers of a run never stopped, and the finished run keeps its metrics, not its progress."""
    from dynamics import experiments as dynamics
    kw = dict(steps=6, seed=3, T=32, lr=0.05)
    whole = dynamics.run_sticky(**kw)
    out = str(tmp_path)
    with pytest.raises(dynamics.Stopped, match="at step 2 of 6"):
        dynamics.run_sticky(**kw, out_dir=out, stop=2)
    assert os.listdir(tmp_path) == ["sticky_progress.npz"]
    with pytest.raises(ValueError, match="has steps=6 but this run asks for 7"):
        dynamics.one_head_progress(out, **{**kw, "steps": 7})
    with pytest.raises(ValueError, match="has seed=3 but this run asks for 4"):
        dynamics.one_head_progress(out, **{**kw, "seed": 4})
    with pytest.raises(dynamics.Stopped, match="at step 4 of 6"):
        dynamics.run_sticky(**kw, out_dir=out, stop=4, progress=dynamics.one_head_progress(out, **kw))
    params, so_far = dynamics.one_head_progress(out, **kw)
    assert so_far["step"] == 4 and len(so_far["loss"]) == 4 and len(so_far["seconds"]) == 5
    resumed = dynamics.run_sticky(**kw, out_dir=out, progress=(params, so_far))
    assert sorted(os.listdir(tmp_path)) == ["sticky_head.npz", "sticky_metrics.json"]
    assert {k for k in whole if whole[k] != resumed[k]} == {"seconds"}
    assert resumed["train_loss_curve_bits"][0] > resumed["train_loss_curve_bits"][-1]     # it trained: not a copy


def test_compare_em_keeps_each_run_and_resumes_to_the_same_summary(tmp_path):
    """Each arm of each seed is kept as it finishes; a comparison stopped after some of them and resumed reads
    those (a kept number changed by hand shows through) and trains the rest, to the summary of one never stopped."""
    from dynamics import experiments as dynamics
    from tunnels import sticky
    reference = dynamics.exact_bayes_reference(1.0, n=2, T=16)
    data = lambda s: sticky.data(s, T=16)
    kw = dict(name="long_chain", seeds=(1, 2), make_data=data, steps=4, mstep_steps=2, reference=reference)
    units = lambda stop, done=None: dict(dir=str(tmp_path / "progress"), identity={"steps": 4}, stop=stop,
                                         done=dict(done or {}), total=6)
    whole, _ = dynamics.compare_setting(**kw, units=units(None))
    os.rename(tmp_path / "progress", tmp_path / "whole")
    with pytest.raises(dynamics.Stopped, match="after 4 of its 6 runs"):
        dynamics.compare_setting(**kw, units=units(4))
    assert sorted(os.listdir(tmp_path / "progress")) == ["long_chain-seed1-em.json", "long_chain-seed1-mstep.json",
                                                         "long_chain-seed1-sgd.json", "long_chain-seed2-sgd.json"]
    done = {name: json.load(open(tmp_path / "progress" / f"{name}.json"))["result"]
            for name in ("long_chain-seed1-em", "long_chain-seed1-mstep", "long_chain-seed1-sgd", "long_chain-seed2-sgd")}
    resumed, _ = dynamics.compare_setting(**kw, units=units(None, done))
    timeless = lambda d: ({k: timeless(v) for k, v in d.items() if "seconds" not in k} if isinstance(d, dict) else
                          [timeless(v) for v in d] if isinstance(d, list) else d)
    assert timeless(resumed) == timeless(whole) and resumed["sgd"]["reached"] == 1
    done["long_chain-seed1-sgd"]["heldout"]["loss_bits"] = 99.0                   # read, not trained again
    tampered, _ = dynamics.compare_setting(**kw, units=units(None, done))
    assert tampered["per_seed"][0]["sgd"]["heldout_loss_bits"] == 99.0
    assert timeless(tampered["per_seed"][1]) == timeless(whole["per_seed"][1])


def test_compare_em_progress_reads_only_its_own_runs(tmp_path):
    """compare_em_progress: the runs of this comparison, by name; a stray file, another comparison's run and an
    atomic write's leftover are told apart."""
    from dynamics import experiments as dynamics
    folder = tmp_path / "progress"
    folder.mkdir()
    identity = dict(seeds=[1, 2], steps=5, quick=True, mstep_steps=None, transformer_steps=None, chain="exact", lr=0.01)
    (folder / "sigma3_sgd.json").write_text(json.dumps(dict(identity, name="sigma3_sgd", seconds=2.5, result={"a": 1})))
    (folder / ".tmp-x").write_text("half")
    got = dynamics.compare_em_progress(str(tmp_path), seeds=(1, 2), steps=5, quick=True)
    assert got == {"sigma3_sgd": {"result": {"a": 1}, "seconds": 2.5}}
    with pytest.raises(ValueError, match="has steps=5 but this run asks for 6"):
        dynamics.compare_em_progress(str(tmp_path), seeds=(1, 2), steps=6, quick=True)
    (folder / "long_chain-seed9-sgd.json").write_text("{}")            # seed 9 is not one of this comparison's
    with pytest.raises(ValueError, match="long_chain-seed9-sgd.json' is not one of compare-em's runs"):
        dynamics.compare_em_progress(str(tmp_path), seeds=(1, 2), steps=5, quick=True)
    assert len(dynamics.compare_em_runs((1, 2, 3, 4, 5))) == 33 and len(dynamics.compare_em_runs((1, 2, 3), True)) == 15
