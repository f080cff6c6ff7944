"""The gradient noise scale of every stage, measured from the micro-batch gradients a pipeline step computes
anyway (McCandlish et al. 2018, arXiv 1812.06162; METHOD.md section 9).

Note [noise scale]: a mini-batch gradient over b tokens has E|g_b|^2 = |G|^2 + tr(Sigma) / b, where G is the
true gradient and Sigma the per-token gradient covariance. A step computes each micro-batch's gradient g_m
(mean over B_small tokens: one replica's micro-batch) and their mean G_step (over B_big = B_small x the
(replica, micro-batch) pairs that reached the tensor). The two-batch estimates (their appendix A)
    |G|^2     ~ (B_big |G_step|^2 - B_small S) / (B_big - B_small)
    tr(Sigma) ~ (S - |G_step|^2) / (1 / B_small - 1 / B_big),      S = mean over pairs of |g_m|^2,
are unbiased but noisy: each is smoothed per tensor over the measured steps (by `--noise-estimator`,
tfrun.freeze.noise_estimators Note [robust noise]) before the ratio B_noise = tr(Sigma) / |G|^2, the noise scale
in tokens. A stage's is the ratio of its tensors' sums; its |G|^2 share says how much of the model's progress it
carries. A measured step in which a stage's tensors were reached by fewer than two micro-batches, or whose
values are not finite, leaves that stage's estimates as they were and is recorded (`noise_skipped`).

|g_m|^2 comes from a hook on every trainable tensor (`Tensor.register_hook`, which fires with one backward
call's gradient before it is added to .grad: in a full B, a restricted autograd.grad and a split W alike);
G_step from .grad after the data-parallel reduction, before --grad-rescale and the optimizer. A tensor frozen
in some micro-batches counts only those that reached it (B_big is then smaller). The replicas' sums are
all-reduced before anyone uses them, so every replica holds the same estimates. Measured every `every`
steps (`tfrun train --noise-every`); the hooks cost one reduction over each gradient per micro-batch.

Note [shadow gradients]: the goodput controller's measured steps compute whole micro-batches unfrozen on every stage
(tfrun.freeze.controller Note [unfrozen measurement]), so that a heavily frozen stage keeps its estimate. The
gradients those micro-batches compute for tensors the plan freezes in them are shadows: a hook counts them for the
noise scale as any other (|g_m|^2, and G_step = .grad plus their sum at .grad's scale, summed over the replicas),
then returns zeros, so .grad holds exactly what the plan's own micro-batches give, and a tensor only shadows reached
gets no .grad (as under the plan: no Adam moment update, no decay). The update is then the plan's, bit for bit, and
a measured step is not a switch of the gradient's scale under Adam's second moment. While those micro-batches
trained, the seeded goodput mode measuring without re-plans kept 0.72 / 0.70 / 0.78 of a step's progress from
scratch (data seeds 0 / 1 / 2) where with shadows it keeps 0.88 / 0.80 / 0.85, and 0.82 against 0.78 crossing
(docs/results.md, "Shadow gradients"): an effect of either sign that no learning model prices. `--grad-rescale`
and the freezer's stats count the shadows as frozen (tfrun.distributed.runtime); timing counts what ran.

Note [noise measure]: `--noise-measure` says what the small batch is, separately from how steps are smoothed
(`--noise-estimator`, a smoother over steps that takes either):
  microbatch  B_small = one (replica, micro-batch) pair's tokens, |g_m|^2 as above;
  sequence    B_small = one sequence's tokens and S = the mean over the step's sequences of |g_i|^2, g_i the
              gradient of sequence i's mean token loss (tfrun.freeze.noise_perseq Note [per-sequence norms]);
              B_big and G_step as above. S depends only on the step's sequences, not on how micro-batches and
              replicas group them, so --dp 1 and --dp 2 on the same data give the same estimate, and it is the
              quantity tfrun.freeze.noise_reference's definition averages. S comes from every sequence, the
              linear layers' norms through random projections drawn alike at any --dp (noise_perseq Notes
              [sketched norms], [sequence subset]). A tensor with fewer than two sequences' norms in a step (a
              module kind noise_perseq does not know, a tied tensor, a step too short or a tensor too often
              frozen to give two sequences) is measured per micro-batch that step, as under `microbatch`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from tfrun.config.train_config import (
    DEFAULT_NOISE_ESTIMATOR,
    DEFAULT_NOISE_MEASURE,
    DEFAULT_NOISE_WINDOW,
    NOISE_MEASURES,
)
from tfrun.freeze.candidates import Candidate
from tfrun.freeze.noise_estimators import TensorNoise
from tfrun.freeze.noise_perseq import SequenceNorms


class NoiseMeter:
    """Note [noise scale] for one rank's stages."""

    def __init__(self, modules: dict[int, nn.Module], stage_candidates: dict[int, list[Candidate]], *,
                 num_microbatches: int, microbatch_tokens: int, every: int, dp: int = 1, dp_group=None,
                 dp_rank: int = 0,
                 estimator: str = DEFAULT_NOISE_ESTIMATOR, window: int = DEFAULT_NOISE_WINDOW,
                 measure: str = DEFAULT_NOISE_MEASURE) -> None:
        assert measure in NOISE_MEASURES, measure
        self.every, self.m, self.b_small = every, num_microbatches, microbatch_tokens
        self.dp, self.dp_group = dp, dp_group
        self.names = {s: [c.name for c in cands] for s, cands in stage_candidates.items()}
        self.numel = {s: torch.tensor([float(c.numel) for c in cands], dtype=torch.float64)
                      for s, cands in stage_candidates.items()}
        self.active = False
        self._sums: dict[int, StepSums] = {}
        """Stage -> what this step's gradient hooks saw."""
        self.sequences = (SequenceNorms(modules, self.names, replica=dp_rank, replicas=dp) if measure == "sequence"
                          else None)
        """`--noise-measure sequence`: the per-sequence norms (Note [noise measure]); None: per micro-batch."""
        self.smoothed: dict[int, TensorNoise] = {}
        """Stage -> its per-tensor |G|^2 and tr(Sigma), smoothed over measured steps by `estimator`."""
        self.raw: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        """Stage -> the last measured step's per-tensor (|G|^2, tr(Sigma), usable) before smoothing: what another
        smoother would be fed (tfrun.freeze.noise_reference.pipeline_estimate runs several on one measurement)."""
        self.skipped: list[int] = []
        """Local stages the step just measured left out (no tensor reached twice, or a value not finite)."""
        self.measured = 0
        """Steps measured so far."""
        self.measured_this_step = False
        """Whether the step in progress (or just ended) was measured."""
        self.shadow: Callable[[int, int, int], frozenset[str]] | None = None
        """(step, stage, micro-batch) -> the names whose gradient in that backward is a shadow (Note [shadow
        gradients]; the training loop sets tfrun.freeze.freezing.Freezer.shadowed); None: no shadows."""
        self.microbatch_of: dict[int, Callable[[], int | None]] = {}
        """Stage -> the micro-batch its backward runs now (tfrun.distributed.runtime.backward_microbatch)."""
        self._index = {s: {name: i for i, name in enumerate(names)} for s, names in self.names.items()}
        self._step = -1
        self._shadowed_of: dict[tuple[int, int | None], frozenset[int]] = {}
        self._shadow: dict[int, dict[int, torch.Tensor]] = {s: {} for s in modules}
        """Stage -> tensor index -> the sum of its shadow gradients this step."""
        self._reached: dict[int, set[int]] = {s: set() for s in modules}
        """Stage -> the tensors some micro-batch's gradient reached .grad in this step."""
        self._handles = []
        # Hooks on every tensor even with every = 0 (a forced measurement needs them); an inactive one is a
        # Python call that returns at once (about a microsecond a tensor per micro-batch).
        for s, module in modules.items():
            params = dict(module.named_parameters())
            device = next(iter(params.values())).device if params else torch.device("cpu")
            self._sums[s] = StepSums(len(self.names[s]), device)
            self.smoothed[s] = TensorNoise(estimator, len(self.names[s]), window, device)
            for i, name in enumerate(self.names[s]):
                self._handles.append(params[name].register_hook(self._hook(s, i)))

    def _hook(self, stage: int, i: int):
        def hook(grad: torch.Tensor) -> torch.Tensor | None:
            if not self.active:
                return None
            self._sums[stage].add(i, grad, self.sequences.take(stage, i) if self.sequences is not None else None)
            if i not in self._shadowed(stage):
                self._reached[stage].add(i)
                return None
            held = self._shadow[stage]  # Note [shadow gradients]: counted here, kept out of .grad
            held[i] = grad.detach().clone() if i not in held else held[i].add_(grad.detach())
            return torch.zeros_like(grad)

        return hook

    def _shadowed(self, stage: int) -> frozenset[int]:
        """The tensors of `stage` whose gradient in the backward now running is a shadow (Note [shadow
        gradients]): what `shadow` names for the stage's current backward micro-batch, cached per step."""
        if self.shadow is None or stage not in self.microbatch_of:
            return frozenset()
        mb = self.microbatch_of[stage]()
        got = self._shadowed_of.get((stage, mb))
        if got is None:
            index = self._index[stage]
            got = self._shadowed_of[(stage, mb)] = frozenset(
                index[n] for n in self.shadow(self._step, stage, mb)) if mb is not None else frozenset()
        return got

    def begin_step(self, step: int, force: bool = False) -> None:
        """Measure this step or not: every `every` steps, or when `force`d (the online mode's monitor phase under
        --objective goodput, which plans from the estimates)."""
        self.active = self.measured_this_step = force or (self.every > 0 and step % self.every == 0)
        self._step = step
        self._shadowed_of.clear()
        for s in self._sums:
            self._shadow[s], self._reached[s] = {}, set()
        if self.sequences is not None:
            self.sequences.active, self.sequences.step = self.active, step
            self.sequences.clear()
        if self.active:
            for sums in self._sums.values():
                sums.clear()

    def after_reduce(self, modules: dict[int, nn.Module]) -> bool:
        """The step's gradients are reduced over the replicas (and not yet rescaled): fold this step's
        estimates into the averages. Returns whether the step was measured. Collective over the replicas."""
        if not self.active:
            return False
        self.active = False
        if self.sequences is not None:
            self.sequences.active = False
            self.sequences.clear()
        self.skipped = []
        for s, module in modules.items():
            params = dict(module.named_parameters())
            sq, n, seq = self._sums[s].tensors()
            if self.dp > 1:
                both = torch.cat([sq, n, seq.reshape(-1)])
                dist.all_reduce(both, group=self.dp_group)
                sq, n, seq = both[: len(sq)], both[len(sq): 2 * len(sq)], both[2 * len(sq):].view(4, -1)
            big = self._step_gradient_norms(s, params, sq.device)
            # .grad = sum of the pairs' gradients / (dp M) (scale_grads and the replicas' mean): their mean is
            # .grad x dp M / n, so |G_step|^2 = |.grad|^2 (dp M / n)^2 (Note [noise scale])
            usable = n >= 2
            n_safe = torch.where(usable, n, torch.ones_like(n))
            g_step = big * (self.dp * self.m / n_safe) ** 2
            small = sq / n_safe
            b_small, b_big = float(self.b_small), n_safe * self.b_small
            gsq = torch.where(usable, (b_big * g_step - b_small * small) / (b_big - b_small), torch.zeros_like(n))
            trace = torch.where(usable, (small - g_step) / (1 / b_small - 1 / b_big), torch.zeros_like(n))
            if self.sequences is not None:  # Note [noise measure]: where two sequences gave their norms
                per_seq = self.sequences.measured[s].to(n.device) & (n >= 1) & (seq[1] >= 2)
                count = torch.where(per_seq, seq[1], torch.full_like(n, 2.0))
                mean_sq = seq[0] / count
                # tokens of one sequence: the seq[2] pairs with norms, B_small tokens each, held seq[3] sequences
                # (not B_big / count: the norms come from a subset, noise_perseq Note [sequence subset])
                b_seq = b_small * seq[2] / torch.where(per_seq, seq[3], torch.ones_like(n))
                gsq = torch.where(per_seq, (b_big * g_step - b_seq * mean_sq) / (b_big - b_seq), gsq)
                trace = torch.where(per_seq, (mean_sq - g_step) / (1 / b_seq - 1 / b_big), trace)
                usable |= per_seq
            # a step that is not finite (tfrun.train Note [non-finite steps]) leaves the estimates as they were
            usable &= torch.isfinite(gsq) & torch.isfinite(trace)
            if not bool(usable.any()):
                self.skipped.append(s)
            self.smoothed[s].add(gsq, trace, usable)
            self.raw[s] = (gsq, trace, usable)
        self.measured += 1
        return True

    def _step_gradient_norms(self, stage: int, params: dict[str, nn.Parameter], device) -> torch.Tensor:
        """Per tensor |.grad + its shadows|^2, float64 (tensors,), the shadows scaled as .grad is and summed
        over the replicas (one all-reduce); then a tensor only shadows reached gets no .grad, as under the plan
        (Note [shadow gradients])."""
        held = self._shadow[stage]
        if held and self.dp > 1:
            flat = torch.cat([held[i].reshape(-1) for i in sorted(held)])
            dist.all_reduce(flat, group=self.dp_group)
            offset = 0
            for i in sorted(held):
                held[i] = flat[offset: offset + held[i].numel()].view_as(held[i])
                offset += held[i].numel()
        out = []
        for i, name in enumerate(self.names[stage]):
            grad = params[name].grad
            if i in held:  # .grad is (sum over the pairs) / (dp M): the shadows' sum takes the same scale
                whole = held[i] / (self.dp * self.m) + (grad if grad is not None else 0.0)
                out.append(whole.detach().double().square().sum())
                if i not in self._reached[stage]:
                    params[name].grad = None
            elif grad is not None:
                out.append(grad.detach().double().square().sum())
            else:
                out.append(torch.zeros((), dtype=torch.float64, device=device))
        self._shadow[stage] = {}
        return torch.stack(out)

    def stage_estimates(self) -> dict[int, tuple[float, float]]:
        """Stage -> (|G|^2, tr(Sigma)) smoothed, summed over its tensors that have an estimate; a stage none of
        whose tensors was reached by two micro-batches of a measured step (a plan that freezes it heavily)
        is left out."""
        out = {s: noise.stage() for s, noise in self.smoothed.items()}
        return {s: v for s, v in out.items() if v is not None}

    def update_norms(self) -> dict[int, float]:
        """Stage -> sum over its tensors of sqrt(n |G|^2), n the tensor's scalars: the weight of the adam learning
        model (tfplan.cost.goodput Note [learning models]), from the smoothed estimates (a tensor without one, or
        with no positive |G|^2, adds nothing); stages with no estimate left out."""
        out = {}
        for s, noise in self.smoothed.items():
            if not self.measured:
                continue
            gsq, _, have = noise.values()
            part = torch.sqrt(self.numel[s].to(gsq.device) * gsq.clamp(min=0.0)) * have
            if bool(have.any()):
                out[s] = float(part.sum())
        return out

    def tensor_estimates(self, stage: int) -> dict[str, tuple[float, float]]:
        """Tensor name -> (|G|^2, tr(Sigma)) smoothed, for one local stage's tensors that have an estimate."""
        if not self.measured or stage not in self.smoothed:
            return {}
        gsq, trace, have = self.smoothed[stage].values()
        return {name: (float(gsq[i]), float(trace[i])) for i, name in enumerate(self.names[stage]) if have[i]}

    def state_dict(self) -> dict:
        return {"smoothed": {s: t.state_dict() for s, t in self.smoothed.items()}, "measured": self.measured}

    def load_state_dict(self, state: dict) -> None:
        if "smoothed" not in state:  # a checkpoint written before the estimators (issue 36): the published form's
            for s, noise in self.smoothed.items():
                if noise.estimator == "ema" and s in state["gsq"]:
                    noise.ema = torch.stack([state["gsq"][s], state["trace"][s]])
                    noise.counts = state["counts"][s]
        else:
            for s, sub_state in state["smoothed"].items():
                self.smoothed[s].load_state_dict(sub_state)
        self.measured = int(state["measured"])

    def gathered(self) -> tuple[dict[int, tuple[float, float]], list[int]]:
        """stage_estimates of every stage, and the stages the last measured step left out (`skipped`), on every
        rank: one gather over the default group."""
        parts = _from_every_rank((self.stage_estimates(), self.skipped))
        return {s: v for part, _ in parts for s, v in part.items()}, sorted({s for _, part in parts for s in part})

    def gathered_update_norms(self) -> dict[int, float]:
        """update_norms of every stage on every rank: one gather over the default group."""
        return {s: v for part in _from_every_rank(self.update_norms()) for s, v in part.items()}

    def gathered_jackknife(self) -> dict[int, tuple]:
        """Stage -> TensorNoise.leave_one_out (its sums and their leave-one-out values over the window), for every
        stage, on every rank: one gather over the default group (tfrun.freeze.controller Note [learning gate])."""
        local = {s: t.leave_one_out(self.numel[s]) for s, t in self.smoothed.items()} if self.measured else {}
        return {s: v for part in _from_every_rank(local) for s, v in part.items()}

    def close(self) -> None:
        if self.sequences is not None:
            self.sequences.close()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class StepSums:
    """One stage's sums over a measured step, per tensor: |g_m|^2 over the micro-batches that reached it (n of
    them); under the sequence measure, |g_i|^2 over the chosen sequences, those sequences, the micro-batches that
    gave them and all those micro-batches' sequences. Kept as Python lists and folded into tensors once, at the
    step's end: a tensor op per hook call costs more than the reduction it records."""

    def __init__(self, tensors: int, device: torch.device) -> None:
        self.tensors_, self.device = tensors, device
        self.clear()

    def clear(self) -> None:
        self.norms: list[torch.Tensor] = []  # |g_m|, float64 scalars, one per hook call
        self.norm_of: list[int] = []  # their tensors
        self.seq_sq: list[torch.Tensor] = []
        self.seq_of: list[int] = []
        self.counts = [[0] * self.tensors_ for _ in range(4)]  # micro-batches, sequences, pairs, their sequences

    def add(self, i: int, grad: torch.Tensor, sequences: tuple[torch.Tensor, int, int] | None) -> None:
        self.norms.append(torch.linalg.vector_norm(grad.detach(), dtype=torch.float64))
        self.norm_of.append(i)
        self.counts[0][i] += 1
        if sequences is not None:
            self.seq_sq.append(sequences[0])
            self.seq_of.append(i)
            self.counts[1][i] += sequences[1]
            self.counts[2][i] += 1
            self.counts[3][i] += sequences[2]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sum of |g_m|^2, micro-batches), each (tensors,), and the sequence measure's (4, tensors): sum of
        |g_i|^2, sequences, pairs, their sequences; float64."""
        counts = torch.tensor(self.counts, dtype=torch.float64, device=self.device)
        sq = self._folded(torch.stack(self.norms).square() if self.norms else None, self.norm_of)
        seq_sq = self._folded(torch.stack(self.seq_sq) if self.seq_sq else None, self.seq_of)
        return sq, counts[0], torch.cat([seq_sq[None], counts[1:]])

    def _folded(self, values: torch.Tensor | None, of: list[int]) -> torch.Tensor:
        out = torch.zeros(self.tensors_, dtype=torch.float64, device=self.device)
        if values is not None:
            out.index_add_(0, torch.tensor(of, device=self.device), values.to(device=self.device, dtype=torch.float64))
        return out


def _from_every_rank(local) -> list:
    """Every rank's `local` (a picklable object), in rank order: one gather over the default group ([local]
    when not distributed)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [local]
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return parts


def noise_scale(gsq: float, trace: float) -> float | None:
    """tr(Sigma) / |G|^2 in tokens; None when |G|^2 is not positive (too few measured steps, or a gradient
    indistinguishable from noise).

    >>> noise_scale(2.0, 1000.0), noise_scale(0.0, 5.0)
    (500.0, None)
    """
    return trace / gsq if gsq > 0 and math.isfinite(trace) else None
