"""train.py end to end, as a user runs it: bad input, resume, determinism, the NaN guard, Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time

import numba
import numpy as np
import pytest

import bayesattn as ba
import optim
import checkpoints

HERE = os.path.dirname(os.path.abspath(__file__))
QUICK = ["--preset", "quick", "--quiet", "--no-baseline", "--no-geometry", "--eval-seqs", "200"]


def run(args, tmp_path, timeout=900):
    """train.py with args in tmp_path; figures into tmp_path/figures (the sticky task draws none)."""
    figures = [] if "sticky" in args else ["--figures", str(tmp_path / "figures")]
    return subprocess.run([sys.executable, os.path.join(HERE, "train.py"), *args, *figures],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def assert_clear_error(proc, expected):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train.py: error:"), proc.stderr
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize("args, expected", [
    (["--task", "bijektion"], "--task 'bijektion': allowed are bijection, sawtooth, hmm, sticky"),
    (["--model", "rnn"], "--model 'rnn': allowed are transformer, mlp, prefix-mlp"),
    (["--baseline", "lstm"], "--baseline 'lstm': allowed are mlp, prefix-mlp"),
    (["--init", "zeros"], "--init 'zeros': allowed are gpt2, fan-in"),
    (["--task", "hmm", "--V", "10"], "--V does not apply to --task hmm (it belongs to bijection and sawtooth)"),
    (["--K", "10"], "--K does not apply to --task bijection (it belongs to hmm)"),
    (["--curriculum", "5:100"], "--curriculum does not apply to --task bijection (it belongs to sawtooth)"),
    (["--task", "sawtooth", "--curriculum", "30:100"], "each alphabet must lie in 1..20 and the steps must increase"),
    (["--task", "sawtooth", "--curriculum", "5:100,10:50"], "each alphabet must lie in 1..20 and the steps must"),
    (["--task", "sawtooth", "--curriculum", "five"], "expected stages alphabet:until_step"),
    (["--chain", "authors"], "--chain does not apply to --task bijection (it belongs to sticky)"),
    (["--task", "sticky", "--chain", "0.35"], "--chain '0.35': allowed are exact, authors"),
    (["--task", "sticky", "--deep", "--compare-em"], "--compare-em and --deep are two experiments"),
    (["--preset", "huge"], "--preset 'huge': allowed are quick, default, paper"),
    (["--steps", "0"], "--steps 0: must be a positive integer"),
    (["--batch", "-3"], "--batch -3: must be a positive integer"),
    (["--width", "0"], "--width 0: must be a positive integer"),
    (["--heads", "3"], "--heads 3 does not divide --width 64"),
    (["--V", "1"], "--V 1: the bijection needs at least 2 keys"),
    (["--task", "hmm", "--K", "0"], "--K 0: the HMM needs at least 1 observation"),
    (["--lr", "0"], "--lr 0.0: must be a finite number > 0"),
    (["--lr=-1e-3"], "--lr -0.001: must be a finite number > 0"),
    (["--lr", "inf"], "--lr inf: must be a finite number > 0"),
    (["--lr", "nan"], "--lr nan: must be a finite number > 0"),
    (["--seed", "-1"], "--seed -1: must be an integer in 0..2^63-1"),
    (["--eval-seqs", "2"], "--eval-seqs 2: must be at least 4 (the single-sequence figure draws four)"),
    (["--warmup", "-1"], "--warmup -1: must be a non-negative integer"),
    (["--batch", "1000000"], "a training step would need about"),
    (["--width", "100000", "--heads", "1"], "GiB are available"),
    (["--kernels", "cuda"], "--kernels 'cuda': allowed are numba, numpy"),
    (["--task", "sticky", "--stop-after", "5"], "--stop-after: not used by --task sticky"),
    (["--task", "sticky", "--eval-seqs", "100"], "--eval-seqs: not used by --task sticky"),
    (["--task", "sticky", "--figures", "x"], "--figures: not used by --task sticky"),
    (["--resume", "--overwrite"], "--resume and --overwrite: continue the run in --out or replace it, not both"),
    (["--dtype", "float16"], "--dtype 'float16': allowed are float32, float64"),
    (["--pos", "rope"], "--pos 'rope': allowed are learned, sinusoidal"),
    (["--lr-floor", "1.5"], "--lr-floor 1.5: must lie in [0, 1] (a fraction of --lr)"),
    (["--weight-decay", "1.5"], "--weight-decay 1.5: must lie in [0, 1)"),
    (["--weight-decay=-0.1"], "--weight-decay -0.1: must lie in [0, 1)"),
    (["--threads", "0"], "--threads 0: must lie in 1.."),
    (["--threads", "999"], "--threads 999: must lie in 1.."),
    (["--steps", "many"], "invalid int value: 'many'"),
    (["--eval-only", "missing.npz"], "checkpoint 'missing.npz' does not exist"),
    (["--out", "/proc/no/such/dir"], "--out '/proc/no/such/dir' cannot be written"),
])
def test_bad_input_gives_one_clear_line(args, expected, tmp_path):
    """Each bad input gets its one line and exit code 2, and nothing already in --out changes."""
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


def test_corrupt_and_mismatched_checkpoints(tmp_path):
    out = tmp_path / "run"
    assert run([*QUICK, "--steps", "5", "--out", str(out)], tmp_path).returncode == 0
    ckpt = out / "checkpoint.npz"
    data = ckpt.read_bytes()
    (tmp_path / "truncated.npz").write_bytes(data[: len(data) // 2])
    assert_clear_error(run(["--eval-only", "truncated.npz"], tmp_path), "is truncated or not a bayesattn checkpoint")
    (tmp_path / "noise.npz").write_bytes(b"not a checkpoint at all")
    assert_clear_error(run(["--eval-only", "noise.npz"], tmp_path), "is truncated or not a bayesattn checkpoint")
    # --resume with another task or configuration
    assert_clear_error(run([*QUICK, "--steps", "5", "--out", str(out), "--resume", "--task", "hmm"], tmp_path),
                       "has task='bijection' but this run asks for 'hmm'")
    assert_clear_error(run([*QUICK, "--steps", "5", "--out", str(out), "--resume", "--lr-floor", "0"], tmp_path),
                       "has lr_floor=0.1 but this run asks for 0.0")
    assert_clear_error(run([*QUICK, "--steps", "5", "--out", str(out), "--resume", "--weight-decay", "0"], tmp_path),
                       "has weight_decay=0.01 but this run asks for 0.0")
    assert_clear_error(run([*QUICK, "--steps", "5", "--out", str(out), "--resume", "--width", "16"], tmp_path),
                       "holds width 32, 2 layers, 2 heads, not the 16/2/2 asked for")
    assert_clear_error(run([*QUICK, "--steps", "5", "--out", str(tmp_path / "empty"), "--resume"], tmp_path),
                       "does not exist")
    assert ckpt.read_bytes() == data                           # nothing already written was lost


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert run([*QUICK, "--steps", "16", "--out", str(a)], tmp_path).returncode == 0
    stopped = run([*QUICK, "--steps", "16", "--out", str(b), "--stop-after", "7"], tmp_path)
    assert stopped.returncode == 0 and "stopped at step 7 of 16" in stopped.stdout
    assert run([*QUICK, "--steps", "16", "--out", str(b), "--resume"], tmp_path).returncode == 0
    pa, _, ma, sa = checkpoints.load_checkpoint(str(a / "checkpoint.npz"))
    pb, _, mb, sb = checkpoints.load_checkpoint(str(b / "checkpoint.npz"))
    assert ma["step"] == mb["step"] == 16 and sa["t"] == sb["t"] == 16
    for name in pa:
        assert np.array_equal(pa[name], pb[name]), name
        assert np.array_equal(sa["m"][name], sb["m"][name]) and np.array_equal(sa["v"][name], sb["v"][name]), name
    strip = lambda p: [row.rsplit(",", 1)[0] for row in p.read_text().splitlines()]   # drop wall time
    assert strip(a / "log.csv") == strip(b / "log.csv")
    assert json.loads((a / "metrics.json").read_text())["kl_bits"] == json.loads((b / "metrics.json").read_text())["kl_bits"]


def test_same_seed_same_metrics(tmp_path):
    metrics = []
    for name in ("x", "y"):
        assert run([*QUICK, "--steps", "12", "--out", str(tmp_path / name)], tmp_path).returncode == 0
        m = json.loads((tmp_path / name / "metrics.json").read_text())
        m.pop("seconds")
        metrics.append(m)
    assert metrics[0] == metrics[1]


def test_quick_preset_lowers_its_loss(tmp_path):
    proc = run([*QUICK, "--out", str(tmp_path / "q")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    loss = np.loadtxt(tmp_path / "q" / "log.csv", delimiter=",", skiprows=1)[:, 1]
    assert loss[-10:].mean() < loss[:10].mean() - 0.03, (loss[:10].mean(), loss[-10:].mean())
    assert "exact Bayes" in proc.stdout and (tmp_path / "figures" / "q_calibration.png").exists()


@pytest.mark.parametrize("floor", ["0", "0.1", "1"])
def test_lr_floor_sets_the_end_of_the_cosine(floor, tmp_path):
    out = tmp_path / "f"
    assert run([*QUICK, "--steps", "30", "--warmup", "5", "--lr", "2e-3", "--lr-floor", floor, "--out", str(out)],
               tmp_path).returncode == 0
    logged = np.loadtxt(out / "log.csv", delimiter=",", skiprows=1)[:, 3]
    want = [optim.lr_schedule(s, 2e-3, 5, 30, min_lr=2e-3 * float(floor)) for s in range(30)]
    assert np.allclose(logged, want, rtol=1e-3, atol=0), (logged, want)
    assert json.loads((out / "metrics.json").read_text())["steps"] == 30


def test_weight_decay_and_threads_are_applied_and_recorded(tmp_path):
    """The same run with and without weight decay differs; the checkpoint records both settings."""
    params = {}
    for wd in ("0", "0.5"):
        out = tmp_path / f"wd{wd}"
        assert run([*QUICK, "--steps", "8", "--weight-decay", wd, "--threads", "1", "--out", str(out)],
                   tmp_path).returncode == 0
        params[wd], _, meta, _ = checkpoints.load_checkpoint(str(out / "checkpoint.npz"))
        assert meta["weight_decay"] == float(wd) and meta["threads"] == 1
    # decay shrinks the matrices: W <- W - lr * wd * W each step, on top of the (nearly equal) Adam steps
    assert np.abs(params["0.5"]["blocks.0.mlp.w1"]).sum() < np.abs(params["0"]["blocks.0.mlp.w1"]).sum()
    if numba.config.NUMBA_NUM_THREADS >= 2:                  # resuming on another thread count is refused
        assert_clear_error(run([*QUICK, "--steps", "8", "--weight-decay", "0", "--threads", "2", "--resume",
                                "--out", str(tmp_path / "wd0")], tmp_path), "has threads=1 but this run asks for 2")


def test_presets_set_weight_decay_and_threads_unless_given():
    import train
    paper = train.parse_args(["--preset", "paper"])
    assert (paper.batch, paper.steps, paper.weight_decay, paper.threads) == (16, 130000, 0.0, 1)
    given = train.parse_args(["--preset", "paper", "--weight-decay", "0.01", "--batch", "256"])
    assert (given.batch, given.weight_decay) == (256, 0.01)
    default = train.parse_args([])
    assert default.weight_decay == 0.0 and default.threads == numba.config.NUMBA_NUM_THREADS
    assert default.heads == 2 and default.width // default.heads >= 20      # head size >= the 20 hypotheses
    hmm = train.parse_args(["--task", "hmm"])
    assert hmm.weight_decay == train.WEIGHT_DECAY                         # a preset without it gets the global


def test_threads_flag_sets_numbas_thread_count(tmp_path):
    import train
    before = numba.get_num_threads()
    if before == 1:
        pytest.skip("one Numba thread already: the flag's effect cannot be seen")
    try:
        train.main([*QUICK, "--steps", "2", "--threads", "1", "--out", str(tmp_path / "t"),
                    "--figures", str(tmp_path / "figures")])
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("task", ["bijection", "hmm"])
def test_soft_targets_are_used_and_reported(task, tmp_path):
    out = tmp_path / "s"
    proc = run([*QUICK, "--task", task, "--soft", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "metrics.json").read_text())["targets"] == "soft"
    _, cfg, _, _ = checkpoints.load_checkpoint(str(out / "checkpoint.npz"))
    # HMM: learned positions past the training length (52 + 20) reuse its last row; the bijection has none
    assert cfg.pos_limit == (72 if task == "hmm" else 0) and cfg.max_len == (102 if task == "hmm" else 38)
    log = np.loadtxt(out / "log.csv", delimiter=",", skiprows=1)
    # with soft targets the logged loss is the cross-entropy against the posterior and the logged floor
    # is the posterior's entropy: their difference is a KL, never negative
    assert np.all(log[:, 1] >= log[:, 2] - 1e-4), (log[:, 1] - log[:, 2]).min()


def test_nan_guard_stops_with_the_step(tmp_path):
    proc = run([*QUICK, "--lr", "1e30", "--out", str(tmp_path / "n")], tmp_path)
    assert_clear_error(proc, "is not finite; training stopped")
    assert "step " in proc.stderr


def test_ctrl_c_saves_a_checkpoint(tmp_path):
    out = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), *QUICK, "--steps", "100000",
                             "--out", str(out), "--figures", str(tmp_path / "figures")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:                              # wait until training is under way
        if (out / "log.csv").exists() and len((out / "log.csv").read_text().splitlines()) > 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "interrupted after step" in err and "Traceback" not in err, err
    _, _, meta, opt_state = checkpoints.load_checkpoint(str(out / "checkpoint.npz"))
    assert meta["step"] >= 3 and opt_state["t"] == meta["step"]


@pytest.mark.parametrize("args, expected", [
    (["--task", "sticky", "--preset", "huge"], "--preset: not used by --task sticky"),
    (["--task", "sticky", "--model", "mlp", "--width", "8"], "--model, --width: not used by --task sticky"),
    (["--task", "sticky", "--out", "/proc/nope"], "--out '/proc/nope' cannot be written"),
])
def test_sticky_rejects_flags_it_does_not_use(args, expected, tmp_path):
    assert_clear_error(run(args, tmp_path), expected)


def test_eval_only_reads_mlp_checkpoints_and_snapshots(tmp_path):
    out = tmp_path / "m"
    proc = run(["--preset", "quick", "--quiet", "--no-geometry", "--eval-seqs", "50", "--task", "hmm", "--steps", "4",
                "--width", "64", "--heads", "4", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for ckpt, name in ((out / "mlp.npz", "mlp"), (sorted((out / "snapshots").iterdir())[-1], "transformer")):
        proc = run(["--eval-only", str(ckpt), "--eval-seqs", "50"], tmp_path)
        assert proc.returncode == 0 and proc.stdout.splitlines()[2].startswith(name), proc.stderr


def test_evaluate_scores_the_exact_posterior_zero_and_a_mixture_as_computed():
    import train
    import windtunnels as wt
    batch = wt.bijection_batch(np.random.default_rng(0), 50, 6)
    m, _ = train.evaluate(lambda tok: batch["posterior"].copy(), batch)
    for key in ("entropy_mae_bits", "entropy_mae_seq_bits", "kl_bits", "excess_ce_bits", "impossible_mass"):
        assert abs(m[key]) < 1e-12, (key, m[key])
    eps = 0.01
    q = (1 - eps) * batch["posterior"] + eps / 6                   # leaks eps / 6 onto every value
    m, _ = train.evaluate(lambda tok: q, batch)
    cols = np.flatnonzero(batch["mask"][0] > 0)
    ruled_out = (batch["posterior"][:, cols] == 0).sum(-1)           # values already seen, per position
    assert np.isclose(m["impossible_mass"], (eps / 6 * ruled_out).mean(), rtol=1e-12)
    assert [r["impossible_mass"] for r in m["per_position"]] == pytest.approx(eps / 6 * np.arange(len(cols)))
    assert m["kl_bits"] > 0 and m["per_position"][0]["impossible_mass"] == 0.0


@pytest.mark.parametrize("task", ["bijection", "sawtooth", "hmm"])
def test_authors_mlp_learns_exactly_the_prior(task):
    """The authors' MLP sees one token and its position, so trained it reaches the prior's gap
    (windtunnels.prior_gap_bits: 1.107, 1.849, about 0.42 bits), not less. It starts from loud output
    weights, far from the prior, so only training can bring it there."""
    import mlp_baseline as mb
    import train
    import windtunnels as wt
    spec = train.task_spec(task)
    mcfg = mb.MLPConfig(spec["vocab"], spec["classes"], spec["max_len"], width=16, n_blocks=1, inputs="token")
    params = mb.mlp_init_params(mcfg, 0)
    params["mlp.out.w"] = np.random.default_rng(1).normal(0, 1.0, params["mlp.out.w"].shape).astype(np.float32)
    gap = wt.prior_gap_bits(task, n=20000)
    held_out = spec["batch"](np.random.default_rng(99), 500)
    predict = lambda tok: mb.mlp_predict_proba(params, tok, mcfg)
    before = train.evaluate(predict, held_out)[0]["entropy_mae_bits"]
    assert abs(before - gap) > 0.1, (before, gap)
    state = optim.adamw_init(params)
    for step in range(300):
        b = spec["batch"](np.random.default_rng((5, step)), 64)
        loss, grads = mb.mlp_loss_and_grads(params, b["tokens"], b["targets"], b["mask"], mcfg)
        optim.clip_grad_norm(grads, 1.0)
        optim.adamw_step(params, grads, state, optim.lr_schedule(step, 1e-2, 20, 300, min_lr=1e-3))
    m = train.evaluate(predict, held_out)[0]
    assert abs(m["entropy_mae_bits"] - gap) < 0.03, (task, m["entropy_mae_bits"], gap)
    assert abs(m["kl_bits"] - gap) < 0.03, (task, m["kl_bits"], gap)   # KL(post || uniform) = log2 K - H(post)


def test_evaluate_keeps_the_sawtooth_query_apart():
    """The paper's sawtooth curve covers the L value positions; the query is scored on its own. A model that is
    exact everywhere but puts 1/2 on the query's answer (1/2 spread over the other V - 1 values) has paper
    metric, per-sequence MAE and KL 0, and at the query KL = log2(1 / (1/2)) = 1 bit and accuracy 1."""
    import train
    import windtunnels as wt
    V = 5
    batch = wt.sawtooth_batch(np.random.default_rng(0), 30, V=V)
    q = batch["posterior"].copy()
    q[:, -1] = np.where(q[:, -1] == 1.0, 0.5, 0.5 / (V - 1))
    m, _ = train.evaluate(lambda tok: q, batch)
    for key in ("entropy_mae_bits", "entropy_mae_seq_bits", "kl_bits", "excess_ce_bits"):
        assert abs(m[key]) < 1e-12, (key, m[key])
    assert len(m["per_position"]) == V - 1                        # the values only
    assert m["query"]["kl_bits"] == pytest.approx(1.0, abs=1e-12) and m["query"]["accuracy"] == 1.0
    q[:, -1] = np.roll(batch["posterior"][:, -1], 1, axis=-1) * 0.9 + 0.1 / V   # the argmax is now wrong
    m, _ = train.evaluate(lambda tok: q, batch)
    assert m["query"]["accuracy"] == 0.0 and m["query"]["kl_bits"] == pytest.approx(-np.log2(0.1 / V))


def test_sawtooth_presets_reach_the_model(tmp_path):
    """The preset's init and curriculum are what the run records and what the model was built with."""
    import train
    args = train.parse_args(["--task", "sawtooth"])
    assert (args.init, args.curriculum, args.layers, args.heads) == ("fan-in", "5:1000", 2, 2)
    out = tmp_path / "s"
    assert run([*QUICK, "--task", "sawtooth", "--steps", "3", "--out", str(out)], tmp_path).returncode == 0
    params, cfg, meta, _ = checkpoints.load_checkpoint(str(out / "checkpoint.npz"))
    assert cfg.init == "fan-in" and meta["init"] == "fan-in" and meta["curriculum"] == "5:30"
    assert 0.5 < float(np.std(params["wte"])) < 2.0                 # N(0, 1) embeddings, not N(0, 0.02)
    spec = train.task_spec("sawtooth", curriculum="5:30")
    early, late = (spec["batch"](np.random.default_rng(0), 50, step) for step in (29, 30))
    assert max(len(set(k)) for k in early["tokens"][:, 0:38:2]) <= 5     # 5-key alphabets before step 30
    assert max(len(set(k)) for k in late["tokens"][:, 0:38:2]) > 5       # then the task itself


def test_a_finished_run_is_never_overwritten_silently(tmp_path):
    out = tmp_path / "r"
    assert run([*QUICK, "--steps", "12", "--out", str(out)], tmp_path).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    snaps = sorted(p.name for p in (out / "snapshots").iterdir())
    (out / "notes.txt").write_text("mine")
    assert_clear_error(run([*QUICK, "--steps", "5", "--out", str(out)], tmp_path),
                       "already holds a run (checkpoint.npz, log.csv, metrics.json, ...): continue it with --resume, "
                       "replace it with --overwrite, or give another --out")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "notes.txt"} == before
    proc = run([*QUICK, "--steps", "5", "--out", str(out), "--overwrite"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, _, meta, _ = checkpoints.load_checkpoint(str(out / "checkpoint.npz"))
    assert meta["step"] == 5 and (out / "notes.txt").read_text() == "mine"          # only the run's own files go
    assert sorted(p.name for p in (out / "snapshots").iterdir()) != snaps            # old snapshots do not linger
    assert max(int(p.name[5:12]) for p in (out / "snapshots").iterdir()) == 5


def test_resume_refuses_a_stop_before_its_checkpoint_and_another_eval_set(tmp_path):
    out = tmp_path / "s"
    assert run([*QUICK, "--steps", "16", "--stop-after", "8", "--out", str(out)], tmp_path).returncode == 0
    data = (out / "checkpoint.npz").read_bytes()
    assert_clear_error(run([*QUICK, "--steps", "16", "--stop-after", "6", "--resume", "--out", str(out)], tmp_path),
                       "--stop-after 6: the checkpoint")
    assert_clear_error(run([*QUICK[:-1], "300", "--steps", "16", "--resume", "--out", str(out)], tmp_path),
                       "has eval_seqs=200 but this run asks for 300")
    assert (out / "checkpoint.npz").read_bytes() == data


def test_eval_only_scores_the_runs_own_held_out_set(tmp_path):
    out = tmp_path / "e"
    assert run([*QUICK, "--steps", "6", "--seed", "3", "--out", str(out)], tmp_path).returncode == 0
    kl = json.loads((out / "metrics.json").read_text())["kl_bits"]
    import train
    m = train.main(["--eval-only", str(out / "checkpoint.npz"), "--figures", str(tmp_path / "f"), "--threads", "1"])
    assert m["kl_bits"] == pytest.approx(kl, rel=1e-9)                 # seed 3's held-out set, and its 200 sequences


def test_sigterm_saves_a_checkpoint_like_ctrl_c(tmp_path):
    out = tmp_path / "t"
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), *QUICK, "--steps", "100000",
                             "--out", str(out), "--figures", str(tmp_path / "figures")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "log.csv").exists() and
                                          len((out / "log.csv").read_text().splitlines()) > 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "interrupted after step" in err, err
    _, _, meta, opt_state = checkpoints.load_checkpoint(str(out / "checkpoint.npz"))
    assert meta["step"] >= 3 and opt_state["t"] == meta["step"]


def test_saving_refuses_non_finite_weights_and_reports_a_full_disk(tmp_path, monkeypatch):
    import training
    cfg = ba.Config(vocab_size=5, n_classes=3, max_len=4, d_model=4, n_layers=1, n_heads=1)
    params = ba.init_params(cfg)
    path = tmp_path / "checkpoint.npz"
    training.save_params(str(path), params, cfg, {"step": 1})
    good = path.read_bytes()
    params["blocks.0.attn.wq"][0, 0] = np.inf
    with pytest.raises(training.TrainingStopped, match="weights blocks.0.attn.wq are not finite"):
        training.save_params(str(path), params, cfg, {"step": 2}, step=2)
    assert path.read_bytes() == good                                   # the last good checkpoint stays

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(training, "save_checkpoint", full)
    params["blocks.0.attn.wq"][0, 0] = 0.0
    with pytest.raises(training.TrainingStopped, match="checkpoint.npz cannot be written .No space left on device."):
        training.save_params(str(path), params, cfg, {"step": 3}, step=3)
    assert path.read_bytes() == good


def test_stale_temporaries_are_removed_and_checkpoints_get_the_usual_mode(tmp_path):
    import training
    os.makedirs(tmp_path / "snapshots")
    for name in (".tmp-abc.npz", "snapshots/.tmp-def.npz", "keep.txt"):
        (tmp_path / name).write_text("x")
    training.remove_stale_temporaries(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["keep.txt", "snapshots"] and os.listdir(tmp_path / "snapshots") == []
    cfg = ba.Config(vocab_size=5, n_classes=3, max_len=4, d_model=4, n_layers=1, n_heads=1)
    checkpoints.save_checkpoint(str(tmp_path / "c.npz"), ba.init_params(cfg), cfg)
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "c.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def test_well_formed_archives_with_the_wrong_content_are_refused(tmp_path):
    cfg = ba.Config(vocab_size=5, n_classes=3, max_len=4, d_model=4, n_layers=1, n_heads=1)
    params = ba.init_params(cfg)
    cases = {"shape": dict(params, **{"lnf.g": np.ones(5, np.float32)}),
             "missing": {k: v for k, v in params.items() if k != "unembed.b"},
             "extra": dict(params, stray=np.ones(2, np.float32))}
    messages = {"shape": "parameter 'lnf.g' has shape (5,) float32, its config asks for (4,) floats",
                "missing": "parameter 'unembed.b' is missing", "extra": "parameter 'stray' is not part of its config"}
    for name, p in cases.items():
        checkpoints.save_checkpoint(str(tmp_path / f"{name}.npz"), p, cfg, meta={"task": "bijection"})
        assert_clear_error(run(["--eval-only", f"{name}.npz"], tmp_path), messages[name])
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
                           tmp_path), "the loss (nan) is not finite; training stopped")
