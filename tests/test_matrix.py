"""primitives/matrix.py: the score and the marks (every branch of the rule), the cells and their command lines, and the
runner's skip, resume and progress logic (on stand-in cells that write a metrics.json without training; CI's
smoke test, `python -m primitives.matrix --preset quick`, trains them)."""
import json
import os
import sys

import numpy as np
import pytest

from harness import drivers
from primitives import matrix
import models
from tunnels import tasks


def test_the_score_is_the_share_of_the_uniform_predictors_kl_closed():
    """KL 0.1 bits against the uniform predictor's 2.0: 1 - 0.1 / 2 = 0.95 (the inverted ratio would give -19,
    the KL alone 0.1)."""
    assert matrix.score(dict(kl_bits=0.1, prior_kl_bits=2.0)) == pytest.approx(0.95)
    assert matrix.score(dict(kl_bits=3.0, prior_kl_bits=2.0)) == pytest.approx(-0.5)   # worse than uniform
    with pytest.raises(ValueError, match="lacks prior_kl_bits"):
        matrix.score(dict(kl_bits=0.1))


@pytest.mark.parametrize("s, expected", [(1.0, "✓"), (0.95, "✓"), (0.9499, "~"), (0.5, "~"), (0.4999, "✗"),
                                         (-0.2, "✗")])
def test_marks_at_their_thresholds(s, expected):
    assert matrix.mark(s) == expected


def test_a_cell_whose_seeds_disagree_is_split():
    assert matrix.verdict([0.97, 0.99]) == "✓" and matrix.verdict([0.6, 0.7]) == "~"
    assert matrix.verdict([0.97, 0.9]) == "split (✓/~)" and matrix.verdict([0.3, 0.96]) == "split (✗/✓)"


def test_cells_are_compared_with_the_authors_figure_where_it_has_them():
    assert matrix.against_authors("lstm", "hmm", "✗") == "agrees"
    assert matrix.against_authors("ssm", "recall", "✓") == "disagrees"          # their "~"
    assert matrix.against_authors("transformer", "bijection", "split (✓/~)") == "split"     # neither
    assert matrix.against_authors("ssm", "recall", "~ (~/✗/~)") == "agrees"           # a majority's mark
    assert matrix.against_authors("ssm", "recall", "✗ (✗/✗/~)") == "disagrees"
    assert matrix.against_authors("prefix-mlp", "hmm", "✗") is None             # not in their figure
    assert matrix.against_authors("transformer", "sawtooth", "✓") is None       # nor is the sawtooth


def test_the_cells_of_each_preset():
    n_t, n_f = len(matrix.PRIMITIVE), len(models.FAMILIES)
    # every task but the depth experiment's
    assert set(matrix.PRIMITIVE) == set(tasks.TASKS) - {"hops"}
    quick, default = matrix.cells("quick"), matrix.cells("default")
    assert len(quick) == n_t * n_f and {c["seed"] for c in quick} == {0} and not any(c["layers"] for c in quick)
    # depth rows at 1, 2, 4 layers but the preset's own (bijection 3: none; sawtooth and recall 2; the HMM and
    # transport 4)
    assert len(default) == 2 * (n_t * n_f + 3 + 2 + 2 + 2 + 2)
    names = {c["name"] for c in default}
    assert len(names) == len(default) and "hmm-transformer-L2-s1" in names
    assert "sawtooth-transformer-L2-s0" not in names and "hmm-transformer-L4-s0" not in names


def test_a_cells_command_line(tmp_path):
    cell = lambda fam, task="hmm", layers=None: dict(task=task, family=fam, layers=layers, seed=1, name="x")
    d = str(tmp_path / "x")
    a = matrix.argv(cell("lstm"), "default", d, (213_445, 64))
    assert a[a.index("--params") + 1] == "213445" and "--soft" in a and a[a.index("--seed") + 1] == "1"
    assert a[a.index("--threads") + 1] == "1" and "--resume" not in a and "--overwrite" not in a
    a = matrix.argv(cell("transformer", "recall"), "default", d, (109_600, 64))
    assert "--params" not in a and "--soft" not in a                         # its own preset is the target
    a = matrix.argv(cell("transformer", "recall", 4), "default", d, (109_600, 64))
    assert (a[a.index("--layers") + 1], a[a.index("--width") + 1]) == ("4", "64") and "--params" not in a
    assert "--params" not in matrix.argv(cell("ssm"), "quick", d)           # quick: the families' own sizes
    os.makedirs(d)
    assert "--overwrite" in matrix.argv(cell("ssm"), "quick", d)            # stopped before its first checkpoint
    open(os.path.join(d, "checkpoint.npz"), "w").close()
    assert "--resume" in matrix.argv(cell("ssm"), "quick", d)


def test_the_runner_skips_finished_cells_and_reports_each(tmp_path, monkeypatch):
    """Stand-in cells (a command that writes metrics.json: KL 0.1 of 2.0 bits) instead of train.py: a cell
    finished before is not run again; every other one gets a progress line with its score."""
    few = matrix.cells("quick")[:3]
    monkeypatch.setattr(matrix, "cells", lambda preset, seeds=None: few)
    ran = []

    def fake_argv(cell, preset, run_dir, size=None):
        ran.append(cell["name"])
        code = (f"import json, os; os.makedirs({run_dir!r}, exist_ok=True); json.dump(dict(kl_bits=0.1, "
                f"prior_kl_bits=2.0, params=10, steps=60, task='bijection', model={cell['family']!r}), "
                f"open(os.path.join({run_dir!r}, 'metrics.json'), 'w'))")
        return [sys.executable, "-c", code]
    monkeypatch.setattr(matrix, "argv", fake_argv)
    out = tmp_path / "m"
    os.makedirs(out / few[0]["name"])
    json.dump(dict(kl_bits=1.0, prior_kl_bits=2.0, params=10, steps=60, task="bijection", model="transformer"),
              open(out / few[0]["name"] / "metrics.json", "w"))
    lines = []
    results = matrix.run("quick", str(out), jobs=2, log=lines.append)
    assert ran == [c["name"] for c in few[1:]] and set(results) == {c["name"] for c in few}
    assert lines[0].startswith("matrix (quick): 3 cells, 1 finished before, 2 to train, 2 at a time")
    assert sum("score 0.950" in line for line in lines) == 2
    rows = matrix.table(results, "quick")
    assert [r["verdict"] for r in rows] == ["~", "✓", "✓"] and rows[0]["score"] == [0.5]
    json.dump(dict(kl_bits=1.0, prior_kl_bits=2.0, steps=60, task="bijection", model="lstm"),
              open(out / few[1]["name"] / "metrics.json", "w"))                # another run in a cell's place
    with pytest.raises(drivers.Refused, match="holds a run of bijection, lstm, 60 steps, not this cell.s"):
        matrix.run("quick", str(out), log=lines.append)


def test_a_finished_cell_trained_at_another_rate_is_refused(tmp_path, monkeypatch):
    """A cell's metrics.json records the optimizer's settings: the same as the preset's today is finished; a
    learning rate the preset no longer gives (a tuning changed since) is refused in one line; a record
    without them (and no checkpoint) is not checked."""
    from harness import flags
    cell = dict(task="recall", family="ssm", layers=None, seed=0, name="recall-ssm-s0")
    run_dir = tmp_path / cell["name"]
    run_dir.mkdir()
    now = matrix.optimizer_wanted(cell, "default", str(run_dir))
    assert set(now) == set(flags.OPTIMIZER) and now["lr"] == 1e-2 and now["warmup"] == 100   # mamba.TUNED's recall
    base = dict(kl_bits=0.1, prior_kl_bits=2.0, steps=4000, task="recall", model="ssm")
    for optimizer, ok in ((now, True), ({**now, "lr": 3e-3}, False), ({**now, "warmup": 300}, False), (None, True)):
        json.dump({**base, **({"optimizer": optimizer} if optimizer else {})}, open(run_dir / "metrics.json", "w"))
        if ok:
            assert matrix.finished(str(run_dir), cell, "default")["kl_bits"] == 0.1
        else:
            refused = "was trained with --(lr 0.003|warmup 300), not this cell's (0.01|100)"
            with pytest.raises(drivers.Refused, match=refused):
                matrix.finished(str(run_dir), cell, "default")
    # a run from before the record: its checkpoint's meta says what it was trained with
    from harness import checkpoints
    (run_dir / "checkpoint.npz").write_bytes(b"")
    monkeypatch.setattr(checkpoints, "load_checkpoint", lambda path: (None, None, {**now, "lr": 3e-3, "seed": 0}, None))
    with pytest.raises(drivers.Refused, match="was trained with --lr 0.003, not this cell.s 0.01"):
        matrix.finished(str(run_dir), cell, "default")


def test_a_failing_cell_is_recorded_and_not_retried(tmp_path, monkeypatch):
    """A cell that fails (exit 1) is reported, the matrix goes on, and a marker keeps a rerun from repeating it
    (delete the marker to try again)."""
    few_one = [dict(task="bijection", family="mlp", layers=None, seed=0, name="bijection-mlp-s0")]
    monkeypatch.setattr(matrix, "cells", lambda preset, seeds=None: few_one)
    calls = []
    monkeypatch.setattr(matrix, "argv", lambda *a, **k: calls.append(1) or [sys.executable, "-c", "raise SystemExit(1)"])
    lines = []
    results = matrix.run("quick", str(tmp_path), log=lines.append)
    assert results == {"bijection-mlp-s0": {"failed": f"exit code 1, see {tmp_path / 'bijection-mlp-s0'}.log"}}
    assert lines[-1].startswith("bijection-mlp-s0: failed: exit code 1")
    assert matrix.run("quick", str(tmp_path), log=lines.append) == results and calls == [1]
    assert matrix.table(results, "quick")[0]["verdict"] == "failed"


def test_the_capacity_points_and_the_sweep_cells():
    """64 pairs: keys 2 x 64 = 128, the curriculum's stages below 64, 2,500 steps past the last (4,500)."""
    assert matrix.capacity_flags(64) == ["--pairs", "64", "--keys", "128", "--steps", "7000", "--recall-curriculum",
                                         "2:500,4:1500,8:2500,16:3500,32:4500"]
    assert matrix.capacity_flags(4) == ["--pairs", "4", "--keys", "32", "--steps", "4000", "--recall-curriculum", "2:500"]
    cells = matrix.sweep_cells("capacity")
    assert len(cells) == len(matrix.CAPACITY_PAIRS) * len(models.FAMILIES)
    t = next(c for c in cells if c["name"] == "recall-transformer-pairs16-s0")
    a = matrix.argv(t, "default", "/nonexistent/x", (109_600, 64))
    assert a[a.index("--params") + 1] == "109600" and a[a.index("--pairs") + 1] == "16"   # the transformer matched too
    assert [c["point"] for c in matrix.sweep_cells("filler")][::len(models.FAMILIES)] == ["fixed0", "fixed8",
                                                                                          "fixed32", "fixed128"]
    assert matrix.sweep_cells("filler")[-1]["flags"] == ["--filler", "128", "--filler-fixed"]
    assert matrix.FILLER_SEEDS == (0, 1, 2)          # three seeds a point: the distance claim's


def test_a_run_is_flat_when_its_last_tenth_neither_falls_nor_rises(tmp_path):
    """Excess loss per step: falling from 1.0 to 0.0 over 100 steps: the last tenth's mean (0.045) is 0.1 below
    the tenth before's: not flat. Constant 0.1: flat. 0.105 then 0.1 (0.005, under 0.01): flat. Rising from
    0.5 to 0.6 (20%): not flat. Noisy around 0.3 (sd 0.1: the difference's standard error 0.045, the move 0.04):
    flat; the same noise around a fall of 0.2: not flat."""
    def log(excess):
        path = tmp_path / "log.csv"
        with open(path, "w") as f:
            f.write("step,loss_bits,bayes_loss_bits,lr,grad_norm,seconds\n")
            for i, e in enumerate(excess):
                f.write(f"{i + 1},{2.0 + e},2.0,0.001,1.0,{i}\n")
        return str(path)
    assert not matrix.flat(log(np.linspace(1.0, 0.0, 100)))
    assert matrix.flat(log(np.full(100, 0.1)))
    assert matrix.flat(log(np.r_[np.full(90, 0.105), np.full(10, 0.1)]))
    assert not matrix.flat(log(np.r_[np.full(90, 0.5), np.full(10, 0.6)]))
    noise = np.tile([0.1, -0.1], 50)
    assert matrix.flat(log(0.3 + noise + np.r_[np.zeros(90), np.full(10, -0.04)]))
    assert not matrix.flat(log(0.5 + noise + np.r_[np.zeros(90), np.full(10, -0.2)]))
    assert not matrix.flat(log(np.full(15, 0.1)))                         # too short to tell


def test_a_family_that_cannot_be_sized_sits_the_point_out(tmp_path):
    log = str(tmp_path / "cell.log")
    with open(log, "w") as f:
        f.write("train.py: error: --params 5: an old attempt\n")
        offset = f.tell()
        f.write("something\ntrain.py: error: --params 109600: no width of prefix-mlp gives it (closest 300,000)\n")
    assert matrix.sits_out(log, 2, offset) == "--params 109600: no width of prefix-mlp gives it (closest 300,000)"
    assert matrix.sits_out(log, 1, offset) is None                       # another failure: an error, not this
    with open(log, "a") as f:
        offset = f.tell()
        f.write("train.py: error: --lr -1: ...\n")
    assert matrix.sits_out(log, 2, offset) is None                       # only this attempt's lines count
    rows = matrix.table({"bijection-mlp-s0": {"sits_out": "why"}}, "quick")
    assert rows == [dict(task="bijection", family="mlp", layers=None, params=0, steps=0, kl=[], score=[],
                         sits_out="why", floor=None, verdict="sits out", authors=None, agreement=None)]


def test_state_sizes_by_hand():
    """Width 64, 2 layers, T = 48, vocabulary 68: the transformer's keys and values 2 x 2 x 64 x 48 = 12,288
    (growing with T); the LSTM's h and c 2 x 2 x 64 = 256; the SSM's scan state and convolution window
    2 x (128 x 16 + 3 x 128) = 4,864 (without the window: 4,096); the prefix MLP's grid 48 x 68 = 3,264; the
    authors' MLP none."""
    cfg = lambda n: models.make_config(n, vocab_size=68, n_classes=32, max_len=48, d_model=64, n_layers=2)
    got = {n: models.state_floats(n, cfg(n), 48) for n in ("transformer", "lstm", "ssm", "prefix-mlp", "mlp")}
    assert got == {"transformer": 12_288, "lstm": 256, "ssm": 4_864, "prefix-mlp": 3_264, "mlp": 0}


def test_the_sweep_figure_is_drawn_with_a_family_sitting_out(tmp_path):
    from harness import plots
    rows = [dict(family="lstm", point=f"pairs{p}", score=s, flat=c, state_floats=256, pairs=p, answered=a)
            for p, s, c, a in ((4, 0.99, True, 4.0), (8, 0.7, False, 5.5))]
    rows.append(dict(family="prefix-mlp", point="pairs8", sits_out="no width"))
    path = plots.plot_sweep(rows, str(tmp_path / "s.png"), "capacity", {"pairs4": 1.2, "pairs8": 1.6})
    assert os.path.exists(path)
    filler = [dict(r, point=r["point"].replace("pairs", "filler"), pairs=8) for r in rows]
    assert os.path.exists(plots.plot_sweep(filler, str(tmp_path / "f.png"), "filler", {"filler4": 1.6, "filler8": 1.6}))


def test_learning_curves_read_each_cells_log(tmp_path):
    """Two cells' log.csv (batch 8): 10 rows each, averaged over windows of 5: sequences seen at each window's
    last step x 8; the KL estimate the mean of loss - Bayes over the window."""
    from harness import plots
    c0, c1 = matrix.cells("quick")[:2]
    for c, gap in ((c0, 0.5), (c1, 0.25)):
        os.makedirs(tmp_path / c["name"])
        with open(tmp_path / c["name"] / "log.csv", "w") as f:
            f.write("step,loss_bits,bayes_loss_bits,lr,grad_norm,seconds\n")
            for i in range(10):
                f.write(f"{i + 1},{1.0 + gap * (i < 5)},1.0,0.001,1.0,{i}\n")
    results = {c0["name"]: dict(batch=8), c1["name"]: dict(batch=8)}
    curves = matrix.learning_curves(results, str(tmp_path), "quick", points=2)
    assert curves == {c0["task"]: {c0["family"]: ([40.0, 80.0], [0.5, 0.0]), c1["family"]: ([40.0, 80.0], [0.25, 0.0])}}
    assert os.path.exists(plots.plot_learning_curves(curves, str(tmp_path / "c.png")))


def write_log(path, last_tenth_drop):
    """A cell's log.csv of 100 steps whose excess loss drops by last_tenth_drop bits over its last tenth."""
    os.makedirs(path, exist_ok=True)
    excess = 0.3 + np.r_[np.zeros(90), np.full(10, -last_tenth_drop)]
    with open(os.path.join(path, "log.csv"), "w") as f:
        f.write("step,loss_bits,bayes_loss_bits\n")
        f.writelines(f"{i + 1},{1.0 + e},1.0\n" for i, e in enumerate(excess))


def test_every_cell_whose_loss_still_falls_gets_a_4x_run_whatever_its_mark(tmp_path):
    """--confirm: three seeds for every cell (CONFIRM_SEEDS), and a seed-0 run of 4x the steps (4 x 3,000 on the
    HMM) for every cell, depth rows too, whose loss is not flat in some seed: here the LSTM (one seed of three
    still falling; its cross agrees with the authors, which plays no part) and the 2-layer row; the MLP, flat
    in every seed, gets none; a cell that failed in every seed has no log to read and gets none."""
    assert matrix.CONFIRM_SEEDS == (0, 1, 2)
    m = lambda kl: dict(kl_bits=kl, prior_kl_bits=0.4, params=213_813, steps=3000)
    results = {}
    for c in matrix.cells("default", matrix.CONFIRM_SEEDS):
        if c["task"] != "hmm":
            continue
        if c["family"] == "ssm":
            results[c["name"]] = {"failed": "exit code 1"}
            continue
        results[c["name"]] = m(0.3)
        falls = (c["family"] == "lstm" and c["seed"] == 2) or c["layers"] == 2
        write_log(tmp_path / c["name"], 0.2 if falls else 0.0)
    extra = matrix.longer_runs(results, str(tmp_path), "default", matrix.CONFIRM_SEEDS)
    assert [c["name"] for c in extra] == ["hmm-lstm-4x-s0", "hmm-transformer-L2-4x-s0"]
    assert extra[0]["flags"] == ["--steps", "12000"] and extra[0]["x4"] and extra[1]["layers"] == 2
    results["hmm-lstm-4x-s0"] = m(0.004)
    row = next(r for r in matrix.table(results, "default", matrix.CONFIRM_SEEDS, extra) if r["family"] == "lstm")
    assert len(row["score"]) == 3 and row["verdict"] == "✗" and row["agreement"] == "agrees"
    assert row["score_4x"] == pytest.approx(0.99) and row["mark_4x"] == "✓" and row["budget"] == "budget-limited"
    assert "4x the steps: 0.990 vs uniform" in matrix.lines([row])[-1]
    # a failed 4x run is left out of the table instead of stopping it
    results["hmm-lstm-4x-s0"] = {"failed": "a non-finite loss"}
    row = next(r for r in matrix.table(results, "default", matrix.CONFIRM_SEEDS, extra) if r["family"] == "lstm")
    assert "score_4x" not in row and "budget" not in row


def test_the_4x_run_reads_the_budget_apart_from_the_verdict():
    assert matrix.budget_reading("✗", "~") == "budget-limited"
    assert matrix.budget_reading("~", "~") == "not the budget"
    assert matrix.budget_reading("~", "✗") == "not the budget"
    assert matrix.budget_reading("split (~/✗)", "✓") == "budget-limited"      # better than every seed's mark
    assert matrix.budget_reading("split (~/✗)", "~") == "not the budget"
    assert matrix.budget_reading("✗ (✗/✗/~)", "~") == "budget-limited"
    assert matrix.cell_mark("✓ (✓/✓/✗)") == "✓" and matrix.cell_mark("split (✓/✗)") is None


def test_the_share_of_the_shortcuts_gap_closed_by_hand():
    """The HMM's shortcut scores 0.924: a model at 0.96 closes (0.96 - 0.924) / (1 - 0.924) = 0.4737 of what it
    leaves (not 0.96, the score against uniform, nor 0.036, the difference); no shortcut: the score itself."""
    assert matrix.closed(0.96, 0.924) == pytest.approx(0.036 / 0.076)
    assert matrix.closed(0.6, None) == 0.6 and matrix.closed(0.924, 0.924) == 0.0
    assert matrix.closed(0.9, 0.924) < 0                                 # below the shortcut


@pytest.mark.parametrize("s, floor, expected", [(0.96, None, "✓"), (0.96, 0.924, "✗"), (0.965, 0.924, "~"),
                                                (0.9963, 0.924, "✓"), (0.9961, 0.924, "~"), (0.7201, 0.44, "~"),
                                                (0.7199, 0.44, "✗"), (0.45, 0.44, "✗"), (0.6, None, "~")])
def test_a_mark_reads_the_share_of_the_shortcuts_gap_with_one_threshold(s, floor, expected):
    """One threshold for every column, on the closed share: 0.96 is a check against uniform and a cross on the
    HMM, whose shortcut already scores 0.924 (it closes 0.47 of what that leaves); a check there asks for
    0.924 + 0.95 x 0.076 = 0.9962; a ~ on recall (shortcut 0.44) for 0.44 + 0.5 x 0.56 = 0.72."""
    assert matrix.mark(s, floor) == expected


def test_effective_memory_in_the_table_by_hand():
    """Window filters' KL 0.5, 0.3, 0.2 at k = 0, 1, 2: a seed at KL 0.4 sits halfway between k = 0 and 1 on
    the log2(1 + k) axis, k = 2^0.5 - 1 = 0.4142 (linear in k would say 0.5); at 0.25, halfway from 1 to 2,
    k = 2^((1 + log2 3) / 2) - 1 = 1.4495; at 0.6 below the memoryless filter, at 0.1 past the longest."""
    steps = {0: 0.5, 1: 0.3, 2: 0.2}
    m = lambda kl: dict(kl_bits=kl, prior_kl_bits=0.8, params=1, steps=40)
    results = {"transport-lstm-s0": m(0.4), "transport-lstm-s1": m(0.25), "transport-ssm-s0": m(0.6),
               "transport-ssm-s1": m(0.1), "hmm-lstm-s0": m(0.1), "hmm-lstm-s1": m(0.1)}
    rows = {(r["task"], r["family"]): r for r in matrix.table(results, "quick", (0, 1), memory={"transport": steps})}
    assert rows["transport", "lstm"]["memory"] == pytest.approx([2 ** 0.5 - 1, 2 ** ((1 + np.log2(3)) / 2) - 1])
    assert rows["transport", "lstm"]["memory_where"] == ["within", "within"]
    assert rows["transport", "ssm"]["memory_where"] == ["below", "above"]
    assert "memory" not in rows["hmm", "lstm"]
    assert matrix.memory_text(rows["transport", "ssm"]) == "k < 0 / >= 2"


def test_three_seeds_decide_by_majority_and_an_even_split_stays_split():
    assert matrix.verdict([0.96, 0.97, 0.6]) == "✓ (✓/✓/~)"
    assert matrix.verdict([0.96, 0.6, 0.3]) == "split (✓/~/✗)"
    assert matrix.verdict([0.96, 0.97, 0.6, 0.6]) == "split (✓/✓/~/~)"


def test_scores_are_shown_cut_not_rounded():
    assert matrix.shown(0.9496) == "0.949" and matrix.mark(0.9496) == "~" and matrix.shown(0.95) == "0.950"


def test_the_shortcuts_by_hand():
    """recall: stored pairs (1 -> 0), (2 -> 3); a query of key 1 gets the stored values' proportions (1/2 on
    0 and on 3: KL 1 bit against the one-hot posterior), an unstored key the prior. The sawtooth (V = 4):
    pairs (1, 2), (3, 0), then key 1 again gets the seen values {0, 2} evenly, a new key the unseen {1, 3}.
    The HMM with every row of P the same (its stationary distribution that row, uniform): E's column of the
    observation, normalised."""
    from tunnels import hmm
    from tunnels import recall
    from tunnels import sawtooth
    s = dict(n_keys=4, n_values=4)
    STORE, SEP, QUERY, FILL = recall.tokens_of(4, 4)
    tok = np.array([[STORE, 1, SEP, 4 + 0, STORE, 2, SEP, 4 + 3, QUERY, 1, QUERY, 3]])
    mask = np.zeros((1, 12))
    mask[0, [9, 11]] = 1
    q = recall.shortcut(dict(tokens=tok, mask=mask), s)
    assert q[0, 9].tolist() == [0.5, 0, 0, 0.5] and q[0, 11].tolist() == [0.25] * 4
    tok = np.array([[1, 2, 3, 0, 1, 2, 2]])
    mask = np.zeros((1, 7))
    mask[0, [4, 6]] = 1
                                                                    # position 6: key 2, new
    q = sawtooth.shortcut(dict(tokens=tok, mask=mask), {"V": 4})
    assert q[0, 4].tolist() == [0.5, 0, 0.5, 0] and q[0, 6].tolist() == [0, 0.5, 0, 0.5]
    r = np.array([0.6, 0.1, 0.1, 0.1, 0.1])
    P = np.tile(r, (5, 1))                       # every row r: the marginal is uniform at t = 0, r from t = 1
    E = np.array([[0.6, 0.1, 0.1, 0.1, 0.1]] + [[0.05, 0.3, 0.25, 0.2, 0.2]] * 4)
    tokens = hmm.tokens_of(P, E, np.array([0, 1, 1]))[None]
    q = hmm.shortcut(dict(tokens=tokens))
    np.testing.assert_allclose(q[0, hmm.HEADER], E[:, 0] / E[:, 0].sum(), atol=1e-12)     # (0.6, .05 x 4) / 0.8
    np.testing.assert_allclose(q[0, hmm.HEADER], [0.75] + [0.0625] * 4, atol=1e-12)       # (the stationary r
    np.testing.assert_allclose(q[0, hmm.HEADER + 1], r * E[:, 1] / (r * E[:, 1]).sum(), atol=1e-12)  # would give
    np.testing.assert_allclose(q[0, hmm.HEADER + 1], [0.06 / 0.18] + [0.03 / 0.18] * 4, atol=1e-12)  # 0.947 at t 0)
    np.testing.assert_allclose(q[0, hmm.HEADER + 2], q[0, hmm.HEADER + 1], atol=1e-12)


def test_a_window_as_long_as_the_sequence_is_the_exact_filter_and_a_window_of_one_by_hand():
    from tunnels import hmm
    rng = np.random.default_rng(0)
    b = hmm.batch(rng, 3, n_obs=6)
    np.testing.assert_allclose(hmm.window_filter(b, 6)[:, hmm.HEADER:], b["posterior"][:, hmm.HEADER:], atol=1e-9)
    # k = 1 at t = 2: start from the marginal of s_1 (u P), take o_1, step through P, take o_2
    P, E, obs = hmm.detokenize(b["tokens"][0])
    m1 = np.full(5, 0.2) @ P
    x = m1 * E[:, obs[1]]
    x = (x / x.sum()) @ P * E[:, obs[2]]
    np.testing.assert_allclose(hmm.window_filter(b, 1)[0, hmm.HEADER + 2], x / x.sum(), atol=1e-12)
    assert not np.allclose(hmm.window_filter(b, 1)[0, hmm.HEADER + 2], b["posterior"][0, hmm.HEADER + 2])
    # the shortcut carries nothing: at t = 1 it is (u P)(s) E[s, o_1] normalised, not the filter
    m1 = np.full(5, 0.2) @ P
    np.testing.assert_allclose(hmm.shortcut(b)[0, hmm.HEADER + 1], m1 * E[:, obs[1]] / (m1 * E[:, obs[1]]).sum(),
                               atol=1e-12)
    assert not np.allclose(hmm.shortcut(b)[0, hmm.HEADER + 1], b["posterior"][0, hmm.HEADER + 1])


def test_row_labels_and_the_primitives_figure_with_a_depth_row_that_is_the_preset(tmp_path):
    from harness import plots
    assert [plots.row_label("transformer", L) for L in (None, 1, 4)] == ["transformer", "transformer, 1 layer",
                                                                          "transformer, 4 layers"]
    rows = [dict(task="recall", family="transformer", layers=None, score=[0.99, 0.98], closed=[0.98, 0.96],
                 verdict="✓", authors="✓", score_4x=0.999, closed_4x=0.998, mark_4x="✓", floor=0.44),
            dict(task="recall", family="transformer", layers=1, score=[0.2, 0.1], closed=[-0.4, -0.6], verdict="✗"),
            dict(task="bijection", family="transformer", layers=2, score=[0.99, 0.99], closed=[0.99, 0.99],
                 verdict="✓"),
            dict(task="transport", family="lstm", layers=None, score=[0.9, 0.8], closed=[0.86, 0.72], verdict="~",
                 memory=[5.6, 3.1], memory_where=["within", "within"])]
    path = plots.plot_primitives(rows, str(tmp_path / "p.png"), 0.95, 0.5, matrix.PRIMITIVE, {"recall": 0.44},
                                 {"recall": 2, "bijection": 3})
    assert os.path.exists(path)


def test_the_pairs_answered_and_the_shortcuts_by_hand():
    """Accuracy 0.208 on stored keys at 8 pairs: 1.664 pairs answered (not the score, not x the 4 queries).
    One stored pair and one query a sequence: the shortcut (the stored values in their proportions) puts all
    its mass on the one stored value, so it answers every stored query: 1 pair of 1 (over every answer, the
    unstored ones included, its accuracy would be about half). Two pairs of two values: the same value twice
    (probability 1/2) is answered; two different ones leave the shortcut at 1/2 each, right half the time:
    accuracy 3/4, 1.5 pairs of 2 in expectation (2,000 sequences: a standard error near 0.02)."""
    assert matrix.pairs_answered(0.208, 8) == pytest.approx(1.664)
    one = ["--pairs", "1", "--queries", "1", "--recall-curriculum", ""]
    two = ["--pairs", "2", "--keys", "4", "--values", "2", "--queries", "1", "--recall-curriculum", ""]
    got = matrix.sweep_shortcuts([dict(task="recall", point="pairs1", flags=one),
                                  dict(task="recall", point="pairs2", flags=two)], seqs=2000)
    assert got["pairs1"] == 1.0 and got["pairs2"] == pytest.approx(1.5, abs=0.08)


def test_a_sweeps_rows_from_its_cells(tmp_path):
    """A finished LSTM cell at 8 pairs (KL 0.5 of the prior's 2.0: score 0.75; stored accuracy 0.25: 2 pairs
    of 8; h and c of 2 layers of 64: 256 floats; a constant training loss: flat) and one that sat out."""
    import dataclasses
    cfg = models.make_config("lstm", vocab_size=68, n_classes=32, max_len=48, d_model=64, n_layers=2)
    cells_ = [c for c in matrix.sweep_cells("capacity") if c["point"] == "pairs8" and c["family"] in ("lstm", "ssm")]
    lstm = next(c for c in cells_ if c["family"] == "lstm")
    os.makedirs(tmp_path / lstm["name"])
    with open(tmp_path / lstm["name"] / "log.csv", "w") as f:
        f.write("step,loss_bits,bayes_loss_bits,lr,grad_norm,seconds\n")
        f.writelines(f"{i + 1},1.5,1.0,0.001,1.0,{i}\n" for i in range(40))
    results = {lstm["name"]: dict(params=108_578, steps=40, kl_bits=0.5, prior_kl_bits=2.0, settings=dict(pairs=8),
                                  groups=dict(stored=dict(accuracy=0.25)), config=dataclasses.asdict(cfg)),
               "recall-ssm-pairs8-s0": dict(sits_out="no width")}
    rows = matrix.sweep_table(results, cells_, str(tmp_path))
    got = {r["family"]: r for r in rows}
    assert got["lstm"]["score"] == pytest.approx(0.75) and got["lstm"]["answered"] == pytest.approx(2.0)
    assert got["lstm"]["state_floats"] == 256 and got["lstm"]["flat"] and got["lstm"]["pairs"] == 8
    assert got["ssm"]["sits_out"] == "no width"
    text = "\n".join(matrix.sweep_lines(rows))
    assert "2.0 of 8" in text and "sits out: no width" in text


def test_the_command_reads_every_mark_against_its_tasks_shortcut(tmp_path, monkeypatch, capsys):
    """main end to end on stand-in cells (every one scoring 0.96 against uniform), the floors and the window
    filters measured for real on the quick preset: the bijection (no shortcut) gets a check, the HMM (its
    shortcut about 0.92) a cross, transport (about 0.28) a ~; transport's row reads an effective memory; the
    figures are drawn. Dropping the floors anywhere on the way turns the HMM's cross into a check."""
    def fake_run(preset, out, seeds=None, jobs=2, log=print, todo=None):
        got = {}
        for c in (matrix.cells(preset, seeds) if todo is None else todo):
            write_log(os.path.join(out, c["name"]), 0.0)
            got[c["name"]] = dict(kl_bits=0.04, prior_kl_bits=1.0, params=1000, steps=100, batch=8)
        return got
    monkeypatch.setattr(matrix, "run", fake_run)
    matrix.main(["--preset", "quick", "--out", str(tmp_path / "m"), "--figures", str(tmp_path / "f")])
    with open(tmp_path / "m" / "matrix.json") as f:
        saved = json.load(f)
    rows = {(r["task"], r["family"]): r for r in saved["rows"]}
    assert saved["floors"]["bijection"] is None and 0.9 < saved["floors"]["hmm"] < 0.95
    assert 0.2 < saved["floors"]["transport"] < 0.35
    assert rows["bijection", "lstm"]["verdict"] == "✓" and rows["hmm", "lstm"]["verdict"] == "✗"
    assert rows["transport", "lstm"]["verdict"] == "~" and rows["hmm", "lstm"]["closed"][0] < 0.6
    assert rows["transport", "lstm"]["memory_where"] == ["within"] and "memory" not in rows["hmm", "lstm"]
    assert sorted(os.listdir(tmp_path / "f")) == ["memory-transport-quick.png", "primitives-quick-curves.png",
                                                  "primitives-quick.png"]
    assert "transport: the window filters' KL" in capsys.readouterr().out
    # --confirm: three seeds of every cell, and a 4x run where a seed's loss still falls (here the HMM's LSTM)
    real = fake_run

    def fake_run_confirm(preset, out, seeds=None, jobs=2, log=print, todo=None):
        got = real(preset, out, seeds, jobs, log, todo)
        write_log(os.path.join(out, "hmm-lstm-s1"), 0.2)
        return got
    monkeypatch.setattr(matrix, "run", fake_run_confirm)
    matrix.main(["--preset", "quick", "--confirm", "--out", str(tmp_path / "c"), "--figures", str(tmp_path / "f")])
    with open(tmp_path / "c" / "matrix.json") as f:
        saved = json.load(f)
    rows = {(r["task"], r["family"]): r for r in saved["rows"]}
    assert saved["seeds"] == [0, 1, 2] and len(rows["bijection", "mlp"]["score"]) == 3
    assert [k for k, r in rows.items() if "score_4x" in r] == [("hmm", "lstm")]


def test_the_rate_sweep_cells_and_its_choice_by_hand(tmp_path):
    """64 cells: recall, hops, transport and the HMM x the LSTM and the SSM x each one's two initialisations x 4
    rates, on seed 9 (none of the matrix's seeds, nor the depth sweep's 2-4), each at the transformer's count
    with its rate and initialisation on the command line. The choice: the lowest KL per family and task (not
    the highest score of another task, not the first row), flagged where it sits at the grid's edge."""
    from primitives import depth_sweep
    todo = matrix.rate_cells()
    assert len(todo) == 64 and len({c["name"] for c in todo}) == 64
    assert {c["seed"] for c in todo} == {9} and 9 not in matrix.CONFIRM_SEEDS + depth_sweep.PRESETS["default"]["seeds"]
    assert {(c["family"], c["init"]) for c in todo} == {("lstm", "fan-in"), ("lstm", "uniform"), ("ssm", "fan-in"),
                                                         ("ssm", "gpt2")}
    assert 1e-3 in matrix.RATES and len(matrix.RATES) >= 4
    a = matrix.argv(todo[0], "default", str(tmp_path / "x"), (109_600, 64))
    assert a[a.index("--lr") + 1] == "0.001" and a[a.index("--init") + 1] == "fan-in" and "--params" in a
    row = lambda task, lr, kl: dict(task=task, family="lstm", lr=lr, init="fan-in", kl=kl, score=0.0, flat=True)
    rows = [row("recall", 1e-3, 2.03), row("recall", 3e-3, 1.5), row("recall", 1e-2, 2.06),
            row("hops", 1e-3, 0.9), row("hops", 3e-3, 1.2), dict(task="hops", family="lstm", lr=1e-2, init="uniform",
                                                                  failed="exit code 1")]
    chosen = matrix.choose_rates(rows)
    assert chosen["lstm", "recall"]["lr"] == 3e-3 and not chosen["lstm", "recall"]["edge"]
    assert chosen["lstm", "hops"]["lr"] == 1e-3 and chosen["lstm", "hops"]["edge"]
    text = matrix.rate_lines(rows, chosen)
    assert text[2].endswith("<- chosen") and text[4].endswith("<- chosen (the grid's edge)") and "failed" in text[6]
    with pytest.raises(SystemExit):
        matrix.main(["--sweep", "rates", "--seeds", "0", "1"])
