"""Benchmark of the other families: one training step of the LSTM and of the selective SSM at each preset's
shape, against the same model in PyTorch on this CPU (PyTorch optional: without it, our step alone).

    python -m bench.recurrent                     # every family and shape below
    python -m bench.recurrent --shapes hmm-paper --repeats 20
    python -m bench.recurrent --families lstm     # one family
    python -m bench.recurrent --quick             # tiny shapes, few repeats: a smoke test

The shapes are the task presets' batches with each family's preset width (its PRESETS: the transformer's
parameter count); the step is training.train_step on the fast path, as train.py takes it (bench.ours_step).
PyTorch gets the same float32 parameters, batch and thread count, the same masked cross-entropy, AdamW with
decay on the same tensors, and gradient clipping:
    lstm  the embedding, one torch.nn.LSTM per layer (its fused oneDNN kernel on CPU: a hard opponent) with our
          gate matrix split into weight_ih and weight_hh (the gate order i, f, g, o is PyTorch's too), the
          residual stream, the final LayerNorm and the head
    ssm   the same Mamba block in plain PyTorch (LayerNorm, in-projection, depthwise causal convolution,
          SiLU, the step's projection and softplus, the scan, the gate, out-projection), the scan both as a
          loop over time and chunked (within a chunk of CHUNK steps the states follow from cumulative sums of
          the log decays); the faster of the two is the opponent
Each pair is timed alternately (bench.interleaved); every number is a median with its IQR and the load. Then
the roofline line (bench/roofline.py): the step's counted FLOPs (models.step_flops) against the same run's
2-thread sgemm, and each op's own time inside the step by category, the family's recurrences apart.
"""

if not __package__:                 # run as a file, its folder-qualified imports cannot resolve
    raise SystemExit("bench/recurrent.py: run it as python -m bench.recurrent, from the repository's folder")

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench/transformer.py: BLAS threads fight Numba's

import argparse  # noqa: E402
import sys  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

from bench import roofline  # noqa: E402
from bench import transformer as bench  # noqa: E402
import kernels  # noqa: E402
import layers  # noqa: E402
import models  # noqa: E402
from tunnels import tasks  # noqa: E402

FAMILIES = ("lstm", "ssm")
SHAPES = {"bij-default": ("bijection", "default"), "bij-paper": ("bijection", "paper"),
          "saw-default": ("sawtooth", "default"), "hmm-default": ("hmm", "default"), "hmm-paper": ("hmm", "paper")}
QUICK_SHAPES = {"tiny-bij": ("bijection", "quick"), "tiny-hmm": ("hmm", "quick")}
CHUNK = 8               # the chunked scan's chunk length


def setup(family, shape):
    """-> cfg, float32 parameters (seed 0), one batch of the preset's size (seed 0)."""
    task, preset = {**SHAPES, **QUICK_SHAPES}[shape]
    s = tasks.settings(task)
    sizes = tasks.sizes(task, s)
    fields = dict(vocab_size=sizes["vocab"], n_classes=sizes["classes"], max_len=sizes["max_len"], dtype="float32")
    sized = getattr(models.module(family), "PRESETS", {}).get(task, {}).get(preset, {})
    cfg = (models.match_capacity(family, fields, sized["params"]) if "params" in sized
           else models.make_config(family, **fields))
    batch = tasks.sample(task, np.random.default_rng(0), tasks.task(task).PRESETS[preset]["batch"], s)
    return cfg, models.init_params(family, cfg, 0), batch


def _torch_common(family, params, batch):
    """The PyTorch parameters, the batch as tensors, and the optimiser step around a loss closure."""
    import torch
    import torch.nn.functional as F
    P = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    tokens, targets = torch.from_numpy(batch["tokens"]), torch.from_numpy(batch["targets"]).reshape(-1)
    mask = torch.from_numpy(batch["mask"].astype(np.float32)).reshape(-1)
    decay = models.decay_set(family, params)

    def head_loss(x):
        """The final LayerNorm, the head and the masked cross-entropy of the stream x (B, T, C)."""
        x = F.layer_norm(x, (x.shape[-1],), P["lnf.g"], P["lnf.b"], eps=layers.LN_EPS)
        logits = (x @ P["unembed.w"] + P["unembed.b"]).reshape(len(targets), -1)
        return (F.cross_entropy(logits, targets, reduction="none") * mask).sum() / mask.sum()

    def stepper(loss_fn, extra_params=()):
        return bench.torch_stepper(list(P.items()) + list(extra_params), decay, loss_fn)
    return torch, F, P, tokens, head_loss, stepper


def torch_lstm(cfg, params, batch):
    """-> (closure taking one PyTorch step of our LSTM, its loss at the initial parameters)."""
    torch, F, P, tokens, head_loss, stepper = _torch_common("lstm", params, batch)
    C = cfg.d_model
    cells = []
    for l in range(cfg.n_layers):
        cell = torch.nn.LSTM(C, C, batch_first=True)
        w, b = params[f"lstm.{l}.w"], params[f"lstm.{l}.b"]          # rows [x_t, h_{t-1}], columns i, f, g, o
        with torch.no_grad():
            cell.weight_ih_l0.copy_(torch.from_numpy(w[:C].T.copy()))
            cell.weight_hh_l0.copy_(torch.from_numpy(w[C:].T.copy()))
            cell.bias_ih_l0.copy_(torch.from_numpy(b.copy()))
            cell.bias_hh_l0.zero_()
        cells.append(cell)
    # the LSTM's own tensors decay as ours do: the matrices, not the biases (lstm.decayed)
    extra = [(f"lstm.{l}.w" if "weight" in n else f"lstm.{l}.b", p) for l, c in enumerate(cells)
             for n, p in c.named_parameters()]
    for l in range(cfg.n_layers):
        del P[f"lstm.{l}.w"], P[f"lstm.{l}.b"]

    def loss_fn():
        x = P["wte"][tokens] + (P["wpe"][:tokens.shape[1]] if "wpe" in P else 0.0)
        for cell in cells:
            h, _ = cell(x)
            x = x + h if cfg.residual == "on" else h
        return head_loss(x)
    return stepper(loss_fn, extra)


def torch_ssm(cfg, params, batch, chunked):
    """-> (closure taking one PyTorch step of our SSM, its loss at the initial parameters); the scan a loop
    over time, or chunked (CHUNK steps at a time)."""
    torch, F, P, tokens, head_loss, stepper = _torch_common("ssm", params, batch)
    C, D, N, R, W = cfg.d_model, cfg.expand * cfg.d_model, cfg.d_state, cfg.dt_rank, cfg.d_conv

    def scan(u, dt, A, Bm, Cm, Dskip):
        Bsz, T, _ = u.shape
        h = u.new_zeros(Bsz, D, N)
        ys = []
        if not chunked:
            for t in range(T):
                h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * u[:, t])[:, :, None] * Bm[:, t, None, :]
                ys.append((h * Cm[:, t, None, :]).sum(-1))
            return torch.stack(ys, 1) + Dskip * u
        for s in range(0, T, CHUNK):
            e = min(s + CHUNK, T)
            la = torch.cumsum(dt[:, s:e, :, None] * A, dim=1)               # (B, L, D, N) log decay from s
            w = (dt[:, s:e] * u[:, s:e])[..., None] * Bm[:, s:e, None, :]  # (B, L, D, N) the writes
            hs = torch.exp(la) * (h[:, None] + torch.cumsum(torch.exp(-la) * w, dim=1))
            ys.append((hs * Cm[:, s:e, None, :]).sum(-1))
            h = hs[:, -1]
        return torch.cat(ys, 1) + Dskip * u

    def loss_fn():
        x = P["wte"][tokens]
        T = x.shape[1]
        for l in range(cfg.n_layers):
            pre = f"blocks.{l}."
            v = F.layer_norm(x, (C,), P[pre + "ln.g"], P[pre + "ln.b"], eps=layers.LN_EPS)
            uz = v @ P[pre + "in_proj.w"]
            u, z = uz[..., :D], uz[..., D:]
            u = F.conv1d(u.transpose(1, 2), P[pre + "conv.w"][:, None, :], P[pre + "conv.b"], padding=W - 1,
                         groups=D)[..., :T].transpose(1, 2)
            u = F.silu(u)
            rbc = u @ P[pre + "x_proj.w"]
            r, Bm, Cm = rbc[..., :R], rbc[..., R:R + N], rbc[..., R + N:]
            dt = F.softplus(r @ P[pre + "dt_proj.w"] + P[pre + "dt_proj.b"])
            A = (-torch.exp(P[pre + "A_log"])).expand(D, N)
            y = scan(u, dt, A, Bm, Cm, P[pre + "D"])
            x = x + (y * F.silu(z)) @ P[pre + "out_proj.w"]
        return head_loss(x)
    return stepper(loss_fn)


def run(shapes, repeats, warmup, torch_version, families=FAMILIES, sgemm=None, bandwidth=None):
    """Print one block per family and shape, with its roofline line against sgemm (the 2-thread GFLOP/s) and
    its memory floors at bandwidth ({where: GB/s}); -> {(family, shape): ours / torch}."""
    ratios = {}
    for family in families:
        for shape in shapes:
            cfg, params, batch = setup(family, shape)
            B, T = batch["tokens"].shape
            print(f"\n{family} {shape}: width {cfg.d_model}, {cfg.n_layers} layers, batch {B}, T {T}, "
                  f"{models.count_params(params):,} parameters")
            ours = bench.ours_step(cfg, params, batch, family)
            fs, names = [ours], ["ours"]
            if torch_version:
                loss = float(models.loss_and_grads(family, params, batch["tokens"], batch["targets"], batch["mask"],
                                                   cfg)[0])
                opponents = ({"torch (nn.LSTM)": torch_lstm(cfg, params, batch)} if family == "lstm" else
                             {"torch (loop)": torch_ssm(cfg, params, batch, False),
                              f"torch (chunks of {CHUNK})": torch_ssm(cfg, params, batch, True)})
                print(f"  initial loss: ours {loss:.6f}  " + "  ".join(f"{k} {v[1]:.6f}" for k, v in opponents.items())
                      + "  (same model, same batch)")
                fs += [v[0] for v in opponents.values()]
                names += list(opponents)
            times = bench.interleaved(fs, repeats, warmup)
            for name, ts in zip(names, times):
                print(f"  step: {name:22s} {bench.median_ms(ts):8.2f} ms ({bench.spread(ts)})")
            if sgemm or bandwidth:
                parts, total = roofline.exclusive_times(ours, max(2, repeats // 4))
            if sgemm:
                print(f"  roofline: {roofline.line(roofline.split(parts, total), total, models.step_flops(family, cfg, B, T), sgemm)}"
                      f"  ({bench.load()})")
            if bandwidth:
                print(f"  memory floors: {roofline.memory_line(roofline.exclusive_bytes(ours), parts, bandwidth)}")
            if torch_version:
                best = min(range(1, len(times)), key=lambda i: np.median(times[i]))
                ratios[(family, shape)] = np.median(times[0]) / np.median(times[best])
                print(f"  ratio ours/torch {ratios[(family, shape)]:.2f} (against {names[best]})  ({bench.load()})")
    return ratios


def fail(msg):
    print(f"python -m bench.recurrent: error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.recurrent", description=__doc__.split("\n\n")[0])
    p.error = fail
    p.add_argument("--quick", action="store_true", help=f"tiny shapes ({', '.join(QUICK_SHAPES)}), few repeats")
    p.add_argument("--repeats", type=int, help="timed steps per shape (default 20; --quick: 3)")
    p.add_argument("--shapes", help=f"comma-separated subset of {', '.join(SHAPES)}")
    p.add_argument("--families", help=f"comma-separated subset of {', '.join(FAMILIES)} (default: both)")
    args = p.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else 3 if args.quick else 20
    if repeats < 1:
        fail(f"--repeats {repeats}: must be a positive integer")
    allowed = QUICK_SHAPES if args.quick else SHAPES
    shapes = bench.shape_list(args.shapes, allowed, allowed, fail)
    families = bench.shape_list(args.families, FAMILIES, FAMILIES, fail, "--families")
    torch_version = bench.torch_available()
    print(f"python -m bench.recurrent  {bench.load()}  numba {numba.__version__} ({numba.config.NUMBA_NUM_THREADS} threads)  "
          f"torch {torch_version or 'absent'} ({bench.THREADS} threads)  repeats {repeats}")
    n, reps = (256, 3) if args.quick else (2048, 7)
    sgemm = max(bench.sgemm_gflops(2, n, reps) for _ in range(3))
    print(f"sgemm {n}x{n} float32, 2 threads (best of 3 runs): {sgemm:.1f} GFLOP/s, the roofline's reference  "
          f"({bench.load()})")
    bandwidth, line = roofline.bandwidths()
    print(line + f"  ({bench.load()})")
    with kernels.enabled():                                # the fast path, as train.py runs
        ratios = run(shapes, repeats, 1 if args.quick else 3, torch_version, families, sgemm, bandwidth)
    worst = max(ratios.values()) if ratios else float("nan")
    print(f"worst ratio ours/torch: {worst:.2f}")
    return ratios


if __name__ == "__main__":
    main()
