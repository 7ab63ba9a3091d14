"""formation: how the geometry forms over training (probe 6 of manifold.py), from a run's snapshots.

The frame-precision dissociation of the papers: the attention pattern (the frame) settles early,
the calibration (the precision) keeps improving. Two readings of it:
  ours       the attention rows of consecutive snapshots (total-variation distance per step) against
             the change of log10 entropy MAE; each series settles at the first snapshot after which its
             change per step stays below SETTLE_FRACTION x its maximum;
  authors'   the frame subspace of each snapshot against its final version (projection overlap as a
             multiple of a random subspace's), against the calibration.
What a snapshot is measured with (attention, calibration, the frame) is passed in by geometry/run.py.
"""

import glob
import os

import numpy as np

SETTLE_FRACTION = 0.1       # a series settles once its per-step change stays below this x its maximum


def snapshot_paths(run_dir):
    """-> [(step, path)] of runs/<name>/snapshots/step_XXXXXXX.npz, sorted by step."""
    paths = glob.glob(os.path.join(run_dir, "snapshots", "step_*.npz"))
    return sorted((int(os.path.basename(p)[5:-4]), p) for p in paths)


# ----------------------------------------------------------------------------
# ours: attention change against calibration change
#   frame change between consecutive snapshots a, b: mean over sequences, heads and every query
#   row i of the total-variation distance TV_i = 1/2 sum_j |alpha^b_ij - alpha^a_ij|, per layer;
#   divided by the steps between them it is a rate (per step).
#   A series settles at the first snapshot step s after which its per-step change stays below
#   SETTLE_FRACTION x its maximum: frame = mean over layers of the TV rate; precision = the rate
#   of |change of log10 entropy MAE| (calibration improves in orders of magnitude).
#   A second, scale-free rule: progress from the first snapshot (0) to the last (1), frame =
#   1 - TV(alpha_s, alpha_last) / TV(alpha_first, alpha_last), precision = the fraction of the drop
#   in log10 entropy MAE; the "90pct" step is the first after which progress stays >= 0.9.

def attention_tv(alpha_a, alpha_b):
    """Mean total-variation distance between corresponding attention rows (..., T): a float."""
    return float(0.5 * np.abs(alpha_a - alpha_b).sum(-1).mean(dtype=np.float64))


def settling_step(steps, change, frac=SETTLE_FRACTION):
    """steps (S,) snapshot steps; change (S-1,) per-step change between consecutive snapshots.
    -> the first step s_k after which change[k:] < frac * max(change) stays true (None if never)."""
    change = np.asarray(change, dtype=np.float64)
    if len(change) == 0 or not np.isfinite(change).all() or change.max() <= 0:
        return None
    return first_step_staying(steps, change < frac * change.max())


def first_step_staying(steps, ok):
    """-> the first steps[k] from which ok[k:] is all true (None if ok[-1] is false)."""
    ok = np.asarray(ok, dtype=bool)
    for k in range(len(ok)):
        if ok[k:].all():
            return int(steps[k])
    return None


def authors_frame_precision(steps, overlap, mae, chance):
    """The authors' reading of probe 6: the frame's overlap with its final version as a multiple of chance,
    against the calibration (entropy MAE). The frame plateaus at the first snapshot from which the ratio
    stays >= 90% of its last value; the calibration gain after it is MAE(plateau) / MAE(last)."""
    ratio = np.asarray(overlap) / chance
    plateau = first_step_staying(steps, ratio >= 0.9 * ratio[-1])
    k = steps.index(plateau) if plateau is not None else None
    near_300 = int(np.argmin(np.abs(np.log(np.asarray(steps, np.float64) / 300.0))))
    return {"overlap": list(overlap), "chance_overlap": chance, "ratio_to_chance": ratio.tolist(),
            "ratio_ceiling": 1.0 / chance, "step_nearest_300": int(steps[near_300]),
            "ratio_nearest_300": float(ratio[near_300]), "frame_plateau_step": plateau,
            "ratio_at_plateau": None if k is None else float(ratio[k]),
            "entropy_mae_at_plateau_bits": None if k is None else float(mae[k]),
            "calibration_gain_after_plateau": None if k is None or mae[-1] <= 0 else float(mae[k] / mae[-1])}




# ----------------------------------------------------------------------------
# the authors': subspace overlap

def projection_overlap(U, W):
    """||U^T W||_F^2 / min(r1, r2) for orthonormal bases U (C, r1), W (C, r2): 1 iff one contains the other.
    A uniformly random r1-dimensional U has expected overlap r1 r2 / C / min(r1, r2)."""
    return float((np.linalg.svd(U.T @ W, compute_uv=False) ** 2).sum() / min(U.shape[1], W.shape[1]))


def random_overlap(C, r1, r2):
    """Expected projection overlap of a uniformly random r1-dimensional subspace with a fixed r2-dimensional
    one in R^C: E||U^T W||_F^2 = r1 r2 / C, divided by min(r1, r2)."""
    return r1 * r2 / C / min(r1, r2)


def span_basis(F, rank=None):
    """Orthonormal basis (C, r) of the row space of F (n, C); with rank, its top `rank` directions (the
    leading right singular vectors). (C, 0) when F is zero."""
    _, S, Vt = np.linalg.svd(np.asarray(F, np.float64), full_matrices=False)
    keep = int((S > S[0] * 1e-10).sum()) if len(S) and S[0] > 0 else 0
    return Vt[:keep if rank is None else min(rank, keep)].T


def overlap_ratio(U, W, width):
    """projection_overlap(U, W) as a multiple of a random subspace's (0 when either is empty)."""
    if U.shape[1] == 0 or W.shape[1] == 0:
        return 0.0
    return projection_overlap(U, W) / random_overlap(width, U.shape[1], W.shape[1])


def ceiling(k, rank, width):
    """The largest overlap ratio against a k-dimensional frame: 1 / chance (0 for an empty frame)."""
    return 1.0 / random_overlap(width, min(rank, k), k) if k else 0.0


def change_settling(steps, mats, init, mae, kl, rank):
    """The settling measurement of probe 6 on one matrix series mats [(rows, width)] (one per snapshot, in
    order of step) and its value at initialisation: the change D_s = M_s - M_0 read the authors' way (the
    overlap of the top `rank` directions of D_s with the span of D_last, as a multiple of chance); its plateau
    (the first snapshot from which that ratio stays >= 90% of its last value); the calibration gain after it
    by the paper metric (mae) and by the KL (kl), each value at the plateau / at the last snapshot; and how
    far M moves before and after the plateau, |M_p - M_0|_F and |M_last - M_p|_F: stillness = after / before
    (0 for a matrix that stops at its plateau; large for one still moving)."""
    width = mats[-1].shape[1]
    last = span_basis(mats[-1] - init)
    ratio = [overlap_ratio(span_basis(M - init, rank), last, width) for M in mats]
    plateau = first_step_staying(steps, np.asarray(ratio) >= 0.9 * ratio[-1]) if ratio[-1] > 0 else None
    out = {"ratio_to_chance": ratio, "plateau_step": plateau, "gain_entropy_mae": None, "gain_kl": None,
           "moved_before_plateau": None, "moved_after_plateau": None, "stillness": None}
    if plateau is None:
        return out
    k = steps.index(plateau)
    before, after = float(np.linalg.norm(mats[k] - init)), float(np.linalg.norm(mats[-1] - mats[k]))
    gain = lambda c: float(c[k] / c[-1]) if c is not None and c[-1] > 0 else None
    out.update(gain_entropy_mae=gain(mae), gain_kl=gain(kl), moved_before_plateau=before, moved_after_plateau=after,
               stillness=after / before if before > 0 else None)
    return out


def oriented(M):
    """A weight block as rows in the larger of its two dimensions (a (C, 4C) matrix as is, (4C, C) transposed),
    so that its settling is read in the same kind of space as the frame's (n, C)."""
    M = np.asarray(M, np.float64)
    return M if M.shape[1] >= M.shape[0] else M.T


def block_settling(steps, snaps, init, mae, kl, rank):
    """Specificity control of probe 6: change_settling on every 2-D weight block of the snapshots
    [params], against init's. -> {name: plateau step, gains, stillness}."""
    names = [k for k, v in init.items() if np.ndim(v) == 2]
    out = {}
    for name in names:
        c = change_settling(steps, [oriented(p[name]) for p in snaps], oriented(init[name]), mae, kl, rank)
        out[name] = {k: v for k, v in c.items() if k != "ratio_to_chance"}
    return out


def frame_change(steps, frames, mae, init, other_inits, frame_rank, width, kl=None):
    """The controls of probe 6 (manifold.DEFINITIONS "frame_change"): frames [(n, C)] of the snapshots in
    order of step, init the frame F_0 at the run's initialisation, other_inits the frames of
    initialisations of other seeds, mae (kl) the entropy MAE (KL) of each snapshot. The change D_s = F_s - F_0
    is read the authors' way (change_settling): the overlap of its top directions with the span of D_last,
    as a multiple of chance; with its plateau, the gains after it and how still the frame is after it."""
    final = span_basis(frames[-1])                                    # (C, k) the final frame
    init_basis = span_basis(init)
    proj = frames[-1] @ init_basis                                    # (n, r0) the final frame on F_0's span
    c = change_settling(steps, frames, init, mae, kl, frame_rank)
    k = None if c["plateau_step"] is None else steps.index(c["plateau_step"])
    return {"init_ratio": overlap_ratio(span_basis(init, frame_rank), final, width),
            "other_init_ratio": [overlap_ratio(span_basis(F, frame_rank), final, width) for F in other_inits],
            "final_energy_in_init_span": float((proj ** 2).sum() / (frames[-1] ** 2).sum()),
            "chance_energy_in_init_span": init_basis.shape[1] / width,
            "change_ratio_to_chance": c["ratio_to_chance"],
            "change_ratio_ceiling": ceiling(span_basis(frames[-1] - init).shape[1], frame_rank, width),
            "change_plateau_step": c["plateau_step"],
            "change_ratio_at_plateau": None if k is None else float(c["ratio_to_chance"][k]),
            "entropy_mae_at_change_plateau_bits": None if k is None else float(mae[k]),
            "calibration_gain_after_change_plateau": c["gain_entropy_mae"],
            "calibration_gain_kl_after_change_plateau": c["gain_kl"],
            "moved_before_change_plateau": c["moved_before_plateau"],
            "moved_after_change_plateau": c["moved_after_plateau"], "stillness": c["stillness"]}


def frame_precision(snaps, measure, frame, frame_rank, width, init=None, other_inits=(),
                    settle_fraction=SETTLE_FRACTION):
    """Probe 6 over snapshots [(step, params)], in order of step; None with fewer than two.
    measure(params) -> (attention per layer, a dict of numbers with at least "entropy_mae_bits", and
    "kl_bits" for the gain by KL); frame(params) -> the authors' frame matrix F (n, C) (its span is the
    frame); width: C, the model width; init: the run's initial parameters and other_inits those of other
    seeds (the frame_change controls, and "blocks": the same settling measurement on every 2-D weight
    block of init's, the specificity control)."""
    if len(snaps) < 2:
        return None
    last = snaps[-1][1]
    final = measure(last)[0]                                          # attention of the last snapshot
    final_frame = span_basis(frame(last))                             # (C, k) the authors' final frame
    steps, states, tv, to_final, overlap, frames, prev = [], [], [], [], [], [], None
    for step, params in snaps:
        alphas, state = measure(params)
        frames.append(frame(params))
        overlap.append(projection_overlap(span_basis(frames[-1], frame_rank), final_frame))
        if prev is not None:
            tv.append([attention_tv(a, b) for a, b in zip(prev, alphas)])  # (L,) per layer
        to_final.append([attention_tv(a, b) for a, b in zip(alphas, final)])
        steps.append(step)
        states.append(state)
        prev = alphas
    series = {key: [s[key] for s in states] for key in states[0]}
    gaps = np.diff(steps).astype(np.float64)                          # (S-1,)
    tv, to_final = np.asarray(tv), np.asarray(to_final)               # (S-1, L), (S, L)
    log_mae = np.log10(np.maximum(series["entropy_mae_bits"], 1e-12))  # (S,)
    frame_rate = tv.mean(1) / gaps                                    # (S-1,)
    precision_rate = np.abs(np.diff(log_mae)) / gaps                  # (S-1,)
    frame_progress = 1.0 - to_final.mean(1) / max(to_final.mean(1)[0], 1e-300)
    drop = log_mae[0] - log_mae[-1]
    precision_progress = (log_mae[0] - log_mae) / drop if drop != 0 else np.ones_like(log_mae)
    settle = lambda change: settling_step(steps, change, settle_fraction)
    out = {"steps": steps, **series,
           "attention_tv_per_layer": tv.tolist(), "attention_tv_rate": frame_rate.tolist(),
           "precision_rate": precision_rate.tolist(),
           "attention_tv_to_final_per_layer": to_final.tolist(),
           "frame_progress": frame_progress.tolist(), "precision_progress": precision_progress.tolist(),
           "frame_settle_step": settle(frame_rate),
           "frame_settle_step_per_layer": [settle(tv[:, l] / gaps) for l in range(tv.shape[1])],
           "precision_settle_step": settle(precision_rate), "settle_fraction": settle_fraction,
           "frame_90pct_step": first_step_staying(steps, frame_progress >= 0.9),
           "precision_90pct_step": first_step_staying(steps, precision_progress >= 0.9),
           "authors": authors_frame_precision(steps, overlap, series["entropy_mae_bits"],
                                              random_overlap(width, min(frame_rank, final_frame.shape[1]),
                                                             final_frame.shape[1]))}
    if init is not None:
        kl = series.get("kl_bits")
        out["frame_change"] = frame_change(steps, frames, series["entropy_mae_bits"], frame(init),
                                           [frame(p) for p in other_inits], frame_rank, width, kl)
        out["blocks"] = block_settling(steps, [p for _, p in snaps], init, series["entropy_mae_bits"], kl, frame_rank)
    return out
