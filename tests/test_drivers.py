"""The front door of the commands that drive many runs (harness/drivers.py), tried on every driver as the family
conformance test runs over families: each class of hostile input (flags, output paths, cell files, the settings
a directory was made with, a second owner) is refused in one line, exit 2, before any cell trains and with
nothing left behind; and train.py's hop curriculum against --max-hops."""
import json
import os
import sys

import pytest

from harness import compare, drivers, runs
from primitives import chainsteps, depth, depth_sweep, matrix

# the drivers that take a directory of cells: their main, their command, the quick preset's first cell's name
OWNERS = {"matrix": (matrix.main, matrix.COMMAND, lambda: matrix.cells("quick")[0]["name"]),
          "depth": (depth.main, depth.COMMAND, lambda: depth.cells(depth.QUICK["seeds"], depth.QUICK["max_hops"],
                                                                   depth.QUICK["depths"])[0]["name"]),
          "depth_sweep": (depth_sweep.main, depth_sweep.COMMAND,
                          lambda: depth_sweep.grid_cells(depth_sweep.PRESETS["quick"])[0]["name"])}
MAINS = {"matrix": matrix.main, "depth": depth.main, "depth_sweep": depth_sweep.main, "chainsteps": chainsteps.main,
         "compare": compare.main}


@pytest.fixture(autouse=True)
def nothing_trains(monkeypatch):
    """Any cell started by a driver under test fails the test: every case here is refused before work."""
    def trained(*a, **k):
        raise AssertionError("a cell was started")
    monkeypatch.setattr(matrix, "run", trained)
    monkeypatch.setattr(depth_sweep, "run", trained)


def refused(capsys, main, argv, *expected):
    """main(argv) exits 2 with one line `<command>: error: ...` holding each expected text."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def listing(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, dirs, files in os.walk(path) for f in files + dirs)


@pytest.fixture
def place(tmp_path):
    """A folder holding a user's file and a metrics.json of a finished run (compare's input)."""
    (tmp_path / "mine.txt").write_text("a user's file\n")
    os.makedirs(tmp_path / "run")
    json.dump(dict(task="hmm", model="transformer", steps=40, kl_bits=0.1, settings={}, per_position=[]),
              open(tmp_path / "run" / "metrics.json", "w"))
    return tmp_path


FLAGS = [  # (driver, argv, texts the line names); FILE: a user's file, RUN: a finished run
    ("matrix", ["--jobs", "0"], "--jobs 0", "1 to 64"), ("matrix", ["--jobs", "-1"], "--jobs -1"),
    ("matrix", ["--seeds", "-1"], "--seeds -1"), ("matrix", ["--seeds", "1", "1"], "--seeds 1", "twice"),
    ("matrix", ["--out", "FILE"], "--out", "a file, not a directory"),
    ("matrix", ["--out", "FILE/sub"], "--out", "not a directory"),
    ("matrix", ["--out", "a\nb"], "--out", "newline"), ("matrix", ["--figures", "FILE"], "--figures"),
    ("matrix", ["--sweep", "rates", "--seeds", "1", "2"], "one seed"),
    ("depth", ["--jobs", "0"], "--jobs 0"), ("depth", ["--seeds", "-1"], "--seeds -1"),
    ("depth", ["--max-hops", "0"], "--max-hops 0", "1 to 64"), ("depth", ["--max-hops", "-2"], "--max-hops -2"),
    ("depth", ["--out", "FILE"], "--out"), ("depth", ["--figures", "FILE/sub"], "--figures"),
    ("depth_sweep", ["--jobs", "0"], "--jobs 0"), ("depth_sweep", ["--out", "FILE"], "--out"),
    ("depth_sweep", ["--figures", "a\nb"], "--figures"),
    ("chainsteps", ["--seqs", "3"], "--seqs 3", "4 or more"), ("chainsteps", ["--layers", "0"], "--layers 0"),
    ("chainsteps", ["--seeds", "-1"], "--seeds -1"), ("chainsteps", ["--runs", "MISSING"], "does not exist"),
    ("chainsteps", ["--sweep", "FILE"], "--sweep", "a file"),
    ("compare", ["calibration", "RUN", "--out", "x.txt"], "x.txt", "not a figure format"),
    ("compare", ["calibration", "RUN", "--out", "RUN/metrics.json"], ".json", "not a figure format"),
    ("compare", ["calibration", "RUN", "--out", "FILE/x.png"], "its folder", "not a directory"),
    ("compare", ["calibration", "RUN", "--out", "a\nb.png"], "newline"),
]


@pytest.mark.parametrize("driver, argv, texts", [(c[0], c[1], c[2:]) for c in FLAGS],
                         ids=[f"{c[0]}:{' '.join(c[1])}" for c in FLAGS])
def test_flags_and_output_paths_are_checked_before_any_run(capsys, place, driver, argv, texts):
    """Each refused in one line naming the value, exit 2; no cell starts and nothing is written."""
    sub = {"FILE": str(place / "mine.txt"), "RUN": str(place / "run"), "MISSING": str(place / "nowhere")}
    argv = [next((v + a[len(k):] for k, v in sub.items() if a.startswith(k)), a) for a in argv]
    if driver in OWNERS and "--out" not in argv:
        argv += ["--out", str(place / "cells")]
    before = listing(place)
    refused(capsys, MAINS[driver], ["--preset", "quick", *argv] if driver in OWNERS else argv, *texts)
    assert listing(place) == before


def truncated(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write('{"task": "hops", "mod')


@pytest.mark.parametrize("driver", OWNERS)
def test_a_cell_holding_another_tasks_run_is_named_before_any_trains(capsys, tmp_path, monkeypatch, driver):
    """The first cell's directory holds a finished run of another task: one line naming it, exit 2, the lock
    released (a second try is refused the same way, not as busy)."""
    main, _, first = OWNERS[driver]
    monkeypatch.undo()                                   # the runner itself reads the cells (nothing trains)
    cell = tmp_path / "cells" / first()
    os.makedirs(cell)
    json.dump(dict(task="recall", model="lstm", steps=1, kl_bits=0.1), open(cell / "metrics.json", "w"))
    for _ in range(2):
        refused(capsys, main, ["--preset", "quick", "--out", str(tmp_path / "cells")], "holds a run of recall, lstm")
    assert not os.path.exists(tmp_path / "cells" / runs.LOCK)


def test_a_truncated_metrics_file_is_named_and_its_cell_trained_again(tmp_path, monkeypatch):
    """matrix.run (every driver's runner): a cell whose metrics.json was cut off is not finished: the log names
    the file and what is wrong, and the cell trains again; it is never marked failed for it."""
    monkeypatch.undo()
    few = matrix.cells("quick")[:1]
    run_dir = str(tmp_path / few[0]["name"])
    truncated(os.path.join(run_dir, "metrics.json"))
    code = (f"import json, os; json.dump(dict(kl_bits=0.1, prior_kl_bits=2.0, params=10, steps=60, task='bijection', "
            f"model='transformer'), open(os.path.join({run_dir!r}, 'metrics.json'), 'w'))")
    monkeypatch.setattr(matrix, "argv", lambda *a, **k: [sys.executable, "-c", code])
    lines = []
    results = matrix.run("quick", str(tmp_path), todo=few, log=lines.append)
    assert any("metrics.json is truncated or not JSON: trained again" in line for line in lines)
    assert results[few[0]["name"]]["kl_bits"] == 0.1 and not os.path.exists(run_dir + ".failed")


def test_every_cell_file_reader_names_the_file_and_never_raises(tmp_path):
    """read_metrics: none -> (None, None); truncated, a JSON list, a summary without a run's keys, bytes that are
    not UTF-8 -> (None, one line naming the file)."""
    assert drivers.read_metrics(str(tmp_path / "none")) == (None, None)
    cases = {"cut": '{"task": "x', "list": "[1, 2]", "summary": '{"claims": {}}', "bytes": b"\xff\xfe{"}
    for name, text in cases.items():
        path = tmp_path / name / "metrics.json"
        os.makedirs(path.parent)
        (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
        m, problem = drivers.read_metrics(str(path.parent))
        assert m is None and str(path) in problem and "\n" not in problem, (name, problem)


def test_a_truncated_summary_or_checkpoint_is_one_line(capsys, tmp_path):
    """chainsteps --sweep over a cut-off depth-sweep.json, compare over a JSON list and over a summary, matrix
    over a cell whose checkpoint (its only record of the rate it trained at) is cut off."""
    truncated(str(tmp_path / "sweep" / "depth-sweep.json"))
    refused(capsys, chainsteps.main, ["--sweep", str(tmp_path / "sweep")], "depth-sweep.json is truncated")
    (tmp_path / "list.json").write_text("[1, 2]")
    refused(capsys, compare.main, ["calibration", str(tmp_path / "list.json"), "--out", str(tmp_path / "a.png")],
            "not a run's metrics.json")
    cell = dict(task="recall", family="ssm", layers=None, seed=0, name="recall-ssm-s0")
    os.makedirs(tmp_path / "m" / cell["name"])
    json.dump(dict(task="recall", model="ssm", steps=4000, kl_bits=0.1), open(tmp_path / "m" / cell["name"] / "metrics.json", "w"))
    (tmp_path / "m" / cell["name"] / "checkpoint.npz").write_bytes(b"PK\x03\x04 cut")
    with pytest.raises(drivers.Refused, match="checkpoint.npz cannot be read"):
        matrix.finished(str(tmp_path / "m" / cell["name"]), cell, "default")


SETTINGS = [  # (driver, the record's settings, argv of the rerun, the setting named)
    ("matrix", dict(preset="default", sweep=None), ["--preset", "quick"], "preset 'default' (now 'quick')"),
    ("matrix", dict(preset="default", sweep=None), ["--sweep", "rates"], "sweep None (now 'rates')"),
    ("depth", dict(preset="quick", max_hops=2), ["--preset", "quick", "--max-hops", "3"], "max_hops 2 (now 3)"),
    ("depth", dict(preset="default", max_hops=2), ["--preset", "quick"], "preset 'default' (now 'quick')"),
    ("depth_sweep", dict(preset="default"), ["--preset", "quick"], "preset 'default' (now 'quick')"),
]


@pytest.mark.parametrize("driver, made, argv, named", SETTINGS, ids=[f"{c[0]}:{' '.join(c[2])}" for c in SETTINGS])
def test_a_rerun_with_other_settings_is_refused(capsys, tmp_path, driver, made, argv, named):
    """A directory remembers the settings it was made with (driver.json): every setting that changes a cell,
    changed on a rerun, is refused in one line naming it and --overwrite; the directory is left as it was."""
    main, command, _ = OWNERS[driver]
    out = tmp_path / "cells"
    os.makedirs(out)
    json.dump(dict(command=command, settings=made, cells=[], summaries=[]), open(out / drivers.RECORD, "w"))
    before = listing(out)
    refused(capsys, main, [*argv, "--out", str(out)], named, "--overwrite")
    assert listing(out) == before


@pytest.mark.parametrize("driver", OWNERS)
def test_a_directory_another_command_made_is_refused_even_with_overwrite(capsys, tmp_path, driver):
    main, command, _ = OWNERS[driver]
    other = next(c for d, (_, c, _) in OWNERS.items() if d != driver)
    os.makedirs(tmp_path / "cells")
    json.dump(dict(command=other, settings={}, cells=[], summaries=[]), open(tmp_path / "cells" / drivers.RECORD, "w"))
    refused(capsys, main, ["--preset", "quick", "--out", str(tmp_path / "cells"), "--overwrite"], other)


def test_overwrite_removes_only_what_the_command_wrote(tmp_path):
    """A record naming cell "a" and summary "s.json": --overwrite with other settings removes a/, a.log,
    a.failed and s.json, keeps a user's file and a cell the record does not name, and records the new settings."""
    out = tmp_path / "d"
    os.makedirs(out / "a")
    os.makedirs(out / "b")
    for name in ("a.log", "a.failed", "s.json", "mine.txt"):
        (out / name).write_text("x")
    json.dump(dict(command="c", settings=dict(preset="default"), cells=["a"], summaries=["s.json"]),
              open(out / drivers.RECORD, "w"))
    with pytest.raises(drivers.Refused, match="was made with preset 'default' \\(now 'quick'\\)"):
        drivers.take(str(out), "c", dict(preset="quick"))
    drivers.take(str(out), "c", dict(preset="quick"), overwrite=True)
    runs.release(str(out))
    assert listing(out) == ["b", drivers.RECORD, "mine.txt"]
    assert json.load(open(out / drivers.RECORD))["settings"] == dict(preset="quick")
    drivers.take(str(out), "c", dict(preset="quick"))                  # the same settings: taken again
    runs.release(str(out))


@pytest.mark.parametrize("driver", OWNERS)
def test_one_owner_a_second_command_refuses_and_leaves_nothing(capsys, tmp_path, driver):
    """The directory's lock is held (here by this process, as a first command would): the second command is
    refused in one line, writes no record, and the first's lock stays."""
    main, _, _ = OWNERS[driver]
    out = str(tmp_path / "cells")
    os.makedirs(out)
    runs.acquire(out, "a first command")
    try:
        refused(capsys, main, ["--preset", "quick", "--out", out], "in use by another run", "a first command")
        assert sorted(os.listdir(out)) == [runs.LOCK]
    finally:
        runs.release(out)


def test_a_new_directory_taken_holds_the_record_and_the_lock_only(tmp_path):
    out = tmp_path / "new"
    drivers.take(str(out), "c", dict(preset="quick"))
    assert listing(out) == [runs.LOCK, drivers.RECORD]
    runs.release(str(out))
    assert listing(out) == [drivers.RECORD]


def test_the_hop_curriculum_beyond_max_hops_is_refused_where_typed():
    """train.py: a typed --hop-curriculum stage beyond --max-hops is one line (it used to train, clipped); the
    preset's own curriculum under a smaller typed --max-hops is the preset's, clipped as before."""
    from harness import flags
    with pytest.raises(SystemExit) as e:
        flags.parse_args(["--task", "hops", "--max-hops", "2", "--hop-curriculum", "3:10", "--preset", "quick"])
    assert e.value.code == 2
    assert flags.parse_args(["--task", "hops", "--max-hops", "3"]).settings["hop_curriculum"] == "1:1500,2:2500,4:3500"
