"""depth_rules: the rules that judge "a fixed depth runs out of layers" and "chain of thought extends it", read
from the lookup alone and held against the construction's prediction, so that every outcome can come out.

Written before the runs they will judge (the fresh seeds of the depth sweep); the runs primitives/depth.py
made before them (seeds 0 and 1, one learning rate, one initialisation, 6,000 and 24,000 steps) are
development data: they showed what the earlier rules could not tell apart (a rule that no table could
make "not supported", reach at one hop decided by calibrating the hidden keys rather than by the lookup).

The reading (tunnels/hops.py): an answer of h hops is a lookup when its exact posterior is one-hot; a depth
does h hops when its accuracy on those answers is at least DOES (chance is 1 / n_symbols, the hand-built
transformer of primitives/construction.py scores 1.0, a model that follows no pair scores chance). The
elimination (the uncertain answers) is reported beside it, never mixed into reach. (With three hidden pairs
of sixteen no one-hot answer needs elimination; with one hidden pair every answer is one-hot, so the sweep
keeps three.)
  lookup_reach   the largest h with every h' <= h done (0: not one hop); per seed, the best over the
                 settings a depth was trained at (rates, initialisations, grown from the depth below)
  predicted      construction.layers_needed: h hops need 1 + ceil(log2(h + 1)) layers (binding, then pointer
                 doubling), so L layers reach 2^(L-1) - 1 hops (at most H)
  short          the depths where a hop fits and every hop does not: layers_needed(1) <= L < layers_needed(H)

Claim 1, a fixed depth runs out (reach: {depth: [lookup reach per seed]}, H = max_hops):
  not supported  some depth reaches more hops than its layers allow in some seed (the prediction failed)
  supported      else, when at least one short depth was trained, every short depth does a hop in every
                 seed (what fits was learned), reach grows from each trained depth below the full one to the
                 next in every seed (the deeper's smallest over seeds above the shallower's largest), and
                 some depth at or past the full one does all H hops in every seed
  undecided      else: a depth where a hop fits did none in some seed, a deeper depth does no more than a
                 shallower one, the seeds disagree (optimisation, not depth, until a tuned or grown run says
                 otherwise), or no depth does every hop
Claim 2, chain of thought extends it (direct, cot: {depth: [reach per seed]}; cot: its free-running final
answers), at the short depths trained both ways:
  supported      at every one of them the direct model does a hop in every seed and the chain's smallest
                 reach over seeds is above the direct one's largest
  not supported  at every one of them the direct model does a hop in every seed and the chain's largest reach
                 is at most the direct one's smallest
  undecided      else, or none trained both ways (a direct model that did not learn the hop that fits says
                 nothing about what the chain adds)
"""

from primitives import construction

DOES = 0.9          # a depth does h hops: its accuracy on h's one-hot answers at least this
SUPPORTED, NOT_SUPPORTED, UNDECIDED = "supported", "not supported", "undecided"


def lookup_reach(accuracy):
    """accuracy: {h: accuracy on the one-hot answers of h hops, or None where there were none} -> the largest h
    with every h' <= h at least DOES; 0 if one hop is not (or has no one-hot answer)."""
    r = 0
    for h in sorted(accuracy):
        if h != r + 1 or accuracy[h] is None or accuracy[h] < DOES:
            break
        r = h
    return r


def predicted_reach(depth, max_hops):
    """The hops the prediction allows depth layers: the largest h <= max_hops whose layers_needed(h) is at most
    depth (2^(depth-1) - 1, at most max_hops)."""
    return max([0] + [h for h in range(1, max_hops + 1) if construction.layers_needed(h) <= depth])


def short_depths(depths, max_hops):
    """The depths where a hop fits and every hop does not, by the prediction."""
    return [L for L in sorted(depths)
            if construction.layers_needed(1) <= L < construction.layers_needed(max_hops)]


def runs_out(reach, max_hops):
    """Claim 1 (module docstring). reach: {depth: [lookup reach per seed]}. -> (verdict, why)."""
    over = [(L, r) for L, rs in sorted(reach.items()) for r in rs if r > predicted_reach(L, max_hops)]
    if over:
        L, r = over[0]
        return NOT_SUPPORTED, f"{L} layers reached {r} hops in a seed, more than the {predicted_reach(L, max_hops)} " \
                              f"the prediction allows"
    full = construction.layers_needed(max_hops)
    short = short_depths(reach, max_hops)
    if not short:
        return UNDECIDED, "no depth where a hop fits and every hop does not was trained"
    idle = [L for L in short if min(reach[L]) < 1]
    if idle:
        return UNDECIDED, f"{idle[0]} layers did no hop in some seed ({reach[idle[0]]}), though one fits: optimisation"
    trained = [L for L in sorted(reach) if L >= construction.layers_needed(1)]
    for a, b in zip(trained, trained[1:]):
        if a < full and min(reach[b]) <= max(reach[a]):
            return UNDECIDED, f"{b} layers reach no further than {a} in every seed ({reach[b]} against {reach[a]})"
    if not any(L >= full and min(reach[L]) >= max_hops for L in reach):
        return UNDECIDED, f"no depth of {full} layers or more does all {max_hops} hops in every seed"
    return SUPPORTED, f"reach grows with depth ({', '.join(f'{L}: {reach[L]}' for L in trained)}) and stops short " \
                      f"of {max_hops} below {full} layers"


def cot_extends(direct, cot, max_hops):
    """Claim 2 (module docstring). direct, cot: {depth: [lookup reach per seed]}. -> (verdict, why)."""
    short = [L for L in short_depths(direct, max_hops) if L in cot]
    if not short:
        return UNDECIDED, "no depth where a hop fits and every hop does not was trained both ways"
    idle = [L for L in short if min(direct[L]) < 1]
    if idle:
        return UNDECIDED, f"the direct model at {idle[0]} layers did no hop in some seed ({direct[idle[0]]}), " \
                          f"though one fits: what the chain adds cannot be read"
    if all(min(cot[L]) > max(direct[L]) for L in short):
        return SUPPORTED, "at every short depth the chain reaches further in every seed (" + ", ".join(
            f"{L}: {cot[L]} against {direct[L]}" for L in short) + ")"
    if all(max(cot[L]) <= min(direct[L]) for L in short):
        return NOT_SUPPORTED, "at no short depth does the chain reach further in any seed"
    return UNDECIDED, "the chain reaches further at some short depths or seeds, not all"
