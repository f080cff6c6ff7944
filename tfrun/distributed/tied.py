"""Tied embeddings across pipeline stages: one parameter held twice, by the first stage (the embedding) and the
last (the LM head), kept one.

Note [tied embeddings across stages]: a tied model (Llama-3.2, Qwen2.5/3 small, SmolLM, Gemma) uses one matrix
twice: to embed the input tokens on the first stage and to produce the logits on the last. In a pipeline the
two uses sit in different processes, so each of the two stages holds a copy (tfrun.models.llama Note [tied
embeddings]: they start equal), and the copies are kept one parameter, as Megatron's embedding group does:
  * every step, after the data-parallel reduction (each copy's gradient already the replicas' mean) and before
    the gradient norm, the two copies' gradients are summed, by one all-reduce between the two ranks of each
    replica (or an addition where one rank holds both stages, as the V schedules' rank 0 does): both copies
    then hold the gradient of the tied parameter of a one-stage model, the sum of its two uses';
  * the optimizer steps both copies alike (the same gradient, state and settings), so they stay bit-identical;
    the global gradient norm counts the parameter once (`norm_params` leaves the head's copy out) and clipping
    scales both by the same factor;
  * a copy whose use a step left without gradient (its stage froze it in every micro-batch) adds zero; a step
    in which neither use made one leaves both without gradient, so that AdamW skips both;
  * checkpoints store it once, on the first stage's rank: the last stage's rank file leaves out the head's
    weight and its optimizer state, and a resume (or --init-from) fills them from the first stage's rank
    (`restore`); an export writes it once (tie_word_embeddings true: tfrun.records.export).

Note [tied freezing]: each stage's freezer decides for its own use, as for any tensor of that stage:
the head's copy is frozen in a micro-batch when the last stage's plan freezes it there (skipping the head's
weight-gradient matmul, the expensive half), the embedding's when the first stage's does. The tied parameter's
gradient is the sum of the uses that were not frozen, over the micro-batches: the per-micro-batch rule of
METHOD.md section 5, applied to each use. Coupling the two stages' choices would make one stage's plan decide the
other's time, which the LP does not model.
Measured cost: docs/benchmarks.md, "Tied embeddings".
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class TiedEmbedding:
    """The tie between the first stage's embedding and the last stage's head, on this rank (one of the two, both,
    or neither). Build it on every rank, in the same order: it makes one process group per replica. Collective
    methods are called by every rank of the job; ranks outside the tie return at once."""

    def __init__(self, modules: dict[int, nn.Module], num_stages: int, stage_to_rank: list[int], pp_rank: int,
                 dp_rank: int, dp: int) -> None:
        assert num_stages > 1
        pp = len(set(stage_to_rank))
        first, last = stage_to_rank[0], stage_to_rank[num_stages - 1]
        self.embed: nn.Parameter | None = modules[0].embed.weight if 0 in modules else None
        self.head: nn.Parameter | None = modules[num_stages - 1].head.weight if num_stages - 1 in modules else None
        self.last_stage = num_stages - 1
        self.group = None
        self.src = None
        """The global rank of this replica's first stage (whose copy a restore reads)."""
        if first != last:
            for replica in range(dp):  # every rank creates every group (torch's rule), keeps its own
                ranks = [replica * pp + first, replica * pp + last]
                group = dist.new_group(ranks) if dist.get_world_size() > 1 else None
                if replica == dp_rank and pp_rank in (first, last):
                    self.group, self.src = group, ranks[0]

    @property
    def active(self) -> bool:
        """Whether this rank holds a copy."""
        return self.embed is not None or self.head is not None

    @property
    def head_copy(self) -> dict[int, str]:
        """Stage -> the name of the copy a checkpoint leaves out on this rank (the head's), or {}."""
        return {self.last_stage: "head.weight"} if self.head is not None else {}

    def without_copy(self, states: dict[int, dict]) -> dict[int, dict]:
        """Stage state dicts for a checkpoint: the head's copy left out (stored once)."""
        for s, name in self.head_copy.items():
            del states[s][name]
        return states

    def without_copy_state(self, optimizer: torch.optim.Optimizer, state: dict) -> dict:
        """An optimizer state dict for a checkpoint: the head's copy's AdamW state left out."""
        if self.head is not None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            state["state"].pop(next(i for i, p in enumerate(params) if p is self.head), None)
        return state

    def with_placeholder(self, stage: int, module: nn.Module, saved: dict, where: str) -> dict:
        """A stage's saved state with the head's copy, which the checkpoint left out, as a placeholder that
        `restore` then fills. A checkpoint that holds the copy trained the two apart (made before tfrun kept ties
        across stages): refused, as going on would change the model."""
        name = self.head_copy.get(stage)
        if name is None:
            return saved
        if name in saved:
            from tfrun.errors import TfrunError

            raise TfrunError(f"{where}: this checkpoint trained the tied embedding and LM head as two matrices "
                             f"(written before tfrun kept ties across stages); export it (`tfrun export`, it comes "
                             f"out untied) and start from the export with tie_word_embeddings false")
        return {**saved, name: module.state_dict()[name]}

    def reduce(self) -> None:
        """Sum the two copies' gradients into both (Note [tied embeddings across stages])."""
        if self.embed is not None and self.head is not None:  # one rank holds both stages
            grads = [p.grad for p in (self.embed, self.head) if p.grad is not None]
            if len(grads) == 2:
                total = grads[0] + grads[1]
                self.embed.grad, self.head.grad = total, total.clone()
            elif grads:
                self.embed.grad, self.head.grad = grads[0], grads[0].clone()
            return
        mine = self.embed if self.embed is not None else self.head
        if mine is None:
            return
        # the gradient and, last, whether this use made one: a step where neither did leaves both without one
        flat = torch.zeros(mine.numel() + 1, dtype=mine.dtype, device=mine.device)
        if mine.grad is not None:
            flat[:-1] = mine.grad.reshape(-1)
            flat[-1] = 1.0
        dist.all_reduce(flat, group=self.group)
        mine.grad = flat[:-1].view_as(mine).clone() if flat[-1].item() > 0 else None

    def norm_params(self, stage_params: dict[int, list[nn.Parameter]]) -> dict[int, list[nn.Parameter]]:
        """`stage_params` without the head's copy: the global norm counts the tied parameter once."""
        if self.head is None:
            return stage_params
        return {s: [p for p in ps if p is not self.head] for s, ps in stage_params.items()}

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer | None) -> None:
        """After a checkpoint without the head's copy was loaded: the head's weight (and, with `optimizer`, its
        AdamW state) from the first stage's copy."""
        if self.embed is not None and self.head is not None:
            self.head.copy_(self.embed)
            if optimizer is not None and self.embed in optimizer.state:
                optimizer.state[self.head] = {k: v.clone() for k, v in optimizer.state[self.embed].items()}
            return
        mine = self.embed if self.embed is not None else self.head
        if mine is None:
            return
        dist.broadcast(mine.data, src=self.src, group=self.group)
        if optimizer is None:
            return
        has = torch.tensor([float(self.embed is not None and self.embed in optimizer.state)])
        dist.broadcast(has, src=self.src, group=self.group)
        if has.item() == 0:
            return
        if self.embed is not None:
            state = optimizer.state[self.embed]
            for key in ("exp_avg", "exp_avg_sq"):
                dist.broadcast(state[key], src=self.src, group=self.group)
            dist.broadcast(state["step"].reshape(1).to(mine.device), src=self.src, group=self.group)
            return
        exp_avg, exp_avg_sq = torch.empty_like(mine), torch.empty_like(mine)
        step = torch.zeros(1, device=mine.device)
        for t in (exp_avg, exp_avg_sq, step):
            dist.broadcast(t, src=self.src, group=self.group)
        optimizer.state[self.head] = {"step": step.reshape(()).cpu(), "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}

    def agree(self) -> bool:
        """On the ranks of the tie: whether the two copies are bit-identical (True elsewhere). Collective over the
        tie's ranks."""
        if self.embed is not None and self.head is not None:
            return torch.equal(self.embed, self.head)
        mine = self.embed if self.embed is not None else self.head
        if mine is None:
            return True
        other = mine.detach().clone()
        dist.broadcast(other, src=self.src, group=self.group)
        same = torch.tensor([float(torch.equal(other, mine.detach()))])
        dist.all_reduce(same, op=dist.ReduceOp.MIN, group=self.group)
        return same.item() == 1.0
