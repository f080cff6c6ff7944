"""The V-shaped schedules (ZBV, DualPipeV): rank r of P holds stages r and 2P-1-r.

Each generator returns rank -> compute actions in the order torch 2.13 runs them (`pipeline_order`, see
tfplan.schedule.schedules); tfplan.schedule.schedules registers them and validates what they return.
"""

from __future__ import annotations

from tfplan.schedule.actions import Action


def zbv(p: int, v: int, m: int) -> list[list[Action]]:
    # ZB-V (zero bubble, V placement). torch plans with at least 2P-1 micro-batches and then drops the
    # actions of micro-batches >= M, so small M keeps the same relative order.
    return [_zbv_rank(p, m, r) for r in range(p)]


def _zbv_rank(p: int, m: int, r: int) -> list[Action]:
    planned = max(2 * p - 1, m)
    c0, c1 = r, 2 * p - 1 - r  # chunk 0 (down the V) and chunk 1 (back up)
    cnt = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}
    actions: list[Action] = []

    def emit(stage: int, kind: str, key: str | None, mb: int | None = None) -> None:
        if mb is None:
            mb = cnt[key]
            cnt[key] += 1
        actions.append(Action(stage, kind, mb))

    for _ in range(2 * (p - r) - 1):  # warm-up 1: chunk-0 forwards
        emit(c0, "F", "f0")
    for _ in range(r):  # warm-up 2: alternate chunk-1 and chunk-0 forwards
        emit(c1, "F", "f1")
        emit(c0, "F", "f0")
    for _ in range(p - r):  # warm-up 3: chunk-1 forward, then its I and W
        emit(c1, "F", "f1")
        emit(c1, "I", None, cnt["b1"])
        emit(c1, "W", "b1")
    while cnt["f1"] < cnt["f0"] or cnt["f0"] < planned:  # steady state
        if cnt["f0"] < planned:
            emit(c0, "F", "f0")
        emit(c0, "I", None, cnt["b0"])
        emit(c0, "W", "b0")
        emit(c1, "F", "f1")
        emit(c1, "I", None, cnt["b1"])
        emit(c1, "W", "b1")
    w0, w1 = cnt["b0"], cnt["b1"]
    for _ in range(r):  # cool-down 1: input gradients of both chunks
        emit(c0, "I", "b0")
        emit(c1, "I", "b1")
    for _ in range(p - r):  # cool-down 2: chunk-0 I, each followed by a pending chunk-0 W
        emit(c0, "I", "b0")
        emit(c0, "W", None, w0)
        w0 += 1
    actions += [Action(c1, "W", i) for i in range(w1, cnt["b1"])]
    actions += [Action(c0, "W", i) for i in range(w0, cnt["b0"])]
    return [a for a in actions if a.mb < m]


def dualpipev(p: int, v: int, m: int) -> list[list[Action]]:
    # DualPipeV (DeepSeek's DualPipe folded into a V). Eight labelled phases with closed-form counts;
    # an overlapped forward/backward pair is written as its two actions, forward first.
    return [_dualpipev_rank(p, m, r) for r in range(p)]


def _dualpipev_rank(p: int, m: int, r: int) -> list[Action]:
    s0, s1 = r, 2 * p - 1 - r
    nxt: dict[tuple[int, str], int] = {}  # (stage, "F" | "I" | "W") -> next micro-batch
    pending_w: list[tuple[int, int]] = []  # (stage, mb) whose I ran and whose W is still due
    actions: list[Action] = []

    def fwd(stage: int) -> None:
        mb = nxt.get((stage, "F"), 0)
        nxt[(stage, "F")] = mb + 1
        actions.append(Action(stage, "F", mb))

    def bwd(stage: int, split: bool) -> None:
        mb = nxt.get((stage, "I"), 0)
        nxt[(stage, "I")] = mb + 1
        if split:
            actions.append(Action(stage, "I", mb))
            pending_w.append((stage, mb))
        else:
            actions.append(Action(stage, "B", mb))

    def weight() -> None:
        if pending_w:
            stage, mb = pending_w.pop(0)
            actions.append(Action(stage, "W", mb))

    for _ in range((p - r - 1) * 2):  # 1: F0
        fwd(s0)
    for _ in range(r + 1):  # 2: F0 F1
        fwd(s0)
        fwd(s1)
    for _ in range(p - r - 1):  # 3: I1 W F1 (zero bubble)
        bwd(s1, split=True)
        weight()
        fwd(s1)
    for _ in range(m - 2 * p + r + 1):  # 4 (main): (F0, B1) (F1, B0) overlapped
        fwd(s0)
        bwd(s1, split=False)
        fwd(s1)
        bwd(s0, split=False)
    for _ in range(p - r - 1):  # 5: B1, then (F1, B0)
        bwd(s1, split=False)
        fwd(s1)
        bwd(s0, split=False)
    split = False
    for i in range(r + 1):  # 6: B1 B0, switching to split backwards half way
        if i == (r + 1) // 2 and r % 2 == 1:
            split = True
        bwd(s1, split)
        if i == (r + 1) // 2 and r % 2 == 0:
            split = True
        bwd(s0, split)
    for _ in range(p - r - 1):  # 7: W, B0
        weight()
        bwd(s0, split)
    for _ in range(r + 1):  # 8: the remaining W
        weight()
    return actions
