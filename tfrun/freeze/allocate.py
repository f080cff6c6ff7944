"""Turn planned freeze ratios into frozen sets for one stage over one window of steps (pure Python, no torch).

A stage's trainable tensors have costs (their weight-gradient work, tfrun.freeze.candidates Note [freeze share]); a
ratio r for action (stage, micro-batch) asks that micro-batch to skip a share r of that cost. Whole tensors
cannot realise an arbitrary r, and a fixed choice of tensors starves them, so every policy here plans one
*window* of `redraw_every` steps at a time:

Note [window budget]: each cell (step, micro-batch) of the window earns an allowance r x ramp(step); a cell
freezes at most what its action has earned and not yet spent, and carries the rest to the same action's next
cell (never rounding up). Subset policies reset the carry at the window's end, so over every window a
stage's realised mean ratio is at most its planned mean (and short of it by less than one tensor's share per
action, divided by the window length). The skip policy's unit is a whole micro-batch, too coarse for a
per-action floor, so it budgets the stage as a whole (see `skip_steps`).

Note [rotation]: subset policies keep the *unfrozen* part of each cell a contiguous block of a random cyclic
order of the stage's tensors (re-drawn per window), and start each cell's block where the previous cell's
ended. The blocks of successive cells tile the circle, so every tensor is unfrozen once per turn: within a
window, each tensor receives gradient from at least one micro-batch as soon as the window's unfrozen cost
adds up to one turn (e.g. 8 micro-batches at r = 0.9 give 0.8 of a turn per step). i.i.d. random subsets
instead leave a tensor frozen in all M micro-batches of a step with probability about r^M (0.43 at 0.9, M=8).

Note [goodput order]: under the `goodput` policy (tfrun.freeze.freezing) the rotation runs for one turn of each
window only, so every tensor still learns in every window that has a turn's worth of unfrozen cost; after
it, each cell keeps unfrozen the tensors with the most learning per ms of their weight-gradient work first
(`priority`, highest first: tfrun.freeze.candidates.goodput_priority), so the plan's freezing falls on the tensors
whose updates the noise-scale model says matter least. The budget is the rotation's: a cell's unfrozen share
is at least what its allowance leaves, so the realised ratio never exceeds the plan's.

Note [stage 0]: nothing needs an input gradient on stage 0, so the frozen set decides how far down its
backward runs: a prefix (embedding, block 0, ...) prunes the backward below the first unfrozen tensor and
its time falls linearly with r, as the LP assumes, while a random subset leaves the whole input-gradient
chain running and saves little until r = 1 (37.6 -> 24.5 ms at r = 0.75, 0.2 ms at r = 1). But a prefix
never trains the front while the ratios stay high. The `auto` policy (tfrun.freeze.freezing) freezes prefixes in
every window in which some cell freezes nothing (an action the plan leaves unfrozen trains the whole stage
in every step: tfplan solves with one stage-0 backward left unfrozen, tfplan.plan.job Note [stage-0 anchor]) and
rotating subsets otherwise, so every tensor learns in every window. We measured the
alternatives that keep the linear time with every tensor learning, and each trained worse
(docs/benchmarks.md, "Freeze policies"): whole-backward skips in a share r of steps (exact mean times,
but the mean step exceeds the LP's by 12% on the tiny 1F1B plan: the LP shortens every backward a little,
which a step that skips some backwards entirely and runs the others in full cannot do), one full backward
per action and window with deeper prefixes elsewhere, and one micro-batch left unfrozen at run time.

Note [skip]: the `skip` policy realises ratio r by skipping a micro-batch's whole backward in a share r of
the window's steps, spread evenly and staggered across micro-batches; the mean duration is exactly the
LP's linear value (both endpoints are measured) and every parameter learns from the micro-batches not
skipped, but steps vary (Note [stage 0]).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

EPS = 1e-9  # slack for float sums of ratios (0.9 x 10 must count as 9 skips)


def rotate(costs: Sequence[float], order: Sequence[int], allowance: Sequence[Sequence[float]],
           priority: Sequence[float] | None = None) -> list[list[frozenset[int]]]:
    """Frozen tensor indices per cell of one window (Note [rotation]).

    Args:
        costs: (N,) cost per tensor (> 0 in total).
        order: a permutation of range(N), the cyclic order of this window.
        allowance: (W, M) allowance per (step of the window, micro-batch), each in [0, 1].
        priority: (N,) learning per unit of cost of each tensor, or None; with it, the rotation stops after one
            turn and later cells keep the highest-priority tensors unfrozen (Note [goodput order]).
    Returns:
        (W, M) frozen sets; each cell's frozen cost share is at most its action's accumulated allowance
        (Note [window budget]).

    >>> rotate([1, 1, 1, 1], [0, 1, 2, 3], [[0.5, 0.5]])
    [[frozenset({2, 3}), frozenset({0, 1})]]
    >>> rotate([1, 1, 1, 1], [0, 1, 2, 3], [[0.5, 0.5], [0.5, 0.5]], priority=[0.1, 0.4, 0.2, 0.3])
    [[frozenset({2, 3}), frozenset({0, 1})], [frozenset({0, 2}), frozenset({0, 2})]]
    """
    total = float(sum(costs))
    share = [c / total for c in costs]
    n = len(order)
    ranked = sorted(range(n), key=lambda i: (-priority[i], i)) if priority is not None else None
    cursor, turned = 0, 0.0
    carry = [0.0] * (len(allowance[0]) if allowance else 0)
    out = []
    for row in allowance:
        cells = []
        for m, allow in enumerate(row):
            budget = carry[m] + allow
            if allow <= EPS:  # nothing planned in this cell: freeze nothing; the cursor and the carry wait
                cells.append(frozenset())
                continue
            need = 1.0 - budget  # unfrozen share this cell must keep
            if ranked is not None and turned >= 1.0 - EPS:  # the turn is done: the most valuable stay unfrozen
                keep, got = _fill(ranked, share, need)
                frozen = frozenset(range(n)) - keep
            else:
                block, got = 0, 0.0
                while got < need - EPS and block < n:
                    got += share[order[(cursor + block) % n]]
                    block += 1
                frozen = frozenset(order[(cursor + k) % n] for k in range(block, n))
                cursor = (cursor + block) % n
                turned += got
            carry[m] = max(0.0, budget - sum(share[i] for i in frozen))
            cells.append(frozen)
        out.append(cells)
    return out


def _fill(ranked: Sequence[int], share: Sequence[float], need: float) -> tuple[frozenset[int], float]:
    """The first tensors of `ranked` whose shares reach `need`, and their share."""
    keep, got = [], 0.0
    for i in ranked:
        if got >= need - EPS:
            break
        keep.append(i)
        got += share[i]
    return frozenset(keep), got


def prefix(costs: Sequence[float], order_of: Callable[[int, int], Sequence[int]],
           allowance: Sequence[Sequence[float]]) -> list[list[frozenset[int]]]:
    """Per cell (t, m), the longest prefix of order_of(t, m) whose share fits the action's accumulated
    allowance (Note [window budget]).

    With the forward order this is the `prefix` policy (stage 0's backward stops at the first unfrozen
    tensor; the front never learns while ratios stay high).

    >>> prefix([1, 1, 2], lambda t, m: [0, 1, 2], [[0.5], [0.3]])
    [[frozenset({0, 1})], [frozenset({0})]]
    """
    total = float(sum(costs))
    carry = [0.0] * (len(allowance[0]) if allowance else 0)
    out = []
    for t, row in enumerate(allowance):
        cells = []
        for m, allow in enumerate(row):
            if allow <= EPS:  # nothing planned in this cell: freeze nothing; the carry waits for the next
                cells.append(frozenset())
                continue
            order = order_of(t, m)
            budget = carry[m] + allow
            acc, k = 0.0, 0
            while k < len(order) and acc + costs[order[k]] / total <= budget + EPS:
                acc += costs[order[k]] / total
                k += 1
            carry[m] = max(0.0, budget - acc)
            cells.append(frozenset(order[:k]))
        out.append(cells)
    return out


def weighted_order(n: int, rng: random.Random, decay: float = 2.0) -> list[int]:
    """A random order of range(n) drawn without replacement with weights falling from front to back
    (weight of index i: decay^(-i n' / n), n' = 4), the paper's stage-0 sampling (METHOD.md section 5).
    Efraimidis-Spirakis keys: sort by u^(1/w) descending."""
    keys = [(rng.random() ** (1.0 / decay ** (-4.0 * i / max(1, n))), i) for i in range(n)]
    return [i for _, i in sorted(keys, reverse=True)]


def preferring_order(n: int, preferred: set[int], rng: random.Random, other_weight: float = 0.01) -> list[int]:
    """A random order of range(n) drawn without replacement with weight 1 for `preferred` indices and
    `other_weight` for the rest (METHOD.md section 5's hybrids: the baseline's candidates first, mostly).
    Efraimidis-Spirakis keys: sort by u^(1/w) descending."""
    keys = [(rng.random() ** (1.0 / (1.0 if i in preferred else other_weight)), i) for i in range(n)]
    return [i for _, i in sorted(keys, reverse=True)]


def skip_steps(allowance: Sequence[Sequence[float]], debt: Sequence[float]) -> tuple[list[list[bool]], list[float]]:
    """Which cells of one window skip their whole backward (Note [skip]).

    Args:
        allowance: (W, M) allowance per (step of the window, micro-batch).
        debt: (M,) fairness debt per micro-batch from earlier windows (sums to about 0).
    Returns:
        (skip, new debt): skip is (W, M) booleans.

    The stage's budget is floor(sum of the window's allowances): over the window the stage's realised mean
    never exceeds its planned mean, and falls short by less than one micro-batch's backward. Each action gets
    floor or ceil of its own allowance; the ceilings go to the actions with the largest fractional part plus
    debt, and the debt carries what each action was short of (or over) its allowance, so that over many
    windows every action's share approaches its own ratio. The skips of an action sit where its cumulative
    allowance crosses (j + phase) / n, the phase staggered by micro-batch so that skips spread over steps.

    >>> skip_steps([[0.5, 0.5], [0.5, 0.5]], [0.0, 0.0])[0]
    [[True, False], [False, True]]
    """
    w, m = len(allowance), len(allowance[0]) if allowance else 0
    totals = [sum(allowance[t][j] for t in range(w)) for j in range(m)]
    budget = math.floor(sum(totals) + EPS)
    eligible = [sum(1 for t in range(w) if allowance[t][j] > EPS) for j in range(m)]
    want = [totals[j] + debt[j] for j in range(m)]
    count = [min(eligible[j], max(0, math.floor(want[j] + EPS))) for j in range(m)]
    frac = [want[j] - count[j] for j in range(m)]
    while sum(count) > budget:  # debts pushed past the budget: take back from the smallest remainders
        j = min((j for j in range(m) if count[j] > 0), key=lambda j: (frac[j], j))
        count[j] -= 1
        frac[j] += 1.0
    while sum(count) < budget:
        options = [j for j in range(m) if count[j] < eligible[j] and totals[j] > EPS]
        if not options:
            break
        j = max(options, key=lambda j: (frac[j], -j))
        count[j] += 1
        frac[j] -= 1.0
    # The stage's budget floors its total: share the shortfall in proportion to each action's allowance, so
    # that the debts stay bounded and each action's long-run share approaches its own ratio.
    active = [j for j in range(m) if totals[j] > EPS]
    gap, allowed = sum(want[j] - count[j] for j in active), sum(totals[j] for j in active)
    new_debt = [want[j] - count[j] - gap * totals[j] / allowed if j in active else 0.0 for j in range(m)]
    skip = [[False] * m for _ in range(w)]
    for j in range(m):
        for t in _spread(count[j], [allowance[t][j] for t in range(w)], (j + 0.5) / m):
            skip[t][j] = True
    return skip, new_debt


def _spread(n: int, allow: Sequence[float], phase: float) -> list[int]:
    """n distinct steps with allowance > 0, the k-th where the cumulative allowance first reaches
    (k + phase) / n of the total (a taken step moves to the next free one, cyclically)."""
    if n == 0:
        return []
    total = sum(allow)
    steps = [t for t, a in enumerate(allow) if a > EPS]
    cum, acc = [], 0.0
    for a in allow:
        acc += a
        cum.append(acc / total)
    taken: list[int] = []
    for k in range(n):
        goal = (k + phase) / n
        t = next((t for t in steps if cum[t] >= goal - EPS), steps[-1])
        i = steps.index(t)
        while steps[i] in taken:
            i = (i + 1) % len(steps)
        taken.append(steps[i])
    return sorted(taken)
