"""Per-sequence gradient norms, computed alongside the backward (`--noise-measure sequence`): the small-batch
side of the two-batch noise estimator at one sequence instead of one micro-batch (tfrun.freeze.noise).

Note [per-sequence norms]: for a measured step and every trainable tensor W, the sum over the step's sequences
of |g_i|^2, g_i the gradient of sequence i's mean token loss (Gray et al. 2024, arXiv 2411.00999; Goodfellow's
per-example gradient-norm trick). A micro-batch of b sequences has loss L = (1/b) sum_i L_i (loss_fn: the mean
over its b x T tokens), so the gradient a module's output receives, go (b, T, d_out), splits by sequence into
go_i = dL/dy_i = (1/b) dL_i/dy_i, and g_i = b x (sequence i's share of the weight gradient built from go_i).
Per module kind, from its forward input x and go, without a per-sequence gradient where that is cheaper:
  nn.Linear     g_i = b sum_t go_t x_t^T (d_out x d_in). Either materialised one sequence at a time
                (T d_in d_out multiply-adds) or |.|^2 = sum_{t,t'} (x_t.x_t') (go_t.go_t') from the two
                (T x T) Gram matrices (T^2 (d_in + d_out)), whichever is fewer; the input's Gram matrix is
                computed once for the layers that read the same tensor (wq, wk, wv; w1, w3). Bias: b sum_t go_t.
                Either way about as many multiply-adds as the weight gradient itself (T ~ d), so by default
                estimated through a random projection where that is cheaper (Note [sketched norms]).
  nn.Embedding  g_i = b x (go_t summed into its token's row): the rows of (sequence, token id) pairs, summed
                with one index_add over the micro-batch; no (V x d) matrix per sequence.
  RMSNorm       g_i = b sum_t go_t * xhat_t (d), xhat = x / rms(x) recomputed from the input with the
                module's eps, in float32 as its forward does (tfrun.models.llama.RMSNorm).
Any other tensor (and a tensor shared by two modules, whose per-sequence gradient is the sum of both parts:
a tied embedding and head) has no per-sequence value; tfrun.freeze.noise measures it per micro-batch.
Sequences are dim 0 of every module's input and output (as in tfrun.models); a module runs once per forward.

Capture: a forward hook keeps the module's input (detached: the storage autograd already saves) and puts a
hook on its output, which fires once with go in that micro-batch's backward (B, or I of a split backward;
W on stage 0). A split W may run the output's node again (RMSNorm's product is the node that W starts from),
so each output's hook counts only its first call. The value waits, keyed by (stage, tensor, micro-batch), for
the tensor's own gradient hook (tfrun.freeze.noise), which takes it: a tensor frozen in that micro-batch
(detached in its forward, or left out of its backward; tfrun.distributed.runtime Note [freeze methods]) gets
no gradient, so its waiting value is never counted and is dropped at the step's end. A tensor detached in the
forward is skipped at once. The micro-batch is the stage's backward micro-batch (`microbatch_of`); without
one (a single process running each backward to the end) the key is None. Forwards outside a micro-batch
(torch's first-step metadata inference, on placeholder tensors; `forward_of`) are ignored. Hooks do nothing on
steps that are not measured.

Note [sketched norms]: a linear layer's exact norms take about as many multiply-adds as its weight gradient (T ~
d above), so norms of every sequence would add about a third to a measured micro-batch. With `sketch` k > 0 (the
default, SKETCH) they are estimated through random projections where that is cheaper: for sequence i a P_i
(d_in x k), entries N(0, 1 / k), so E[P_i P_i^T] = I and E|G P_i|^2 = |G|^2 for any matrix G; then
|g_i|^2 ~ b^2 |go_i^T (x_i P_i)|^2, T k (d_in + d_out) multiply-adds a sequence (x_i P_i shared by the layers
reading one input) instead of T^2 (d_in + d_out): 8x fewer for the tiny model (T = 128, k = 16), T / k fewer at
T ~ d. Unbiased, so S stays an unbiased |G|^2 + tr(Sigma) / B_small. One sequence's estimate has a relative
variance of at most 2 / k (a rank-one gradient; 2 / (k r) for effective rank r); each sequence has its own P_i,
so these errors are independent and S's relative error from the sketch falls as 1 / sqrt(sequences) (a P
shared by a step's sequences would leave S with an error that no number of sequences averages out). P_i is
drawn on the CPU from a seed of (step, stage, the input's first measured reader, the sequence's row in the
step's batch): every device, every replica and every grouping of the step's sequences into micro-batches draws
the same P_i, so --dp 1 and --dp 2 still agree. (When that first reader is frozen in a micro-batch, the next
one seeds it there: other values, as unbiased, and the same on every replica, which freeze alike.) The
embedding, RMSNorm and biases are exact and cheap (T d a sequence).

Note [sequence subset]: norms can come from one sequence in `stride` of every micro-batch (STRIDE = 1, every
sequence, by default since the linear layers' norms are sketched: the first version computed them exactly for
one sequence in four, as cheap, but S then held a quarter of the sequences and scattered about twice as much as
the micro-batch measure's where the noise scale exceeds the batch). In micro-batch i (the index the stage's
forward runs, `forward_of`) the sequences r (row of the whole micro-batch, over all replicas) with
(r + i) % stride == 0. S is their mean, still an unbiased |G|^2 + tr(Sigma) / B_small; G_step keeps every
micro-batch. Why these rows:
  - the same sequences at any --dp: micro-batch i holds the same sequences whatever --dp is, replica k rows
    [k b, (k + 1) b) of them (tfrun.distributed.rank.replica_rows), so a replica picks its rows from its
    offset k b (`chosen_rows`), and the replicas share the work;
  - one outlier micro-batch weighs what its share of the batch does: every micro-batch gives its share of the
    subset (every stride-th micro-batch whole would let one outlier be all of S at M = stride);
  - the offset turns with i, so micro-batches of fewer than `stride` sequences still give norms.
A tensor frozen (detached) in a micro-batch's forward gives no norms there; under --freeze-method grad the
forward cannot tell a frozen tensor, and a micro-batch that leaves it out of its backward gives none either.
So a tensor that one micro-batch of one sequence reached in a step has one sequence's norms, too few for the
step's estimate (tfrun.freeze.noise leaves it out of that step, as the micro-batch measure does): under heavy
freezing its estimate comes from the steps that reached it more.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tfrun.models.llama import RMSNorm

STRIDE = 1
"""Per-sequence norms come from one sequence in STRIDE of every micro-batch (Note [sequence subset]): every one,
since the linear layers' norms are sketched (Note [sketched norms])."""
SKETCH = 16
"""Columns k of the linear layers' random projections (Note [sketched norms]); 0: exact norms."""


def chosen_rows(microbatch: int, rows: int, replica: int, stride: int = STRIDE) -> slice:
    """The rows of one replica's share (`rows` sequences, replica `replica`) of micro-batch `microbatch` whose
    norms are computed (Note [sequence subset]): whole-micro-batch rows r = replica x rows + j with
    (r + microbatch) % stride == 0.

    >>> chosen_rows(0, 4, 0, 4), chosen_rows(1, 4, 0, 4), chosen_rows(1, 2, 1, 4), chosen_rows(2, 1, 0, 4)
    (slice(0, 4, 4), slice(3, 4, 4), slice(1, 2, 4), slice(2, 1, 4))
    >>> chosen_rows(1, 4, 0)  # the default, STRIDE = 1: every row
    slice(0, 4, 1)
    """
    return slice((-(replica * rows + microbatch)) % stride, rows, stride)


class SharedInput:
    """One module input, (b, ..., d_in), and what the linear layers that read it (attention's wq, wk and wv; the
    MLP's w1 and w3) share: the Gram matrices of its sequences, (b, T, T), or its sketch x_i P_i, (b, T, k),
    computed once. P_i (d_in x k, entries N(0, 1 / k)) is drawn for sequence i from seeds[i] (Note [sketched
    norms])."""

    __slots__ = ("x", "readers", "gram", "seeds", "sketch")

    def __init__(self, x: torch.Tensor, seeds: list[int] | None = None) -> None:
        self.x, self.readers, self.gram, self.sketch = x, 1, None, None
        self.seeds = list(range(x.shape[0])) if seeds is None else seeds
        assert len(self.seeds) == x.shape[0], (len(self.seeds), x.shape)

    def x_gram(self) -> torch.Tensor:
        if self.gram is None:
            x = _wide(self.x).reshape(self.x.shape[0], -1, self.x.shape[-1])
            self.gram = x @ x.transpose(1, 2)
        return self.gram

    def x_sketch(self, k: int) -> torch.Tensor:
        if self.sketch is None:
            x = _wide(self.x).reshape(self.x.shape[0], -1, self.x.shape[-1])
            self.sketch = x @ projections(self.seeds, x.shape[-1], k).to(x.device, x.dtype)
        return self.sketch


def projections(seeds: list[int], d_in: int, k: int) -> torch.Tensor:
    """(len(seeds), d_in, k): one P per seed, entries N(0, 1 / k), drawn on the CPU so that every device and every
    replica draws the same values from the same seed (Note [sketched norms])."""
    gen = torch.Generator()
    out = torch.empty(len(seeds), d_in, k)
    for i, seed in enumerate(seeds):
        gen.manual_seed(seed)
        torch.randn(d_in, k, generator=gen, out=out[i])
    return out / k ** 0.5


def linear_sq(shared: SharedInput, go: torch.Tensor, bias: bool, sketch: int = 0) -> list[torch.Tensor]:
    """Sum over sequences of |sum_t go_t x_t^T|^2 (and of |sum_t go_t|^2 with a bias), float64 scalars; x (b, ...,
    d_in) the shared input, go (b, ..., d_out): the per-sequence pieces of the weight gradient (times b for g_i;
    Note [per-sequence norms]). Multiply-adds a sequence: materialised T d_in d_out; from Gram matrices
    T^2 (d_out + d_in / its readers), or T^2 d_out once another reader has computed the input's; with `sketch`
    k > 0 (Note [sketched norms]), T k (d_out + d_in / its readers), an unbiased estimate, where that is fewer."""
    x = shared.x
    b, d_in, d_out = x.shape[0], x.shape[-1], go.shape[-1]
    go = _wide(go).reshape(b, -1, d_out)
    t = go.shape[1]
    share = 0 if shared.gram is not None else d_in / shared.readers
    exact = min(t * (d_out + share), d_in * d_out)  # multiply-adds a token, the cheaper exact way
    if sketch and sketch * (d_out + (0 if shared.sketch is not None else d_in / shared.readers)) < exact:
        weight = (go.transpose(1, 2) @ shared.x_sketch(sketch)).square().sum(dtype=torch.float64)
    elif t * (d_out + share) < d_in * d_out:  # the Gram matrices are cheaper than the gradient itself
        weight = (shared.x_gram() * (go @ go.transpose(1, 2))).sum(dtype=torch.float64)
    else:  # one sequence at a time: memory of one gradient, not b
        x = _wide(x).reshape(b, -1, d_in)
        weight = sum((go[i].T @ x[i]).square().sum(dtype=torch.float64) for i in range(b))
    out = [weight]
    if bias:
        out.append(go.sum(1).square().sum(dtype=torch.float64))
    return out


def embedding_sq(ids: torch.Tensor, go: torch.Tensor, num_embeddings: int, padding_idx: int | None) -> torch.Tensor:
    """Sum over sequences of |the sequence's embedding-gradient piece|^2, a float64 scalar; ids (b, ...) int64, go
    (b, ..., d). Rows of equal (sequence, id) add up before squaring; the padding row gets no gradient."""
    b, d = ids.shape[0], go.shape[-1]
    go = _wide(go).reshape(-1, d)
    keys = (ids + num_embeddings * torch.arange(b, device=ids.device).view(-1, *[1] * (ids.dim() - 1))).reshape(-1)
    if padding_idx is not None:
        go = go * (ids.reshape(-1) != padding_idx).unsqueeze(1)
    unique, where = torch.unique(keys, return_inverse=True)
    rows = torch.zeros(len(unique), d, dtype=go.dtype, device=go.device).index_add_(0, where, go)
    return rows.square().sum(dtype=torch.float64)


def rms_norm_sq(x: torch.Tensor, go: torch.Tensor, eps: float) -> torch.Tensor:
    """Sum over sequences of |sum_t go_t * xhat_t|^2 for RMSNorm's weight, a float64 scalar; x, go (b, ..., d)."""
    b, d = x.shape[0], x.shape[-1]
    xf = x.float()
    xhat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)  # as the forward rounds it
    piece = (_wide(go) * _wide(xhat)).reshape(b, -1, d).sum(1)
    return piece.square().sum(dtype=torch.float64)


def _sketch_seed(step: int, stage: int, tensor: int, sequence: int) -> int:
    """The seed of one sequence's projection for one linear input: (step, stage, the input's first measured reader,
    the sequence's row in the step's batch), the same on every replica and for any grouping of the step's
    sequences into micro-batches (Note [sketched norms])."""
    return (((step * 1_000_003 + stage) * 1_000_003 + tensor) * 1_000_003 + sequence) % (2 ** 63)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """float32 at least (bf16 activations under autocast would lose the sums)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _kind(module: nn.Module) -> tuple[str, tuple[str, ...]] | None:
    """(kind, the attributes holding its parameters) of a module this file measures, else None."""
    if type(module) is nn.Linear:
        return "linear", ("weight", "bias")
    if type(module) is nn.Embedding and not module.sparse and module.max_norm is None:
        return "embedding", ("weight",)
    if isinstance(module, RMSNorm):
        return "rms_norm", ("weight",)
    return None


class SequenceNorms:
    """Note [per-sequence norms] for one rank's stages: `take` hands a tensor's per-sequence value to its gradient
    hook. Only stages and tensors named in `names` (a stage's trainable tensors, in tfrun.freeze.noise's order)."""

    def __init__(self, modules: dict[int, nn.Module], names: dict[int, list[str]], *, replica: int = 0,
                 replicas: int = 1, stride: int = STRIDE, sketch: int = SKETCH) -> None:
        self.active = False
        self.replica, self.replicas, self.stride, self.sketch = replica, replicas, stride, sketch
        """This rank's data-parallel index of `replicas`; one sequence in `stride` gives norms (Note [sequence
        subset]); the linear layers' projections have `sketch` columns (Note [sketched norms], 0: exact)."""
        self.step = 0
        """The step being measured (set by tfrun.freeze.noise): with the stage and tensor, it seeds the sketches,
        so that every replica, and any grouping of the step's sequences into micro-batches, draws the same ones."""
        self._forwards: dict[int, int] = {}
        """id(module) -> its forwards in this measured step: the micro-batch index of the next one (without
        `forward_of`)."""
        self.microbatch_of: dict[int, Callable[[], object]] = {}
        """Stage -> the micro-batch its backward is running (set by tfrun.distributed.rank); absent: None."""
        self.forward_of: dict[int, Callable[[], int | None]] = {}
        """Stage -> the micro-batch whose forward it runs now, None outside one (set by tfrun.distributed.rank:
        torch's first step also runs the module on placeholders, to infer shapes); absent: the module's forwards
        in this step, counted (one process running micro-batches in order: noise_reference)."""
        self.measured: dict[int, torch.Tensor] = {}
        """Stage -> per tensor, whether it has a per-sequence value (bool); the others are measured per micro-batch."""
        self._pending: dict[tuple[int, int, object], tuple[torch.Tensor, int, int]] = {}
        """(stage, tensor, micro-batch) -> (sum over its chosen sequences of |g_i|^2, float64; those sequences;
        the micro-batch's sequences), until taken."""
        self._last: tuple[torch.Tensor, int, SharedInput] | None = None
        """The last linear layer's input (the tensor itself, to recognise the next reader), its first chosen row
        and its SharedInput."""
        self._handles = []
        for s, module in modules.items():
            index = {name: i for i, name in enumerate(names[s])}
            owners: dict[int, int] = {}
            for sub in module.modules():
                for p in sub._parameters.values():
                    if p is not None:
                        owners[id(p)] = owners.get(id(p), 0) + 1
            measured = torch.zeros(len(names[s]), dtype=torch.bool)
            for prefix, sub in module.named_modules():
                kind = _kind(sub)
                if kind is None:
                    continue
                entries = []
                for attr in kind[1]:
                    p, name = getattr(sub, attr, None), f"{prefix}.{attr}" if prefix else attr
                    if isinstance(p, nn.Parameter) and name in index and owners[id(p)] == 1:
                        entries.append((attr, index[name]))
                        measured[index[name]] = True
                if entries:
                    self._handles.append(sub.register_forward_hook(self._forward_hook(s, sub, kind[0], entries)))
            self.measured[s] = measured

    def _forward_hook(self, stage: int, module: nn.Module, kind: str, entries: list[tuple[str, int]]):
        def hook(mod, args, output) -> None:
            if not self.active:
                return
            if stage in self.forward_of:
                microbatch = self.forward_of[stage]()
                if microbatch is None:
                    return
            else:
                microbatch = self._forwards.get(id(mod), 0)
                self._forwards[id(mod)] = microbatch + 1
            if not isinstance(output, torch.Tensor) or not output.requires_grad:
                return
            live = [(attr, i) for attr, i in entries if getattr(mod, attr).requires_grad]  # (detached: frozen)
            rows = chosen_rows(microbatch, args[0].shape[0], self.replica, self.stride)
            if not live or rows.start >= rows.stop:
                return
            if kind == "linear":  # the layers reading one tensor share its Gram matrices
                if self._last is not None and self._last[0] is args[0] and self._last[1] == rows.start:
                    x = self._last[2]
                    x.readers += 1
                else:
                    # the sequences' rows in the step's batch: micro-batch i holds rows [i w, (i + 1) w) of it,
                    # w = its rows over all replicas, replica k rows [k b, (k + 1) b) of those (replica_rows)
                    width, first = args[0].shape[0] * self.replicas, self.replica * args[0].shape[0]
                    seeds = [_sketch_seed(self.step, stage, entries[0][1], microbatch * width + first + j)
                             for j in range(rows.start, rows.stop, rows.step)]
                    x = SharedInput(args[0].detach()[rows], seeds)
                    self._last = (args[0], rows.start, x)
            else:
                x = args[0].detach()[rows]
            fired = [False]

            def on_grad(go: torch.Tensor) -> None:
                if fired[0]:  # a split W running this node again (Note [per-sequence norms])
                    return
                fired[0] = True
                key = self.microbatch_of[stage]() if stage in self.microbatch_of else None
                b = go.shape[0]
                picked = go.detach()[rows]
                values = self._values(kind, mod, x, picked, [attr for attr, _ in live], self.sketch)
                for (_, i), value in zip(live, values):
                    self._pending[(stage, i, key)] = (value * (b * b), picked.shape[0], b)  # g_i = b x its piece

            output.register_hook(on_grad)

        return hook

    @staticmethod
    def _values(kind: str, mod: nn.Module, x, go: torch.Tensor, attrs: list[str], sketch: int) -> list[torch.Tensor]:
        with torch.no_grad():
            if kind == "linear":
                weight_and_bias = linear_sq(x, go, bias=mod.bias is not None, sketch=sketch)
                return [weight_and_bias[0] if attr == "weight" else weight_and_bias[1] for attr in attrs]
            if kind == "embedding":
                return [embedding_sq(x, go, mod.num_embeddings, mod.padding_idx)]
            return [rms_norm_sq(x, go, mod.eps)]

    def take(self, stage: int, i: int) -> tuple[torch.Tensor, int, int] | None:
        """The waiting (sum of |g_i|^2, its sequences, the micro-batch's sequences) of tensor i of `stage` in this
        backward's micro-batch, or None."""
        key = self.microbatch_of[stage]() if stage in self.microbatch_of else None
        return self._pending.pop((stage, i, key), None)

    def clear(self) -> None:
        """Drop values no gradient took (tensors frozen in their micro-batch)."""
        self._pending.clear()
        self._forwards.clear()
        self._last = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._pending.clear()
        self._last = None
