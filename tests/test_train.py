"""train.py end to end, as a user runs it: bad input, the run directory (resume, overwrite, its lock),
checkpoints, determinism, the NaN guard, Ctrl-C / SIGTERM / SIGHUP, and the one training loop."""

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time

import numba
import numpy as np
import pytest

from harness import checkpoints
import evaluation
import models
import optim
from harness import runs
from tunnels import tasks
import training

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository's folder
QUICK = ["--preset", "quick", "--quiet", "--no-baseline", "--no-geometry", "--eval-seqs", "8"]


def run(args, tmp_path, timeout=900, env=None):
    """train.py with args in tmp_path, figures into tmp_path/figures; args that begin --task sticky: Paper II's
    command, python -m dynamics.run with the rest, from the repository's folder (it draws no figures)."""
    if args[:2] == ["--task", "sticky"]:
        line, cwd = ["-m", "dynamics.run", *args[2:]], ROOT
    else:
        line, cwd = [os.path.join(ROOT, "train.py"), *args, "--figures", str(tmp_path / "figures")], tmp_path
    return subprocess.run([sys.executable, *line], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def assert_clear_error(proc, expected):
    """Exit code 2, no traceback, one line on stderr holding expected (a string, or a tuple of strings)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    prog = "python -m dynamics.run" if proc.args[1:3] == ["-m", "dynamics.run"] else "train.py"
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), proc.stderr
    for part in (expected,) if isinstance(expected, str) else expected:
        assert part in lines[0], (part, lines[0])


def load(path):
    return checkpoints.load_checkpoint(str(path))


@pytest.mark.parametrize("args, expected", [
    (["--task", "bijektion"], "--task 'bijektion': allowed are bijection, sawtooth, hmm, recall, hops, transport, sticky"),
    (["--model", "rnn"], "--model 'rnn': allowed are transformer, mlp, prefix-mlp, lstm, ssm"),
    (["--baseline", "gru"], "--baseline 'gru': allowed are transformer, mlp, prefix-mlp, lstm, ssm"),
    (["--init", "zeros"], "--init 'zeros': allowed are gpt2, fan-in"),
    (["--task", "hmm", "--V", "10"], "--V does not apply to --task hmm (it belongs to --task bijection and --task sawtooth)"),
    (["--K", "10"], "--K does not apply to --task bijection (it belongs to --task hmm)"),
    (["--curriculum", "5:100"], "--curriculum does not apply to --task bijection (it belongs to --task sawtooth)"),
    (["--task", "sawtooth", "--curriculum", "30:100"],
     "--curriculum '30:100': each alphabet must lie in 1..20 and the steps must increase"),
    (["--task", "sawtooth", "--curriculum", "5:100,10:50"],
     "--curriculum '5:100,10:50': each alphabet must lie in 1..20 and the steps must increase"),
    (["--task", "sawtooth", "--curriculum", "five"], "--curriculum 'five': expected stages alphabet:until_step"),
    (["--chain", "authors"], "--chain does not apply to --task bijection (it belongs to python -m dynamics.run"),
    (["--task", "sticky", "--chain", "0.35"], "--chain '0.35': allowed are exact, authors"),
    (["--task", "sticky", "--deep", "--compare-em"], "--compare-em and --deep are two experiments"),
    (["--preset", "huge"], "--preset 'huge': allowed are quick, default, paper"),
    (["--steps", "0"], "--steps 0: must be a positive integer"),
    (["--batch", "-3"], "--batch -3: must be a positive integer"),
    (["--width", "0"], "--width 0: must be a positive integer"),
    (["--heads", "3"], ("--heads 3", "--width 64")),
    (["--V", "1"], "--V 1: the bijection needs at least 2 keys"),
    (["--task", "hmm", "--K", "0"], "--K 0: the HMM needs at least 1 observation"),
    (["--lr", "0"], "--lr 0.0: must be a finite number > 0"),
    (["--lr=-1e-3"], "--lr -0.001: must be a finite number > 0"),
    (["--lr", "inf"], "--lr inf: must be a finite number > 0"),
    (["--lr", "nan"], "--lr nan: must be a finite number > 0"),
    (["--seed", "-1"], "--seed -1: must be an integer in 0..2^63-1"),
    (["--eval-seqs", "2"], "--eval-seqs 2: must be at least 4 (the single-sequence figure draws four)"),
    (["--warmup", "-1"], "--warmup -1: must be a non-negative integer"),
    (["--batch", "1000000"], ("--batch 1000000", "a training step would need about")),
    (["--width", "100000", "--heads", "1"], ("--width 100000", "GiB are available")),
    (["--kernels", "cuda"], "--kernels 'cuda': allowed are numba, numpy"),
    (["--task", "sticky", "--deep", "--sigma", "2"],
     "--sigma does not apply to python -m dynamics.run --deep (it belongs to python -m dynamics.run (the one-head run))"),
    (["--task", "sticky", "--eval-seqs", "100"], "--eval-seqs does not apply to python -m dynamics.run (the one-head run)"),
    (["--task", "sticky", "--figures", "x"], "--figures does not apply to python -m dynamics.run (the one-head run)"),
    (["--resume", "--overwrite"], "--resume and --overwrite: continue the run in --out or replace it, not both"),
    (["--dtype", "float16"], "--dtype 'float16': allowed are float32, float64"),
    (["--pos", "rope"], "--pos 'rope': allowed are learned, sinusoidal"),
    (["--lr-floor", "1.5"], "--lr-floor 1.5: must lie in [0, 1] (a fraction of --lr)"),
    (["--weight-decay", "1.5"], "--weight-decay 1.5: must lie in [0, 1)"),
    (["--weight-decay=-0.1"], "--weight-decay -0.1: must lie in [0, 1)"),
    (["--threads", "0"], "--threads 0: must lie in 1.."),
    (["--threads", "999"], "--threads 999: must lie in 1.."),
    (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["--eval-only", "missing.npz"], "--eval-only: checkpoint 'missing.npz' does not exist"),
    (["--out", "/proc/no/such/dir"], "--out '/proc/no/such/dir' cannot be written"),
    # a size flag the --model family's Config lacks: refused, naming the flag and the family
    (["--model", "mlp", "--heads", "4"], "--heads does not apply to --model mlp (its Config has no n_heads)"),
    (["--model", "prefix-mlp", "--init", "fan-in"], "--init does not apply to --model prefix-mlp (its Config has no init)"),
    (["--model", "mlp", "--pos", "sinusoidal"], "--pos does not apply to --model mlp (its Config has no pos)"),
])
def test_bad_input_gives_one_clear_line(args, expected, tmp_path):
    """Each bad input gets its one line and exit code 2, and nothing already in --out changes (no lock left)."""
    out = tmp_path / "earlier"
    os.makedirs(out / "snapshots")
    files = {"checkpoint.npz": b"an earlier run", "metrics.json": b"{}", "log.csv": b"step\n1\n",
             "snapshots/step_0000001.npz": b"x", "notes.txt": b"mine"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    if "--out" not in args and "--eval-only" not in args:
        args = [*args, "--out", str(out)]
    assert_clear_error(run(args, tmp_path), expected)
    assert {name: (out / name).read_bytes() for name in files} == files
    assert sorted(os.listdir(out)) == sorted(["checkpoint.npz", "metrics.json", "log.csv", "snapshots", "notes.txt"])


def test_the_bar_of_a_stopped_run_shows_its_share_and_the_message_has_its_own_line(tmp_path):
    """--stop-after 2 of 5 steps: the bar (on the terminal, stderr and stdout together) ends at 40%, not 100%, after
    saying it compiled first, and the stop message starts a line of its own instead of being glued to the bar."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--preset", "quick", "--no-baseline",
                          "--no-geometry", "--eval-seqs", "8", "--steps", "5", "--stop-after", "2", "--out",
                          str(tmp_path / "s")], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=900).stdout
    frames = out.replace("\r", "\n").splitlines()
    bars = [f for f in frames if f.startswith("bijection: ") and "%" in f]
    assert "compiling the Numba kernels before training" in out and bars and bars[-1].startswith("bijection:  40% |")
    assert "this command stops at step 2" in bars[-1]
    assert any(f.startswith("stopped at step 2 of 5 (--stop-after)") for f in frames), frames


def test_the_error_messages_the_readme_quotes_are_the_ones_printed(tmp_path):
    """Each `train.py: error: ...` the README or USAGE.md quotes is printed verbatim by the command that provokes
    it (a quote added without its command here fails this test)."""
    import re
    readme = " ".join(" ".join(open(os.path.join(ROOT, doc)).read().split()) for doc in ("README.md", os.path.join("docs", "USAGE.md")))
    quoted = re.findall(r"`(train\.py: error: [^`]*)`", readme)
    provoke = {"--K does not apply to --task bijection": ["--K", "10"]}
    assert quoted
    for message in quoted:
        argv = next(argv for start, argv in provoke.items() if start in message)
        proc = run(argv, tmp_path)
        assert_clear_error(proc, message)
        assert proc.stderr.strip() == message


def test_a_size_flag_the_baseline_lacks_stays_valid():
    """--heads sizes the transformer; the baseline is sized by the trainer (capacity-matched), so a flag its
    family lacks is not refused."""
    import train
    args = train.parse_args(["--heads", "4", "--width", "32", "--baseline", "prefix-mlp"])
    assert (args.model, args.baseline, args.heads, args.width) == ("transformer", "prefix-mlp", 4, 32)
    assert "n_heads" not in models.config_fields("prefix-mlp")        # the case this test is about


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run (3 steps, seed 3) that the tests below only read."""
    tmp = tmp_path_factory.mktemp("finished")
    proc = run([*QUICK, "--steps", "3", "--seed", "3", "--out", str(tmp / "run")], tmp)
    assert proc.returncode == 0, proc.stderr
    return tmp / "run"


def test_corrupt_and_mismatched_checkpoints(finished, tmp_path):
    out, ckpt = finished, finished / "checkpoint.npz"
    data = ckpt.read_bytes()
    same = [*QUICK, "--steps", "3", "--seed", "3", "--out", str(out), "--resume"]
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    assert_clear_error(run(["--eval-only", "truncated.npz"], tmp_path), "is truncated or not a bayesattn checkpoint")
    (tmp_path / "noise.npz").write_bytes(b"not a checkpoint at all")
    assert_clear_error(run(["--eval-only", "noise.npz"], tmp_path), "is truncated or not a bayesattn checkpoint")
    # --resume with another task, model or configuration
    assert_clear_error(run([*same, "--task", "hmm"], tmp_path), "has task='bijection' but this run asks for 'hmm'")
    assert_clear_error(run([*same, "--model", "mlp"], tmp_path), "has model='transformer' but this run asks for 'mlp'")
    assert_clear_error(run([*same, "--lr-floor", "0"], tmp_path), "has lr_floor=0.1 but this run asks for 0.0")
    assert_clear_error(run([*same, "--weight-decay", "0"], tmp_path), "has weight_decay=0.01 but this run asks for 0.0")
    assert_clear_error(run([*QUICK, "--steps", "3", "--seed", "3", "--out", str(tmp_path / "empty"), "--resume"], tmp_path),
                       "checkpoint '" + str(tmp_path / "empty" / "checkpoint.npz") + "' does not exist")
    assert ckpt.read_bytes() == data                           # nothing already written was lost
    assert not (out / runs.LOCK).exists()                      # and a refused run leaves no lock


def test_resume_with_another_width_names_the_flag(finished, tmp_path):
    assert_clear_error(run([*QUICK, "--steps", "3", "--seed", "3", "--out", str(finished), "--resume", "--width", "16"],
                           tmp_path), ("--width 32", "--width 16"))


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run([*QUICK, "--steps", "5", "--out", str(a)], tmp_path).returncode == 0
    stopped = run([*QUICK, "--steps", "5", "--out", str(b), "--stop-after", "2"], tmp_path)
    assert stopped.returncode == 0 and "stopped at step 2 of 5" in stopped.stdout
    assert load(b / "checkpoint.npz")[2]["step"] == 2
    assert run([*QUICK, "--steps", "5", "--out", str(b), "--resume"], tmp_path).returncode == 0
    pa, _, ma, sa = load(a / "checkpoint.npz")
    pb, _, mb, sb = load(b / "checkpoint.npz")
    assert ma["step"] == mb["step"] == 5 and sa["t"] == sb["t"] == 5
    for name in pa:
        assert np.array_equal(pa[name], pb[name]), name
        assert np.array_equal(sa["m"][name], sb["m"][name]) and np.array_equal(sa["v"][name], sb["v"][name]), name
    strip = lambda p: [row.rsplit(",", 1)[0] for row in p.read_text().splitlines()]   # drop wall time
    assert strip(a / "log.csv") == strip(b / "log.csv") and len(strip(a / "log.csv")) == 6
    assert json.loads((a / "metrics.json").read_text())["kl_bits"] == json.loads((b / "metrics.json").read_text())["kl_bits"]


@pytest.mark.ci_only                     # end to end, two or three train.py runs: seconds each
def test_resume_and_eval_only_read_the_family_from_the_checkpoint(tmp_path):
    """An MLP run: its checkpoint.npz names mlp in its meta, is read back as an MLP Config, resumes as
    --model mlp (and is refused, in one line, as the default transformer), and --eval-only scores it as mlp."""
    from families import mlp_baseline
    out = tmp_path / "m"
    flags = [*QUICK, "--model", "mlp", "--steps", "4", "--out", str(out)]
    assert run([*flags, "--stop-after", "2"], tmp_path).returncode == 0
    _, cfg, meta, _ = load(out / "checkpoint.npz")
    assert meta["model"] == "mlp" and type(cfg) is mlp_baseline.Config and cfg.inputs == "token"
    assert_clear_error(run([*QUICK, "--steps", "4", "--out", str(out), "--resume"], tmp_path),
                       "has model='mlp' but this run asks for 'transformer'")
    proc = run([*flags, "--resume"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert load(out / "checkpoint.npz")[2]["step"] == 4
    proc = run(["--eval-only", str(out / "checkpoint.npz")], tmp_path)
    assert proc.returncode == 0 and proc.stdout.splitlines()[2].startswith("mlp "), proc.stdout + proc.stderr


@pytest.mark.ci_only                     # end to end, two or three train.py runs: seconds each
def test_same_seed_same_metrics_and_the_versions_recorded(tmp_path):
    import scipy
    metrics = []
    for name in ("x", "y"):
        assert run([*QUICK, "--steps", "4", "--out", str(tmp_path / name)], tmp_path).returncode == 0
        m = json.loads((tmp_path / name / "metrics.json").read_text())
        m.pop("seconds")
        metrics.append(m)
    assert metrics[0] == metrics[1]
    assert (metrics[0]["batch"], metrics[0]["settings"]) == (32, {"V": 20})      # the quick preset's, the task's
    import llvmlite.binding
    from harness import checkpoints
    assert metrics[0]["versions"] == {"python": platform.python_version(), "numpy": np.__version__,
                                      "scipy": scipy.__version__, "numba": numba.__version__,
                                      "cpu": llvmlite.binding.get_host_cpu_name(), "commit": checkpoints.commit()}


def test_quick_preset_lowers_its_loss(tmp_path):
    """The one learning test: the whole quick preset (60 steps)."""
    proc = run([*QUICK, "--out", str(tmp_path / "q")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    loss = np.loadtxt(tmp_path / "q" / "log.csv", delimiter=",", skiprows=1)[:, 1]
    assert len(loss) == 60 and loss[-10:].mean() < loss[:10].mean() - 0.03, (loss[:10].mean(), loss[-10:].mean())
    assert "exact Bayes" in proc.stdout and (tmp_path / "figures" / "q_calibration.png").exists()


@pytest.mark.parametrize("floor", ["0", "0.1", "1"])
def test_lr_floor_sets_the_end_of_the_cosine(floor, tmp_path):
    out = tmp_path / "f"
    assert run([*QUICK, "--steps", "5", "--warmup", "1", "--lr", "2e-3", "--lr-floor", floor, "--out", str(out)],
               tmp_path).returncode == 0
    logged = np.loadtxt(out / "log.csv", delimiter=",", skiprows=1)[:, 3]
    want = [optim.lr_schedule(s, 2e-3, 1, 5, min_lr=2e-3 * float(floor)) for s in range(5)]
    assert np.allclose(logged, want, rtol=1e-3, atol=0), (logged, want)
    # by hand: the last step is 3/4 of the way down the cosine, floor + (peak - floor) (1 + cos(3 pi / 4)) / 2
    lo = 2e-3 * float(floor)
    assert logged[-1] == pytest.approx(lo + (2e-3 - lo) * (1 + np.cos(0.75 * np.pi)) / 2, rel=1e-3)
    assert json.loads((out / "metrics.json").read_text())["steps"] == 5


@pytest.mark.ci_only                     # end to end, two or three train.py runs: seconds each
def test_weight_decay_and_threads_are_applied_and_recorded(tmp_path):
    """The same run with and without weight decay differs; the checkpoint records both settings, and a
    resume on another thread count is refused (the resume runs with two Numba threads available, so this
    holds on a one-core machine too)."""
    params = {}
    for wd in ("0", "0.5"):
        out = tmp_path / f"wd{wd}"
        assert run([*QUICK, "--steps", "4", "--weight-decay", wd, "--threads", "1", "--out", str(out)],
                   tmp_path).returncode == 0
        params[wd], _, meta, _ = load(out / "checkpoint.npz")
        assert meta["weight_decay"] == float(wd) and meta["threads"] == 1
    # decay shrinks the matrices: W <- W - lr * wd * W each step, on top of the (nearly equal) Adam steps
    assert np.abs(params["0.5"]["blocks.0.mlp.w1"]).sum() < np.abs(params["0"]["blocks.0.mlp.w1"]).sum()
    assert_clear_error(run([*QUICK, "--steps", "4", "--weight-decay", "0", "--threads", "2", "--resume",
                            "--out", str(tmp_path / "wd0")], tmp_path, env={"NUMBA_NUM_THREADS": "2"}),
                       "has threads=1 but this run asks for 2")


@pytest.mark.parametrize("task, preset, documented", [
    # RESULTS.md and README.md: (width, layers, heads, steps, batch, lr, lr_floor, weight_decay, params)
    ("bijection", "quick", (32, 2, 2, 60, 32, 3e-3, 0.1, 0.01, None)),
    ("bijection", "default", (64, 3, 2, 3000, 64, 3e-3, 0.1, 0.0, 156_372)),
    ("bijection", "paper", (64, 3, 2, 130_000, 16, 3e-3, 0.0, 0.0, 156_372)),
    ("sawtooth", "first", (64, 2, 2, 2500, 64, 3e-3, 0.1, 0.0, 105_172)),
    ("sawtooth", "default", (64, 2, 2, 8000, 64, 3e-3, 0.1, 0.0, 105_172)),
    ("sawtooth", "paper", (64, 2, 2, 100_000, 32, 3e-3, 0.0, 0.0, 105_172)),
    ("hmm", "default", (64, 4, 4, 3000, 32, 2e-3, 0.1, 0.01, 213_445)),
    ("hmm", "paper", (96, 6, 6, 17_000, 32, 1.5e-3, 0.0, 0.01, 691_301)),
])
def test_presets_have_their_documented_sizes(task, preset, documented):
    """Each preset against the sizes the documents give (written out here, not read from the presets),
    and the transformer it builds against the documented parameter count."""
    import train
    a = train.parse_args(["--task", task, "--preset", preset])
    assert (a.width, a.layers, a.heads, a.steps, a.batch, a.lr, a.lr_floor, a.weight_decay) == documented[:-1]
    if documented[-1] is not None:
        cfg = train.model_config(a, tasks.sizes(task, a.settings), "transformer")
        assert models.count_params(models.param_shapes("transformer", cfg)) == documented[-1]


def test_an_mlp_is_sized_to_the_model_as_a_baseline_and_by_the_flags_alone():
    """The README's sizes: on the HMM default, the prefix MLP as the baseline is matched to the transformer's
    213,445 parameters (width 19: 209,917); trained alone (--model) it takes the preset's width 64 and 4 layers,
    799,237 parameters, its one-hot grid of 102 positions x 102 tokens being most of them."""
    import train
    count = lambda name, cfg: models.count_params(models.param_shapes(name, cfg))
    a = train.parse_args(["--task", "hmm", "--soft"])
    sizes = tasks.sizes("hmm", a.settings)
    transformer = train.model_config(a, sizes, "transformer")
    matched = train.baseline_config("prefix-mlp", transformer, count("transformer", transformer))
    assert (count("transformer", transformer), matched.d_model, count("prefix-mlp", matched)) == (213_445, 19, 209_917)
    alone = train.parse_args(["--task", "hmm", "--soft", "--model", "prefix-mlp"])
    cfg = train.model_config(alone, sizes, "prefix-mlp")
    assert (cfg.d_model, cfg.n_layers, count("prefix-mlp", cfg)) == (64, 4, 799_237)
    assert 102 * 102 * 64 / 799_237 > 0.8
    narrow = train.parse_args(["--task", "hmm", "--soft", "--model", "prefix-mlp", "--width", "19"])
    assert count("prefix-mlp", train.model_config(narrow, sizes, "prefix-mlp")) == 209_917


def test_presets_set_weight_decay_and_threads_unless_given():
    import train
    paper = train.parse_args(["--preset", "paper"])
    assert (paper.batch, paper.steps, paper.weight_decay, paper.threads) == (16, 130000, 0.0, 1)
    given = train.parse_args(["--preset", "paper", "--weight-decay", "0.01", "--batch", "256", "--threads", "2"])
    assert (given.batch, given.weight_decay, given.threads) == (256, 0.01, 2)
    default = train.parse_args([])
    assert default.weight_decay == 0.0 and default.threads == numba.config.NUMBA_NUM_THREADS
    assert default.heads == 2 and default.width // default.heads >= 20      # head size >= the 20 hypotheses
    hmm = train.parse_args(["--task", "hmm"])
    assert (hmm.weight_decay, hmm.lr_floor) == (0.01, 0.1)                 # a preset without them: the documented defaults


def test_threads_flag_sets_numbas_thread_count_for_the_run_only(tmp_path, monkeypatch):
    """Training runs on --threads threads; once main returns, the caller's thread count is back."""
    import train
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("NUMBA_NUM_THREADS is 1: --threads 1 cannot differ from the thread count before the run")
    before = numba.get_num_threads()
    seen = []
    step = training.train_step
    monkeypatch.setattr(training, "train_step", lambda *a, **k: (seen.append(numba.get_num_threads()), step(*a, **k))[1])
    try:
        numba.set_num_threads(2)
        train.main([*QUICK, "--steps", "2", "--threads", "1", "--out", str(tmp_path / "t"),
                    "--figures", str(tmp_path / "figures")])
        assert seen == [1, 1, 1] and numba.get_num_threads() == 2      # the compile step, then two steps
    finally:
        numba.set_num_threads(before)


def test_compile_time_is_not_training_time(tmp_path, monkeypatch, capsys):
    """Numba compiles each kernel at its first call (half a minute on a cold cache): a first call made 1.5 s slower
    stands in for it. It happens in the thrown-away compile step, before the clock starts: metrics' seconds and
    log.csv's times count training only, the compile time is printed apart, and the step changes no weight."""
    import train
    calls = []
    real = models.loss_and_grads

    def first_call_slow(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.5)
        return real(*a, **k)
    monkeypatch.setattr(models, "loss_and_grads", first_call_slow)
    out = tmp_path / "c"
    train.main([*QUICK, "--steps", "3", "--out", str(out), "--figures", str(tmp_path / "figures")])
    assert len(calls) == 4                                          # the compile step and three steps
    assert json.loads((out / "metrics.json").read_text())["seconds"] < 1.0
    log = np.loadtxt(out / "log.csv", delimiter=",", skiprows=1)
    assert log[0, 5] < 1.0, log[:, 5]                               # step 1's time: no compile in it
    assert "s compiling the Numba kernels before it, not counted" in capsys.readouterr().out

    cfg = models.make_config("transformer", vocab_size=7, n_classes=5, max_len=5, d_model=8, n_layers=1, n_heads=2)
    params = models.init_params("transformer", cfg, 0)
    before = {k: v.copy() for k, v in params.items()}
    state = optim.adamw_init(params)
    rng = np.random.default_rng(0)
    seconds = training.compile_step(lambda p, tok, tgt, m: real("transformer", p, tok, tgt, m, cfg), params, state,
                                    rng.integers(0, 7, (2, 5)), rng.integers(0, 5, (2, 5)), np.ones((2, 5)), 0.01)
    assert seconds > 0 and state["t"] == 0 and all(np.array_equal(before[k], params[k]) for k in params)


@pytest.mark.parametrize("task", ["bijection", pytest.param("hmm", marks=pytest.mark.ci_only)])
def test_soft_targets_are_used_and_reported(task, tmp_path):
    out = tmp_path / "s"
    proc = run([*QUICK, "--task", task, "--soft", "--steps", "3", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "metrics.json").read_text())["targets"] == "soft"
    _, cfg, _, _ = load(out / "checkpoint.npz")
    # HMM: learned positions past the training length (52 + 20) reuse its last row; the bijection has none
    assert cfg.pos_limit == (72 if task == "hmm" else 0) and cfg.max_len == (102 if task == "hmm" else 38)
    log = np.loadtxt(out / "log.csv", delimiter=",", skiprows=1)
    # with soft targets the logged loss is the cross-entropy against the posterior and the logged floor
    # is the posterior's entropy: their difference is a KL, never negative
    assert len(log) == 3 and np.all(log[:, 1] >= log[:, 2] - 1e-4), (log[:, 1] - log[:, 2]).min()


def test_nan_guard_stops_with_the_step(tmp_path):
    out = tmp_path / "n"
    proc = run([*QUICK, "--steps", "5", "--lr", "1e30", "--out", str(out)], tmp_path)
    assert_clear_error(proc, ("train.py: error: step ", "is not finite; training stopped", "try a smaller --lr"))
    assert not (out / runs.LOCK).exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"])
def test_a_stop_signal_saves_a_checkpoint(sig, tmp_path):
    out = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *QUICK, "--steps", "100000",
                             "--out", str(out), "--figures", str(tmp_path / "figures")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not ((out / "log.csv").exists() and
                                              len((out / "log.csv").read_text().splitlines()) > 3):
            time.sleep(0.2)                                    # wait until training is under way
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted after step" in err and "Traceback" not in err, err
    _, _, meta, opt_state = load(out / "checkpoint.npz")
    assert meta["step"] >= 3 and opt_state["t"] == meta["step"]
    assert not (out / runs.LOCK).exists()                      # the lock goes with the run


@pytest.mark.parametrize("args, expected", [
    (["--task", "sticky", "--preset", "huge"], "--preset does not apply to python -m dynamics.run (the one-head run)"),
    (["--task", "sticky", "--model", "mlp", "--width", "8"], "--model does not apply to python -m dynamics.run (the one-head run)"),
    (["--task", "sticky", "--out", "/proc/nope"], "--out '/proc/nope' cannot be written"),
])
def test_sticky_rejects_flags_it_does_not_use(args, expected, tmp_path):
    assert_clear_error(run(args, tmp_path), expected)


@pytest.mark.ci_only
def test_eval_only_reads_mlp_checkpoints_and_snapshots(tmp_path):
    """--heads 4 sizes the transformer, the mlp baseline is matched to it; --eval-only reads each file's family
    from its meta: the baseline's own file and a transformer snapshot."""
    out = tmp_path / "m"
    proc = run(["--preset", "quick", "--quiet", "--no-geometry", "--eval-seqs", "8", "--task", "hmm", "--steps", "3",
                "--width", "32", "--heads", "4", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert load(out / "mlp.npz")[2]["model"] == "mlp" and load(out / "checkpoint.npz")[1].n_heads == 4
    for ckpt, name in ((out / "mlp.npz", "mlp"), (sorted((out / "snapshots").iterdir())[-1], "transformer")):
        proc = run(["--eval-only", str(ckpt), "--eval-seqs", "8"], tmp_path)
        assert proc.returncode == 0 and proc.stdout.splitlines()[2].startswith(name + " "), proc.stderr
        assert not proc.stdout.splitlines()[3].startswith(("mlp", "transformer")), proc.stdout   # that model alone
    # the run's checkpoint.npz: the baseline beside it too, in the table and in the calibration figure, with the
    # numbers the run itself wrote
    proc = run(["--eval-only", str(out / "checkpoint.npz")], tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[2].startswith("transformer ") and lines[3].startswith("mlp "), proc.stdout
    written = json.loads((out / "metrics_mlp.json").read_text())
    assert f"{written['kl_bits']:.4g}" in lines[3].split(), (written["kl_bits"], lines[3])


@pytest.mark.ci_only                     # end to end, two or three train.py runs: seconds each
def test_a_resumed_baseline_reports_its_own_training_time(tmp_path):
    """The transformer finishes (4 steps), the prefix-mlp baseline stops at 4 of its 5; their checkpoints are
    then given very different training times, and the resumed run reports the baseline's own, summed over
    the resume, while the finished transformer's metrics.json stays as it was written (a finished model is
    not evaluated again). --heads 4 with --baseline prefix-mlp is valid: the baseline is sized by the trainer."""
    out = tmp_path / "b"
    flags = ["--preset", "quick", "--quiet", "--no-geometry", "--eval-seqs", "8", "--steps", "4", "--width", "32",
             "--heads", "4", "--baseline", "prefix-mlp", "--baseline-steps", "5", "--out", str(out)]
    proc = run([*flags, "--stop-after", "4"], tmp_path)       # the transformer to its end, the baseline to 4 of 5
    assert proc.returncode == 0 and "stopped at step 4 of 5" in proc.stdout, proc.stdout + proc.stderr
    assert (out / "metrics.json").exists() and not (out / "metrics_prefix-mlp.json").exists()
    for name, seconds in (("checkpoint.npz", 1000.0), ("prefix-mlp.npz", 7.0)):
        params, cfg, meta, state = load(out / name)
        checkpoints.save_checkpoint(str(out / name), params, cfg, dict(meta, seconds=seconds), state)
    assert load(out / "prefix-mlp.npz")[2]["step"] == 4 and load(out / "checkpoint.npz")[2]["step"] == 4
    written = (out / "metrics.json").read_bytes()
    proc = run([*flags, "--resume"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    main, base = (json.loads((out / f).read_text()) for f in ("metrics.json", "metrics_prefix-mlp.json"))
    assert (main["model"], main["steps"], base["model"], base["steps"]) == ("transformer", 4, "prefix-mlp", 5)
    assert (out / "metrics.json").read_bytes() == written and main["seconds"] < 1000.0
    assert 7.0 <= base["seconds"] < 67.0, base["seconds"]      # its own 7 s and one more step, not the 1000
    assert base["versions"] == main["versions"] and set(base["versions"]) == {"python", "numpy", "scipy", "numba", "cpu", "commit"}
    assert "n_heads" not in base["config"] and main["config"]["n_heads"] == 4


def test_evaluate_scores_the_exact_posterior_zero_and_a_mixture_as_computed():
    from tunnels import bijection
    batch = bijection.batch(np.random.default_rng(0), 50, 6)
    m, _ = evaluation.evaluate(lambda tok: batch["posterior"].copy(), batch)
    for key in ("entropy_mae_bits", "entropy_mae_seq_bits", "kl_bits", "excess_ce_bits", "impossible_mass"):
        assert abs(m[key]) < 1e-12, (key, m[key])
    eps = 0.01
    q = (1 - eps) * batch["posterior"] + eps / 6                   # leaks eps / 6 onto every value
    m, _ = evaluation.evaluate(lambda tok: q, batch)
    cols = np.flatnonzero(batch["mask"][0] > 0)
    ruled_out = (batch["posterior"][:, cols] == 0).sum(-1)           # values already seen, per position
    assert np.isclose(m["impossible_mass"], (eps / 6 * ruled_out).mean(), rtol=1e-12)
    assert [r["impossible_mass"] for r in m["per_position"]] == pytest.approx(eps / 6 * np.arange(len(cols)))
    assert m["kl_bits"] > 0 and m["per_position"][0]["impossible_mass"] == 0.0


@pytest.mark.parametrize("task, gap", [("bijection", 1.107), pytest.param("sawtooth", 1.849, marks=pytest.mark.ci_only),
                                       pytest.param("hmm", 0.420, marks=pytest.mark.ci_only)])
def test_authors_mlp_learns_exactly_the_prior(task, gap):
    """The authors' MLP sees one token and its position, so trained it reaches the prior's gap
    (tasks.prior_gap_bits: 1.107, 1.849, about 0.42 bits), not less. It starts from loud output
    weights, far from the prior, so only training can bring it there."""
    s = tasks.settings(task)
    sizes = tasks.sizes(task, s)
    cfg = models.make_config("mlp", vocab_size=sizes["vocab"], n_classes=sizes["classes"], max_len=sizes["max_len"],
                             d_model=16, n_layers=1)
    params = models.init_params("mlp", cfg, 0)
    params["mlp.out.w"] = np.random.default_rng(1).normal(0, 1.0, params["mlp.out.w"].shape).astype(np.float32)
    assert tasks.prior_gap_bits(task, s) == pytest.approx(gap, abs=2e-3)
    held_out = tasks.sample(task, np.random.default_rng(99), 500, s)
    predict = lambda tok: models.predict_proba("mlp", params, tok, cfg)
    before = evaluation.evaluate(predict, held_out)[0]["entropy_mae_bits"]
    assert abs(before - gap) > 0.1, (before, gap)
    state = optim.adamw_init(params)
    loss_and_grads = lambda p, tok, tgt, m: models.loss_and_grads("mlp", p, tok, tgt, m, cfg)
    for step in range(300):
        b = tasks.sample(task, np.random.default_rng((5, step)), 64, s, step)
        training.train_step(loss_and_grads, params, state, b["tokens"], b["targets"], b["mask"],
                            optim.lr_schedule(step, 1e-2, 20, 300, min_lr=1e-3))
    m = evaluation.evaluate(predict, held_out)[0]
    assert abs(m["entropy_mae_bits"] - gap) < 0.03, (task, m["entropy_mae_bits"], gap)
    assert abs(m["kl_bits"] - gap) < 0.03, (task, m["kl_bits"], gap)   # KL(post || uniform) = log2 K - H(post)


def test_evaluate_keeps_the_sawtooth_query_apart():
    """The paper's sawtooth curve covers the L value positions; the query is scored on its own. A model that is
    exact everywhere but puts 1/2 on the query's answer (1/2 spread over the other V - 1 values) has paper
    metric, per-sequence MAE and KL 0, and at the query KL = log2(1 / (1/2)) = 1 bit and accuracy 1."""
    from tunnels import sawtooth
    V = 5
    batch = sawtooth.batch(np.random.default_rng(0), 30, V=V)
    q = batch["posterior"].copy()
    q[:, -1] = np.where(q[:, -1] == 1.0, 0.5, 0.5 / (V - 1))
    m, _ = evaluation.evaluate(lambda tok: q, batch)
    for key in ("entropy_mae_bits", "entropy_mae_seq_bits", "kl_bits", "excess_ce_bits"):
        assert abs(m[key]) < 1e-12, (key, m[key])
    assert len(m["per_position"]) == V - 1                        # the values only
    g = m["groups"]["final query"]
    assert g["kl_bits"] == pytest.approx(1.0, abs=1e-12) and g["accuracy"] == 1.0
    q[:, -1] = np.roll(batch["posterior"][:, -1], 1, axis=-1) * 0.9 + 0.1 / V   # the argmax is now wrong
    m, _ = evaluation.evaluate(lambda tok: q, batch)
    g = m["groups"]["final query"]
    assert g["accuracy"] == 0.0 and g["kl_bits"] == pytest.approx(-np.log2(0.1 / V))


def test_sawtooth_presets_reach_the_model(tmp_path):
    """The preset's init and curriculum are what the run records and what the model was built with."""
    import train
    args = train.parse_args(["--task", "sawtooth"])
    assert (args.init, args.curriculum, args.layers, args.heads) == ("fan-in", "5:1000", 2, 2)
    out = tmp_path / "s"
    assert run([*QUICK, "--task", "sawtooth", "--steps", "3", "--out", str(out)], tmp_path).returncode == 0
    params, cfg, meta, _ = load(out / "checkpoint.npz")
    assert cfg.init == "fan-in" and meta["init"] == "fan-in" and meta["curriculum"] == "5:30"
    assert 0.5 < float(np.std(params["wte"])) < 2.0                 # N(0, 1) embeddings, not N(0, 0.02)
    s = tasks.settings("sawtooth", {"curriculum": "5:30"})
    early, late = (tasks.sample("sawtooth", np.random.default_rng(0), 50, s, step) for step in (29, 30))
    assert max(len(set(k)) for k in early["tokens"][:, 0:38:2]) <= 5     # 5-key alphabets before step 30
    assert max(len(set(k)) for k in late["tokens"][:, 0:38:2]) > 5       # then the task itself
    held_out = tasks.sample("sawtooth", np.random.default_rng(0), 50, s)  # held-out sets: no curriculum
    assert max(len(set(k)) for k in held_out["tokens"][:, 0:38:2]) > 5


@pytest.mark.ci_only                     # end to end, two or three train.py runs: seconds each
def test_a_finished_run_is_never_overwritten_silently(tmp_path):
    out = tmp_path / "r"
    assert run([*QUICK, "--steps", "4", "--out", str(out)], tmp_path).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    snaps = sorted(p.name for p in (out / "snapshots").iterdir())
    (out / "notes.txt").write_text("mine")
    assert_clear_error(run([*QUICK, "--steps", "3", "--out", str(out)], tmp_path),
                       "already holds a run (checkpoint.npz, log.csv, metrics.json, ...): continue it with --resume, "
                       "replace it with --overwrite, or give another --out")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "notes.txt"} == before
    proc = run([*QUICK, "--steps", "3", "--out", str(out), "--overwrite"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, _, meta, _ = load(out / "checkpoint.npz")
    assert meta["step"] == 3 and (out / "notes.txt").read_text() == "mine"          # only the run's own files go
    assert sorted(p.name for p in (out / "snapshots").iterdir()) != snaps            # old snapshots do not linger
    assert max(int(p.name[5:12]) for p in (out / "snapshots").iterdir()) == 3


def test_resume_refuses_a_stop_before_its_checkpoint_and_another_eval_set(tmp_path):
    out = tmp_path / "s"
    assert run([*QUICK, "--steps", "5", "--stop-after", "3", "--out", str(out)], tmp_path).returncode == 0
    data = (out / "checkpoint.npz").read_bytes()
    assert_clear_error(run([*QUICK, "--steps", "5", "--stop-after", "2", "--resume", "--out", str(out)], tmp_path),
                       "--stop-after 2: the checkpoint")
    assert_clear_error(run([*QUICK[:-1], "9", "--steps", "5", "--resume", "--out", str(out)], tmp_path),
                       "has eval_seqs=8 but this run asks for 9")
    assert (out / "checkpoint.npz").read_bytes() == data


def test_eval_only_scores_the_runs_own_held_out_set(finished, tmp_path):
    import train
    kl = json.loads((finished / "metrics.json").read_text())["kl_bits"]
    m = train.main(["--eval-only", str(finished / "checkpoint.npz"), "--figures", str(tmp_path / "f"), "--threads", "1"])
    assert m["kl_bits"] == pytest.approx(kl, rel=1e-9)                 # seed 3's held-out set, and its 8 sequences


# ----------------------------------------------------------------------------
# checkpoints and the run directory's files

def tiny_transformer():
    cfg = models.make_config("transformer", vocab_size=5, n_classes=3, max_len=4, d_model=4, n_layers=1, n_heads=1)
    return cfg, models.init_params("transformer", cfg, 0)


def test_saving_refuses_non_finite_weights_and_reports_a_full_disk(tmp_path, monkeypatch):
    cfg, params = tiny_transformer()
    path = tmp_path / "checkpoint.npz"
    checkpoints.save_checked(str(path), params, cfg, {"model": "transformer", "step": 1})
    good = path.read_bytes()
    params["blocks.0.attn.wq"][0, 0] = np.inf
    with pytest.raises(checkpoints.CheckpointNotSaved, match="weights blocks.0.attn.wq are not finite"):
        checkpoints.save_checked(str(path), params, cfg, {"model": "transformer", "step": 2})
    assert path.read_bytes() == good                                   # the last good checkpoint stays

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoints, "save_checkpoint", full)
    params["blocks.0.attn.wq"][0, 0] = 0.0
    with pytest.raises(checkpoints.CheckpointNotSaved, match="checkpoint.npz cannot be written .No space left on device."):
        checkpoints.save_checked(str(path), params, cfg, {"model": "transformer", "step": 3})
    assert path.read_bytes() == good


def test_stale_temporaries_are_removed_and_checkpoints_get_the_usual_mode(tmp_path):
    os.makedirs(tmp_path / "snapshots")
    for name in (".tmp-abc.npz", "snapshots/.tmp-def.npz", "keep.txt"):
        (tmp_path / name).write_text("x")
    runs.remove_stale_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["keep.txt", "snapshots"] and os.listdir(tmp_path / "snapshots") == []
    cfg, params = tiny_transformer()
    checkpoints.save_checkpoint(str(tmp_path / "c.npz"), params, cfg, {"model": "transformer"})
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "c.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def test_run_files_are_the_runs_own(tmp_path):
    """What --overwrite may delete: the run's files by the names harness/runs.py gives them, nothing else."""
    out = tmp_path / "myrun"
    os.makedirs(out / "snapshots")
    for name in ("checkpoint.npz", "metrics.json", "log.csv", "mlp.npz", "metrics_mlp.json", "log_mlp.csv",
                 "geometry.json", "myrun_calibration.png", "geometry_myrun_frame.png",
                 "notes.txt", "other_calibration.png", "data.npz", ".lock"):
        (out / name).write_text("x")
    assert runs.run_files(str(out), models.FAMILIES) == sorted(
        ["checkpoint.npz", "geometry.json", "geometry_myrun_frame.png", "log.csv", "log_mlp.csv", "metrics.json",
         "metrics_mlp.json", "mlp.npz", "myrun_calibration.png", "snapshots"])
    assert runs.run_files(str(tmp_path / "none"), models.FAMILIES) == []


@pytest.mark.ci_only
def test_well_formed_archives_with_the_wrong_content_are_refused(tmp_path):
    cfg, params = tiny_transformer()
    meta = {"task": "bijection", "model": "transformer"}
    cases = {"shape": (dict(params, **{"lnf.g": np.ones(5, np.float32)}), meta),
             "missing": ({k: v for k, v in params.items() if k != "unembed.b"}, meta),
             "extra": (dict(params, stray=np.ones(2, np.float32)), meta),
             "nomodel": (params, {"task": "bijection"}),
             "unknown": (params, {"task": "bijection", "model": "rnn"})}
    messages = {"shape": "parameter 'lnf.g' has shape (5,) float32, its config asks for (4,) floats",
                "missing": "parameter 'unembed.b' is missing", "extra": "parameter 'stray' is not part of its config",
                "nomodel": "checkpoint 'nomodel.npz' does not name its model in its meta",
                "unknown": "checkpoint 'unknown.npz' holds a model 'rnn', which is not registered (known: "
                           "transformer, mlp, prefix-mlp, lstm, ssm)"}
    for name, (p, m) in cases.items():
        checkpoints.save_checkpoint(str(tmp_path / f"{name}.npz"), p, cfg, meta=m)
        assert_clear_error(run(["--eval-only", f"{name}.npz"], tmp_path), messages[name])
    # --resume reads the same way: a checkpoint without its model is refused in one line
    os.makedirs(tmp_path / "old")
    os.replace(tmp_path / "nomodel.npz", tmp_path / "old" / "checkpoint.npz")
    assert_clear_error(run([*QUICK, "--steps", "3", "--resume", "--out", str(tmp_path / "old")], tmp_path),
                       ("--resume: checkpoint", "does not name its model in its meta"))
    # an archive that declares gigabytes is refused before a byte of it is read
    import zipfile
    with zipfile.ZipFile(tmp_path / "huge.npz", "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("param:wte.npy", "w", force_zip64=True) as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(2100):
                f.write(chunk)
    assert_clear_error(run(["--eval-only", "huge.npz"], tmp_path), "declares 2.1 GiB of arrays")


def test_sticky_with_a_diverging_lr_stops_with_one_line(tmp_path):
    assert_clear_error(run(["--task", "sticky", "--steps", "20", "--lr", "1e30", "--out", str(tmp_path / "k")],
                           tmp_path), ("the loss (nan)", "is not finite; training stopped"))


# ----------------------------------------------------------------------------
# the run directory's lock: one owner at a time

def lock_file(run_dir, **owner):
    with open(os.path.join(run_dir, runs.LOCK), "w") as f:
        json.dump({"host": socket.gethostname(), "since": "earlier", "what": "train.py --out x", **owner}, f)


def owner_of(run_dir):
    with open(os.path.join(run_dir, runs.LOCK)) as f:
        return json.load(f)


def dead_pid():
    """The id of a process that has ended (reaped: no process has that id now, barring a reuse in between)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_live_owner_keeps_the_lock_and_a_second_acquire_is_refused_in_one_line(tmp_path):
    me = runs.process_start(os.getpid())
    assert me is not None and runs.process_start(dead_pid()) is None
    path = runs.acquire(str(tmp_path), "the first")
    assert path == str(tmp_path / runs.LOCK)
    assert {k: owner_of(tmp_path)[k] for k in ("host", "pid", "start", "what")} == \
        {"host": socket.gethostname(), "pid": os.getpid(), "start": me, "what": "the first"}
    with pytest.raises(runs.RunDirectoryBusy) as e:
        runs.acquire(str(tmp_path), "the second")
    assert "\n" not in str(e.value) and f"in use by another run (process {os.getpid()} on " in str(e.value)
    assert "the first" in str(e.value) and owner_of(tmp_path)["what"] == "the first"
    runs.release(str(tmp_path))
    assert not (tmp_path / runs.LOCK).exists()
    runs.acquire(str(tmp_path), "the third")                # free again
    runs.release(str(tmp_path))


@pytest.mark.parametrize("stale", ["dead pid", "reused pid"])
def test_a_lock_left_by_a_dead_process_is_taken_over(stale, tmp_path):
    """A lock whose process no longer runs: no process has its id, or one does but started at another
    time (the id was reused after the owner died)."""
    if stale == "dead pid":
        lock_file(tmp_path, pid=dead_pid(), start=12345)
    else:
        lock_file(tmp_path, pid=os.getpid(), start=runs.process_start(os.getpid()) + 1)
    runs.acquire(str(tmp_path), "the new owner")
    owner = owner_of(tmp_path)
    assert (owner["pid"], owner["start"], owner["what"]) == (os.getpid(), runs.process_start(os.getpid()), "the new owner")
    runs.release(str(tmp_path))
    assert not (tmp_path / runs.LOCK).exists()


def test_a_lock_that_cannot_be_judged_is_kept(tmp_path):
    """Another machine's lock (its process cannot be seen from here), and a lock being written right now
    (empty, seconds old), refuse a second run; an empty lock a minute old was left by a killed writer."""
    lock_file(tmp_path, host=socket.gethostname() + "-elsewhere", pid=dead_pid(), start=1)
    with pytest.raises(runs.RunDirectoryBusy, match="elsewhere"):
        runs.acquire(str(tmp_path), "me")
    runs.release(str(tmp_path))                             # not ours: release leaves it
    assert owner_of(tmp_path)["host"].endswith("-elsewhere")
    (tmp_path / runs.LOCK).write_text("")
    with pytest.raises(runs.RunDirectoryBusy, match="starting"):
        runs.acquire(str(tmp_path), "me")
    old = time.time() - 60
    os.utime(tmp_path / runs.LOCK, (old, old))
    runs.acquire(str(tmp_path), "me")
    assert owner_of(tmp_path)["pid"] == os.getpid()
    runs.release(str(tmp_path))


def test_a_second_train_py_into_a_busy_out_is_refused_then_runs_once_the_owner_is_dead(tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from harness import runs; runs.acquire(sys.argv[1], 'the holder'); "
                               "print('locked', flush=True); time.sleep(300)", str(out)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert_clear_error(run([*QUICK, "--steps", "2", "--out", str(out)], tmp_path),
                           f"--out '{out}' is in use by another run (process {holder.pid} on ")
        assert owner_of(out)["pid"] == holder.pid and os.listdir(out) == [runs.LOCK]
    finally:
        holder.kill()                                       # killed: its lock stays behind, stale
        holder.wait()
    assert owner_of(out)["pid"] == holder.pid
    proc = run([*QUICK, "--steps", "2", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert load(out / "checkpoint.npz")[2]["step"] == 2 and not (out / runs.LOCK).exists()


def test_the_default_run_directory_names_typed_settings_and_the_seed():
    """Two cells of a sweep over a setting or a seed never share a default directory; the documented paths
    (seed 0, no setting typed, a preset's own curriculum) keep their names."""
    import train
    out = lambda argv: train.parse_args(argv).out
    assert out([]) == os.path.join("runs", "bijection-transformer-default")
    assert out(["--task", "sawtooth"]) == os.path.join("runs", "sawtooth-transformer-default")   # preset's curriculum
    assert out(["--task", "hmm", "--K", "30", "--seed", "1"]) == os.path.join("runs", "hmm-transformer-default-n_obs30-s1")
    assert out(["--task", "sawtooth", "--curriculum", "5:100"]) == os.path.join(
        "runs", "sawtooth-transformer-default-curriculum5-100")
    assert out(["--seed", "2", "--out", "elsewhere"]) == "elsewhere"


def test_a_direct_run_reports_its_readings_and_prints_them(tmp_path, capsys):
    """(Not in tests/test_hops.py: a training run, too slow as plain Python.) A direct hops run writes metrics["readings"] by h (what depth_rules read) and prints one line per h; a
    chain-of-thought run, whose answers are read running free, has none."""
    import json
    import train
    common = ["--task", "hops", "--preset", "quick", "--steps", "2", "--eval-seqs", "60", "--no-baseline",
              "--no-geometry", "--quiet"]
    train.main([*common, "--out", str(tmp_path / "direct")])
    m = json.loads((tmp_path / "direct" / "metrics.json").read_text())
    assert sorted(m["readings"]) == ["1", "2", "3", "4"]
    for h, r in m["readings"].items():
        assert r["lookup"]["n"] + r["elimination"]["n"] == m["groups"][f"h={h}"]["n_answers"]
        if r["lookup"]["n"]:
            assert r["lookup"]["accuracy"] == pytest.approx(m["groups"][f"h={h}"]["accuracy"])
    assert "transformer, h=1: lookup (" in capsys.readouterr().out
    train.main([*common, "--cot", "--out", str(tmp_path / "cot")])
    assert "readings" not in json.loads((tmp_path / "cot" / "metrics.json").read_text())



def test_the_progress_bar_says_when_a_curriculum_makes_batches_easier():
    """The bar's floor is the exact posterior's loss on the batch, lower while a curriculum stage runs: it
    names the step the curricula end, the largest of every stage of every curriculum (hops: 3,500, not the
    symbols' 1,500), 0 where there is none."""
    import train
    assert train.curriculum_until({"symbol_curriculum": "2:500,4:1000,8:1500", "hop_curriculum": "1:1500,2:2500,4:3500",
                                   "max_hops": 4}) == 3500
    assert train.curriculum_until({"pair_curriculum": "2:500,4:1500", "filler": 8}) == 1500
    assert train.curriculum_until({"pair_curriculum": "", "filler": 8}) == 0 and train.curriculum_until({}) == 0


def test_a_run_records_the_commit_of_its_code(tmp_path):
    """versions()["commit"]: the checkout's commit, "+changes" once a tracked file differs from it (an untracked
    file, as a run's output, is not a change), None outside a git checkout."""
    import shutil
    import subprocess
    from harness import checkpoints
    if shutil.which("git") is None:
        pytest.skip("no git")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout
    git("init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = git("rev-parse", "--short=12", "HEAD").strip()
    assert checkpoints.commit(str(repo)) == head and len(head) == 12
    (repo / "runs").mkdir()
    (repo / "runs" / "metrics.json").write_text("{}")
    assert checkpoints.commit(str(repo)) == head
    (repo / "a.py").write_text("x = 2\n")
    assert checkpoints.commit(str(repo)) == head + "+changes"
    outside = tmp_path / "plain"
    outside.mkdir()
    assert checkpoints.commit(str(outside)) is None


def test_versions_are_read_once_a_process_and_handed_out_as_copies(monkeypatch):
    """A run records versions() at every checkpoint: git is asked once a process (the code a process runs is
    what it imported, whatever is checked out later), and a caller changing its dict changes no other's."""
    from harness import checkpoints
    asked = []
    monkeypatch.setattr(checkpoints, "commit", lambda: asked.append(1) or "abc")
    checkpoints._versions.cache_clear()
    try:
        first = checkpoints.versions()
        first["commit"] = "changed by a caller"
        assert checkpoints.versions()["commit"] == "abc" and len(asked) == 1
    finally:
        checkpoints._versions.cache_clear()
