"""The pipeline's noise scale against its definition (issue 36): per stage, the exact noise scale of the tiny
model at fixed weights from per-sequence gradients (tfrun.freeze.noise_reference Note [exact noise scale]: several
hundred sequences, unbiased tr(Sigma) and |G|^2), against what the pipeline's own NoiseMeter measures at the
same weights with each `--noise-estimator` and `--noise-measure` (steps of fresh batches, 8 micro-batches of 4 x
128 tokens, the weights unchanged). At initialisation and after training, on two corpora (the default one and the
standard library's source). The pipeline's figure is the median over the measured steps of the smoothed estimate,
as summary.json and the profile's noise section report it, and the last step's.

    python benchmarks/noise_reference.py                     # about 6 minutes on 2 CPU cores
    python benchmarks/noise_reference.py --sequences 128 --train-steps 20 --corpora default
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

M, MB_SIZE, SEQ = 8, 4, 128


_OPTIMIZERS: dict = {}


def trained(stages, corpus_tokens, steps: int, start: int = 0) -> None:
    """`steps` AdamW steps (lr 3e-4) of the chained stages on the corpus from batch `start`, as `tfrun train
    --freeze none` takes them (one optimizer per model, kept between calls)."""
    import torch

    from tfrun.data import Batches
    from tfrun.models import loss_fn

    params = [p for m in stages.values() for p in m.parameters()]
    opt = _OPTIMIZERS.setdefault(id(stages), torch.optim.AdamW(params, lr=3e-4))
    batches = Batches(corpus_tokens, global_batch=M * MB_SIZE, seq_len=SEQ, seed=0)
    for step in range(start, start + steps):
        x, y = batches.batch_at(step)
        for xs, ys in zip(x.chunk(M), y.chunk(M)):
            out = xs
            for s in sorted(stages):
                out = stages[s](out)
            (loss_fn(out, ys) / M).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=512, help="sequences of the exact reference")
    parser.add_argument("--steps", type=int, default=30, help="measured steps of the pipeline's estimate")
    parser.add_argument("--train-steps", type=int, default=150, help="training before the second measurement")
    parser.add_argument("--corpora", default="default,stdlib")
    parser.add_argument("--estimators", default="ema,median,winsor")
    parser.add_argument("--measures", default="microbatch,sequence",
                        help="--noise-measure values, each against the same exact reference")
    parser.add_argument("--trajectory", default=None,
                        help="instead: the exact noise scale along `tfrun train --freeze none`'s own trajectory "
                             "at these steps (e.g. 4,8,12,24,29), to set beside benchmarks/noise_estimators.py's")
    args = parser.parse_args()
    import torch

    from tfrun.data import Batches, encode, load_corpus, split_tokens
    from tfrun.freeze.noise_reference import exact, pipeline_estimate
    from tfrun.models import MODELS, build_stage, loss_fn

    torch.set_num_threads(1)
    if args.trajectory:
        tokens = split_tokens(encode(load_corpus(None)))[0]
        stages = {s: build_stage(MODELS["tiny"], s, 2, 0) for s in (0, 1)}
        done = 0
        for step in sorted(int(k) for k in args.trajectory.split(",")):
            trained(stages, tokens, step - done, start=done)  # the weights the run measures at step `step`
            done = step
            x, y = Batches(tokens, global_batch=args.sequences, seq_len=SEQ, seed=12345).batch_at(0)
            reference = exact(stages, loss_fn, x, y)
            print(f"step {step}: exact noise scale " + ", ".join(f"stage {s} {v:,.0f}" for s, v in
                                                                  sorted(reference.items())) + " tokens", flush=True)
        return
    print(f"noise scale against its definition: tiny model (2 stages), {args.sequences} sequences of {SEQ} tokens "
          f"for the reference, {args.steps} steps of {M} x {MB_SIZE} x {SEQ} for the pipeline; load "
          f"{os.getloadavg()[0]:.2f} at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    for corpus in args.corpora.split(","):
        tokens = split_tokens(encode(load_corpus(None if corpus == "default" else corpus)))[0]
        stages = {s: build_stage(MODELS["tiny"], s, 2, 0) for s in (0, 1)}
        for when in ("initialisation", f"{args.train_steps} training steps"):
            if when != "initialisation":
                trained(stages, tokens, args.train_steps)
            ref_batches = Batches(tokens, global_batch=args.sequences, seq_len=SEQ, seed=12345)
            x, y = ref_batches.batch_at(0)
            t0 = time.perf_counter()
            reference = exact(stages, loss_fn, x, y)
            exact_text = ", ".join(f"stage {s} {v:,.0f}" for s, v in sorted(reference.items()))
            print(f"\n{corpus} corpus, {when}: exact noise scale {exact_text} tokens "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
            batches = Batches(tokens, global_batch=M * MB_SIZE, seq_len=SEQ, seed=777)
            trails = pipeline_estimate(stages, loss_fn, batches, steps=args.steps, num_microbatches=M,
                                       estimators=tuple(args.estimators.split(",")),
                                       measures=tuple(args.measures.split(",")))
            for (measure, estimator), trail in trails.items():
                cells = []
                for s in sorted(reference):
                    values = [row[s] for row in trail if row[s] is not None]
                    med, last = statistics.median(values), values[-1]
                    cells.append(f"stage {s} median {med:,.0f} (x{med / reference[s]:.2f}), last {last:,.0f} "
                                 f"(x{last / reference[s]:.2f})")
                print(f"  {measure:10s} {estimator:7s} " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
