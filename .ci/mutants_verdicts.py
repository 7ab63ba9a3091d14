"""Mutation testing of the verdict rules and the controls they read (a developer's tool, not run by CI):
each mutant is one textual change to one file of a scratch copy of the repository (in a temporary folder);
the tests named beside it run on that copy; killed = they fail. A mutant whose text no longer matches the
code is reported as not applied (update its line here when the code changes).

    NUMBA_NUM_THREADS=1 python .ci/mutants_verdicts.py [index ...]      # about 13 minutes for all 70
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DST = os.path.join(tempfile.gettempdir(), "mutants_verdicts")
V = ["tests/test_verdicts.py", "tests/test_manifold.py::test_a_frame_that_never_leaves_its_initialisation"]
P = ["tests/test_verdicts.py", "tests/test_manifold.py", "tests/test_numbers.py"]
MUTANTS = [
 ("init overlap at the ceiling", "geometry/formation.py", '"init_ratio": overlap_ratio(span_basis(init, frame_rank), final, width),', '"init_ratio": ceiling(final.shape[1], frame_rank, width),', P),
 ("readout fitted in sample", "geometry/measures.py", "test, train = fold == f, fold != f", "test, train = fold == f, fold == fold", P),
 ("between-sequence TV set to 0", "manifold.py", "between[l].append(row_tv(a, np.roll(a, 1, axis=0)))", "between[l].append(0.0 * row_tv(a, np.roll(a, 1, axis=0)))", P),
 ("frame-head rule reads zero ablation", "geometry/verdicts.py", 'IN_DISTRIBUTION = ("position_mean", "resample")', 'IN_DISTRIBUTION = ("zero",)', V),
 ("key-frame rule ignores the centred comparison", "geometry/verdicts.py", "res = {k: compare(*t) for k, t in tests.items()}", 'res = {k: compare(*t) for k, t in tests.items() if k != "centred"}', V),
 ("branch 'cannot be told' removed", "geometry/verdicts.py", "if within is None or scores[best] is None:", "if False:", V),
 ("branch 'elsewhere' removed", "geometry/verdicts.py", 'if readable == "above" and beyond == "above":', "if False:", V),
 ("frame-head verdict hard-wired 'not supported'", "geometry/verdicts.py", "    if essential:\n", "    if False:\n", V),
 ("calibration gate off", "geometry/verdicts.py", "return kl < CALIBRATED * uniform, kl, uniform", "return True, kl, uniform", V),
 ("gate on an absolute KL (0.1 bits)", "geometry/verdicts.py", "return kl < CALIBRATED * uniform, kl, uniform", "return kl < CALIBRATED, kl, uniform", V),
 ("gate computed but not applied", "geometry/verdicts.py", "        if not judged:\n", "        if False:\n", V),
 ("no noise band", "geometry/verdicts.py", "if abs(d) <= NOISE_Z * (noise or 0.0):", "if False:", V),
 ("no marginal band", "geometry/verdicts.py", "if abs(d) <= MARGINAL * abs(threshold):", "if False:", V),
 ("stillness constant 0", "geometry/formation.py", "stillness=after / before if before > 0 else None)", "stillness=0.0)", P),
 ("stillness test reversed", "geometry/verdicts.py", 'if moving == "above" else []', 'if moving == "below" else []', V),
 ("specificity always passes", "geometry/verdicts.py", "specific = index(plateau) < median", "specific = True", V),
 ("specificity counts only strictly earlier blocks", "geometry/verdicts.py", 'if index(b["plateau_step"]) <= index(plateau)]', 'if index(b["plateau_step"]) < index(plateau)]', V),
 ("no weight blocks measured", "geometry/formation.py", "names = [k for k, v in init.items() if np.ndim(v) == 2]", "names = []", P),
 ("gain read from the paper metric", "geometry/verdicts.py", 'c.get("calibration_gain_kl_after_change_plateau")', 'c.get("calibration_gain_after_change_plateau")', V),
 ("KL gain computed from the paper metric", "geometry/formation.py", "gain_kl=gain(kl)", "gain_kl=gain(mae)", P),
 ("frame-precision verdict hard-wired", "geometry/verdicts.py", "    if fails:\n", "    if False:\n", V),
 ("sharpening pooled per layer", "geometry/verdicts.py", 'red = layer["entropy_reduction_without_sink_rows_per_head"][h]', 'red = layer["entropy_reduction"]', V),
 ("sink share per head ignored", "geometry/verdicts.py", 'sink = (layer["sink_share_of_entropy_drop_per_head"][h] or 0.0) >= SINK_SHARE', "sink = False", V),
 ("swap noise ignored", "geometry/verdicts.py", 'compare(swap["ratio"][h], SWAP_ALIGNED, swap["ratio_se"][h])', 'compare(swap["ratio"][h], SWAP_ALIGNED)', V),
 ("layer by layer = reductions rising", "geometry/verdicts.py", "by_layer = rising and len(aligned_layers) >= 2", "by_layer = rising", V),
 ("sharpening hard-wired 'supported'", "geometry/verdicts.py", 'outcome = "supported" if by_layer else "partly"', 'outcome = "supported"', V),
 ("key-frame verdict hard-wired 'supported'", "geometry/verdicts.py", 'elif all(r == "below" for r in res.values()):', "elif True:", V),
 ("manifold verdict hard-wired 'supported'", "geometry/verdicts.py", 'if pc1 == "above" and rho == "above":', "if True:", V),
 ("output readout baseline constant 0", "geometry/verdicts.py", "output = max((o for o in outputs if o is not None), default=None)", "output = 0.0", V),
 ("beyond-the-output test ignored", "geometry/verdicts.py", 'beyond = "undecided" if output is None else compare(scores[best] - output, READOUT_BEYOND, beyond_se)', 'beyond = "above"', V),
 ("readout noise ignored", "geometry/verdicts.py", "readable = compare(scores[best], READOUT_PARTIAL, readable_se)", "readable = compare(scores[best], READOUT_PARTIAL)", V),
 ("beyond-the-output noise ignored", "geometry/verdicts.py", "compare(scores[best] - output, READOUT_BEYOND, beyond_se)", "compare(scores[best] - output, READOUT_BEYOND)", V),
 ("beyond-the-output noise unpaired", "geometry/verdicts.py", "_, beyond_se = ms.partial_difference(best_folds, out_folds)", "beyond_se = None if out_folds is None else (readable_se ** 2 + ms.partial_from_folds(out_folds)[1] ** 2) ** 0.5", V),
 ("beyond-the-output noise from the other output", "geometry/verdicts.py", "out_folds = out_folds[outputs.index(output)] if output is not None else None", "out_folds = out_folds[-1] if output is not None else None", V),
 ("partial readout: mean of the folds' ratios", "geometry/measures.py", 'r, se = ratio_se(folds["full"], folds["base"])', 'r, se = float(np.mean(np.divide(folds["full"], folds["base"]))), ratio_se(folds["full"], folds["base"])[1]', P),
 ("partial difference reversed", "geometry/measures.py", 'return ratio_se(np.asarray(other["full"]) - np.asarray(folds["full"]), folds["base"])', 'return ratio_se(np.asarray(folds["full"]) - np.asarray(other["full"]), folds["base"])', P),
 ("folds not kept", "manifold.py", '(out[key], out[key + "_se"]), out[key + "_folds"] = ms.partial_from_folds(folds), folds', '(out[key], out[key + "_se"]), out[key + "_folds"] = ms.partial_from_folds(folds), None', P),
 ("output entropy readout from a constant", "manifold.py", '("output_entropy", wt.entropy_bits(q)[:, None])', '("output_entropy", np.zeros((len(q), 1)))', P),
 ("frame-head rule reads the level, not the rise", "geometry/verdicts.py", 'compare(r["delta_kl_bits"], threshold, r.get("delta_kl_se_bits"))', 'compare(abl["baseline"]["kl_bits"] + r["delta_kl_bits"], abl["uniform_kl_bits"], r.get("delta_kl_se_bits"))', V),
 ("frame-head noise ignored", "geometry/verdicts.py", 'compare(r["delta_kl_bits"], threshold, r.get("delta_kl_se_bits"))', 'compare(r["delta_kl_bits"], threshold)', V),
 ("KL-change SE constant 0", "manifold.py", "else ms.mean_se(seq - base_seq)}", "else 0.0}", P),
 ("swap-ratio SE constant 0", "manifold.py", '"ratio_se": (ratio * rel).tolist(),', '"ratio_se": (0 * ratio).tolist(),', P),
 ("seed sd constant 0", "geometry/measures.py", "return float(v.std(ddof=1)) if len(v) > 1 else 0.0", "return 0.0", P),
 ("mean SE with ddof 0", "geometry/measures.py", "return float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0", "return float(a.std(ddof=0) / math.sqrt(len(a))) if len(a) > 1 else 0.0", P),
 ("ratio SE without n / (n - 1)", "geometry/measures.py", "se = math.sqrt(n / (n - 1) * ((num - r * den) ** 2).sum())", "se = math.sqrt(((num - r * den) ** 2).sum())", P),
 ("combine: seeds always agree", "geometry/verdicts.py", "agree = len(set(outcomes)) == 1", "agree = True", V),
 ("combine: any runs accepted", "geometry/verdicts.py", "        if any(v != values[0] for v in values):\n", "        if False:\n", V),
 ("per-head reduction without sink rows SE constant 0", "manifold.py", '"entropy_reduction_without_sink_rows_se_per_head": [se for _, se in wo],', '"entropy_reduction_without_sink_rows_se_per_head": [0.0 for _ in wo],', P),
 ("essential fraction 0", "geometry/verdicts.py", "ESSENTIAL = 0.5 ", "ESSENTIAL = 0.0 ", V),
 ("stillness before / after swapped", "geometry/formation.py", "stillness=after / before if before > 0 else None)", "stillness=before / after if after > 0 else None)", P),
 ("blocks not oriented", "geometry/formation.py", "return M if M.shape[1] >= M.shape[0] else M.T", "return M", P),
 ("specific when tied with the median", "geometry/verdicts.py", "specific = index(plateau) < median", "specific = index(plateau) <= median", V),
 ("layer by layer: rising test reversed", "geometry/verdicts.py", "rising = all(b >= a for a, b in zip(reductions, reductions[1:]))", "rising = all(b <= a for a, b in zip(reductions, reductions[1:]))", V),
 ("combine: a seed repeated is accepted", "geometry/verdicts.py", "if None in seeds or len(set(seeds)) < len(seeds):", "if None in seeds:", V),
 ("combine: every claim, not the run's own", "geometry/verdicts.py", "each = [judge(g, measured[0]) for g in gs]", "each = [judge(g) for g in gs]", V),
 ("combine: runs of different claims accepted", "geometry/verdicts.py", "    if any(m != measured[0] for m in measured):\n", "    if False:\n", V),
 ("gate reads the paper metric", "geometry/verdicts.py", 'c = g.get("calibration") or {"kl_bits": g["ablations"]["baseline"]["kl_bits"],', 'c = g.get("calibration") or {"kl_bits": g["ablations"]["baseline"].get("entropy_mae_bits", 0.0),', V),
 ("gate ignores a family's own calibration block", "geometry/verdicts.py", 'c = g.get("calibration") or {', 'c = {', V),
 ("key frame: noise from the trained value, not the seeds", "geometry/verdicts.py", 'ms.seed_sd(a.get("random_init_per_seed", []))', '0.0', V),
 ("plateau read at the first snapshot", "geometry/formation.py", "plateau = first_step_staying(steps, np.asarray(ratio) >= 0.9 * ratio[-1]) if ratio[-1] > 0 else None", "plateau = steps[0] if ratio[-1] > 0 else None", P),
 ("clusters: NMI threshold ignored", "geometry/verdicts.py", 'tests = {"threshold": compare(c["nmi"], CLUSTER_NMI, c["nmi_se"]),', 'tests = {', V),
 ("clusters: initialisation control ignored", "geometry/verdicts.py", '"random initialisation": compare(c["nmi"], init_mean, ms.seed_sd(c["nmi_init_per_seed"])),', '', V),
 ("clusters: initialisation noise ignored", "geometry/verdicts.py", 'compare(c["nmi"], init_mean, ms.seed_sd(c["nmi_init_per_seed"]))', 'compare(c["nmi"], init_mean)', V),
 ("clusters: NMI noise ignored", "geometry/verdicts.py", 'compare(c["nmi"], CLUSTER_NMI, c["nmi_se"])', 'compare(c["nmi"], CLUSTER_NMI)', V),
 ("clusters: discreteness not read", "geometry/verdicts.py", 'discrete = "undecided" if beyond is None else compare(beyond, CLUSTER_BEYOND, se)', 'discrete = "above"', V),
 ("clusters: discreteness noise ignored", "geometry/verdicts.py", 'compare(beyond, CLUSTER_BEYOND, se)', 'compare(beyond, CLUSTER_BEYOND)', V),
 ("clusters: the posterior's own share not subtracted", "geometry/state_clusters.py", "diffs.append(None if a is None or b is None else a - b)", "diffs.append(a)", P),
 ("clusters: labels from the posterior's argmin", "geometry/state_clusters.py", "labels = P.argmax(1)", "labels = P.argmin(1)", P),
 ("nmi normalised by the min entropy", "geometry/measures.py", "/ math.sqrt(ha * hb))", "/ min(ha, hb))", P),
 ("cluster share inverted", "geometry/measures.py", "return 1.0 - within / total", "return within / total", P),
]


def main(only=None):
    results = []
    for i, (name, path, old, new, tests) in enumerate(MUTANTS):
        if only and i not in only:
            continue
        if os.path.exists(DST):
            shutil.rmtree(DST)
        shutil.copytree(SRC, DST, ignore=shutil.ignore_patterns(".git", "runs", "figures", "__pycache__"))
        text = open(os.path.join(DST, path)).read()
        if text.count(old) != 1:
            results.append((i, name, f"NOT APPLIED ({text.count(old)} matches)"))
            print(results[-1], flush=True)
            continue
        open(os.path.join(DST, path), "w").write(text.replace(old, new))
        t = time.time()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=DST,
                              capture_output=True, text=True, env={**os.environ, "NUMBA_NUM_THREADS": "1"})
        verdict = "killed" if proc.returncode != 0 else "SURVIVED"
        failed = [l for l in proc.stdout.splitlines() if l.startswith("FAILED")][:1]
        results.append((i, name, verdict, f"{time.time() - t:.0f} s", *failed))
        print(results[-1], flush=True)
    killed = sum(r[2] == "killed" for r in results)
    print(f"killed {killed} of {len(results)}")
    shutil.rmtree(DST, ignore_errors=True)


if __name__ == "__main__":
    main(set(map(int, sys.argv[1:])) or None)
