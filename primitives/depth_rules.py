"""depth_rules: the rules that judge "a fixed depth runs out of layers" and "chain of thought extends it", read
from the lookup alone and held against the construction's prediction, so that every outcome can come out.

Written before the runs they will judge (the fresh seeds of the depth sweep); the runs primitives/depth.py
made before them (seeds 0 and 1, one learning rate, one initialisation, 6,000 and 24,000 steps) are
development data: they showed what the earlier rules could not tell apart (a rule that no table could
make "not supported", reach at one hop decided by calibrating the hidden keys rather than by the lookup).

The reading (tunnels/hops.py): an answer of h hops is a lookup when its exact posterior is one-hot; a depth
does h hops when its accuracy on those answers is at least DOES (chance is 1 / n_symbols, the hand-built
transformer of primitives/construction.py scores 1.0, a model that follows no pair scores chance). The
elimination (the uncertain answers) is reported beside it, never mixed into reach.
  lookup_reach   the largest h with every h' <= h done (0: not one hop); per seed, the best over the
                 settings a depth was trained at (rates, initialisations, grown from the depth below)
  predicted      construction.layers_needed: h hops need h + 1 layers, so L layers reach min(L - 1, H)

Claim 1, a fixed depth runs out (reach: {depth: [lookup reach per seed]}, H = max_hops):
  not supported  some depth reaches more hops than its layers allow in some seed (reach > L - 1): a model
                 did with fewer layers what the prediction says needs more
  supported      else, when the depths that do at least one hop in every seed number two or more, reach grows
                 with depth from each of them below H + 1 to the next (the deeper's smallest over seeds above
                 the shallower's largest), and some depth at or past H + 1 does all H hops in every seed (those below H + 1
                 stop short of H, since none passed the prediction)
  undecided      else: a deeper depth does no more than a shallower one (optimisation, not depth, until a
                 tuned or grown run says otherwise), the seeds disagree, or the full depth never learns
Claim 2, chain of thought extends it (direct, cot: {depth: [reach per seed]}; cot: its free-running final
answers), at the depths the prediction calls short (2 <= L < H + 1: a lookup fits, every hop does not) that
were trained both ways:
  supported      at every one of them the chain's smallest reach over seeds is above the direct one's largest
  not supported  at every one of them the chain's largest reach is at most the direct one's smallest
  undecided      else, or none trained both ways
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
    """The hops the construction's prediction allows depth layers: the largest h <= max_hops whose
    layers_needed(h) is at most depth (min(depth - 1, max_hops))."""
    return max([0] + [h for h in range(1, max_hops + 1) if construction.layers_needed(h) <= depth])


def runs_out(reach, max_hops):
    """Claim 1 (module docstring). reach: {depth: [lookup reach per seed]}. -> (verdict, why)."""
    over = [(L, r) for L, rs in sorted(reach.items()) for r in rs if r > predicted_reach(L, max_hops)]
    if over:
        L, r = over[0]
        return NOT_SUPPORTED, f"{L} layers reached {r} hops in a seed, more than the {predicted_reach(L, max_hops)} " \
                              f"the construction's prediction allows"
    full = construction.layers_needed(max_hops)
    doing = [L for L in sorted(reach) if min(reach[L]) >= 1]
    if len(doing) < 2:
        return UNDECIDED, f"{len(doing)} depth(s) do a hop in every seed: no growth with depth to read"
    for a, b in zip(doing, doing[1:]):
        if a < full and min(reach[b]) <= max(reach[a]):          # past the full depth there is no more to reach
            return UNDECIDED, f"{b} layers reach no further than {a} in every seed ({reach[b]} against {reach[a]})"
    if not any(L >= full and min(reach[L]) >= max_hops for L in reach):
        return UNDECIDED, f"no depth of {full} layers or more does all {max_hops} hops in every seed"
    return SUPPORTED, f"reach grows with depth ({', '.join(f'{L}: {reach[L]}' for L in doing)}) and stops short " \
                      f"of {max_hops} below {full} layers"


def cot_extends(direct, cot, max_hops):
    """Claim 2 (module docstring). direct, cot: {depth: [lookup reach per seed]}. -> (verdict, why)."""
    full = construction.layers_needed(max_hops)
    short = [L for L in sorted(direct) if construction.layers_needed(1) <= L < full and L in cot]
    if not short:
        return UNDECIDED, "no depth the prediction calls short was trained both ways"
    if all(min(cot[L]) > max(direct[L]) for L in short):
        return SUPPORTED, "at every short depth the chain reaches further in every seed (" + ", ".join(
            f"{L}: {cot[L]} against {direct[L]}" for L in short) + ")"
    if all(max(cot[L]) <= min(direct[L]) for L in short):
        return NOT_SUPPORTED, "at no short depth does the chain reach further in any seed"
    return UNDECIDED, "the chain reaches further at some short depths or seeds, not all"
