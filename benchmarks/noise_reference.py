"""The pipeline's noise scale against its definition (issue 36): per stage, the exact noise scale of the tiny
model at fixed weights from per-sequence gradients (tfrun.freeze.noise_reference Note [exact noise scale]:
unbiased tr(Sigma) and |G|^2; sequences are added 256 at a time until the reference's own jackknife standard
error is below --reference-error of its value on every stage, or --max-sequences), against what the pipeline's
own NoiseMeter measures at the same weights with each `--noise-estimator` and `--noise-measure` (steps of fresh
batches, 8 micro-batches of 4 x 128 tokens, the weights unchanged), for several batch streams (--batch-seeds:
the estimate at fixed weights scatters from stream to stream, most where the noise scale exceeds the batch). At
initialisation and after training, on two corpora (the default one and the standard library's source). The
pipeline's figure is the median over the measured steps of the smoothed estimate, as summary.json and the
profile's noise section report it.

With --case heldout, a case nobody tuned the estimator on (issue 45): a model of other widths, heads and depth
than ours (HELDOUT: 6 blocks of width 192, 6 heads of 32, 3 key/value heads) on another corpus (the Python
sources of networkx, which tfplan installs), trained briefly from its initialisation, with --measures also
`sequence-exact` (per-sequence norms without the sketch) to tell the sketch's error from the estimator's.

    python benchmarks/noise_reference.py                     # about 45 minutes on 2 CPU cores
    python benchmarks/noise_reference.py --max-sequences 256 --train-steps 20 --corpora default --batch-seeds 777
    python benchmarks/noise_reference.py --case heldout --estimators winsor \
        --measures sequence,sequence-exact,microbatch
    python benchmarks/noise_reference.py --case heldout --via-profile    # what `tfplan profile` records

With --via-profile, the held-out case as a user meets it: a Hugging Face LLaMA checkpoint of HELDOUT's shape
(transformers' initialisation, written here; transformers is in the dev extra) and networkx's sources as a text
file, profiled by `tfplan profile --model hf:DIR --data FILE` (tfrun.cli.profiling Note [profile at fixed
weights]), its noise section against the exact value at the checkpoint's weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

M, MB_SIZE, SEQ = 8, 4, 128
HELDOUT = {"vocab_size": 256, "dim": 192, "n_layers": 6, "n_heads": 6, "n_kv_heads": 3, "ffn_dim": 512,
           "max_seq_len": 512}
"""The held-out case's shape (--case heldout): other widths, heads and depth than the tiny model's."""


def networkx_sources() -> bytes:
    """Another project's Python sources as bytes: every .py file of the installed networkx, in path order."""
    from pathlib import Path

    import networkx

    root = Path(networkx.__file__).parent
    return b"\n".join(p.read_bytes() for p in sorted(root.rglob("*.py")) if "tests" not in p.parts)


def case_of(name: str, corpus: str):
    """(stages builder, training tokens) of a case: the tiny model on a built-in corpus, or the held-out one."""
    from tfrun.data import encode, load_corpus, split_tokens
    from tfrun.models import MODELS, ModelConfig, build_stage

    if name == "heldout":
        cfg = ModelConfig(**HELDOUT)
        return (lambda: {s: build_stage(cfg, s, 2, 0) for s in (0, 1)}), split_tokens(encode(networkx_sources()))[0]
    tokens = split_tokens(encode(load_corpus(None if corpus == "default" else corpus)))[0]
    return (lambda: {s: build_stage(MODELS["tiny"], s, 2, 0) for s in (0, 1)}), tokens


def via_profile(reference_error: float, max_sequences: int) -> None:
    """--via-profile: `tfplan profile`'s noise section on the held-out checkpoint against the exact value."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tfrun.data import Batches, encode, split_tokens
    from tfrun.freeze.noise_reference import ExactNoise
    from tfrun.models import build, loss_fn

    folder = Path(tempfile.mkdtemp(prefix="noise-heldout-"))
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=HELDOUT["vocab_size"], hidden_size=HELDOUT["dim"], intermediate_size=HELDOUT["ffn_dim"],
        num_hidden_layers=HELDOUT["n_layers"], num_attention_heads=HELDOUT["n_heads"],
        num_key_value_heads=HELDOUT["n_kv_heads"], max_position_embeddings=HELDOUT["max_seq_len"],
        tie_word_embeddings=False, rms_norm_eps=1e-5)).save_pretrained(folder / "ckpt")
    (folder / "networkx.txt").write_bytes(networkx_sources())
    model = f"hf:{folder / 'ckpt'}"
    subprocess.run([sys.executable, "-m", "tfplan", "profile", "--model", model, "--stages", "2", "--microbatches",
                    str(M), "--microbatch-size", str(MB_SIZE), "--seq-len", str(SEQ), "--data",
                    str(folder / "networkx.txt"), "-o", str(folder / "profile.json"), "--json"], check=True,
                   capture_output=True)
    noise = json.loads((folder / "profile.json").read_text())["noise"]
    stages = {s: build(model, s, 2, 0) for s in (0, 1)}
    tokens = split_tokens(encode((folder / "networkx.txt").read_bytes()))[0]
    ref, batches = ExactNoise(stages, loss_fn), Batches(tokens, global_batch=256, seq_len=SEQ, seed=12345)
    while True:
        ref.add(*batches.batch_at(ref.sequences // 256))
        scales = ref.scales()
        if ref.sequences >= max_sequences or (len(scales) == 2 and all(
                e is not None and e <= reference_error * v for v, e in scales.values())):
            break
    print(f"held-out checkpoint {model}, tfplan profile's noise section ({noise['note']}): "
          + ", ".join(f"stage {s} {noise['noise_scale_tokens'][s]:,.0f} tokens against exact {v:,.0f} +- {e or 0:,.0f} "
                      f"(x{noise['noise_scale_tokens'][s] / v:.2f})" for s, (v, e) in sorted(scales.items()))
          + f"; {ref.sequences} sequences", flush=True)


_OPTIMIZERS: dict = {}


def trained(stages, corpus_tokens, steps: int, start: int = 0, lr: float = 3e-4) -> None:
    """`steps` AdamW steps (lr 3e-4) of the chained stages on the corpus from batch `start`, as `tfrun train
    --freeze none` takes them (one optimizer per model, kept between calls)."""
    import torch

    from tfrun.data import Batches
    from tfrun.models import loss_fn

    params = [p for m in stages.values() for p in m.parameters()]
    opt = _OPTIMIZERS.setdefault(id(stages), torch.optim.AdamW(params, lr=lr))
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
    parser.add_argument("--reference-error", type=float, default=0.05,
                        help="add sequences to the reference until its relative standard error is below this")
    parser.add_argument("--max-sequences", type=int, default=2048, help="at most this many in the reference")
    parser.add_argument("--batch-seeds", default="777,778,779",
                        help="the pipeline's batch streams (tfrun.data.Batches seeds), one estimate each")
    parser.add_argument("--steps", type=int, default=30, help="measured steps of the pipeline's estimate")
    parser.add_argument("--train-steps", type=int, default=150, help="training before the second measurement")
    parser.add_argument("--corpora", default="default,stdlib")
    parser.add_argument("--case", default="tiny", choices=("tiny", "heldout"),
                        help="tiny: the tiny model on --corpora; heldout: the held-out model and corpus (docstring)")
    parser.add_argument("--estimators", default="ema,median,winsor")
    parser.add_argument("--measures", default="microbatch,sequence",
                        help="--noise-measure values, each against the same exact reference")
    parser.add_argument("--via-profile", action="store_true",
                        help="the held-out case through `tfplan profile` (docstring)")
    parser.add_argument("--trajectory", default=None,
                        help="instead: the exact noise scale along `tfrun train --freeze none`'s own trajectory "
                             "at these steps (e.g. 4,8,12,24,29), to set beside benchmarks/noise_estimators.py's")
    args = parser.parse_args()
    import torch

    from tfrun.data import Batches, encode, load_corpus, split_tokens
    from tfrun.freeze.noise_reference import ExactNoise, exact, pipeline_estimate
    from tfrun.models import MODELS, build_stage, loss_fn

    torch.set_num_threads(1)
    if args.via_profile:
        via_profile(args.reference_error, args.max_sequences)
        return
    if args.trajectory:
        tokens = split_tokens(encode(load_corpus(None)))[0]
        stages = {s: build_stage(MODELS["tiny"], s, 2, 0) for s in (0, 1)}
        done = 0
        for step in sorted(int(k) for k in args.trajectory.split(",")):
            trained(stages, tokens, step - done, start=done)  # the weights the run measures at step `step`
            done = step
            x, y = Batches(tokens, global_batch=512, seq_len=SEQ, seed=12345).batch_at(0)
            reference = exact(stages, loss_fn, x, y)
            print(f"step {step}: exact noise scale " + ", ".join(f"stage {s} {v:,.0f}" for s, v in
                                                                  sorted(reference.items())) + " tokens", flush=True)
        return
    seeds = [int(v) for v in args.batch_seeds.split(",")]
    print(f"noise scale against its definition: {args.case} case (2 stages), the reference from sequences of {SEQ} "
          f"tokens "
          f"until its standard error is below {args.reference_error:.0%} (at most {args.max_sequences}); "
          f"{args.steps} steps of {M} x {MB_SIZE} x {SEQ} for the pipeline, batch seeds {args.batch_seeds}; load "
          f"{os.getloadavg()[0]:.2f} at {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    worst: dict = {}
    for corpus in (args.corpora.split(",") if args.case == "tiny" else ["networkx"]):
        build, tokens = case_of(args.case, corpus)
        stages = build()
        for when in ("initialisation", f"{args.train_steps} training steps"):
            if when != "initialisation":
                trained(stages, tokens, args.train_steps, lr=3e-4 if args.case == "tiny" else 1e-3)
            t0 = time.perf_counter()
            ref = ExactNoise(stages, loss_fn)
            ref_batches = Batches(tokens, global_batch=256, seq_len=SEQ, seed=12345)
            while True:
                ref.add(*ref_batches.batch_at(ref.sequences // 256))
                scales = ref.scales()
                if ref.sequences >= args.max_sequences or (
                        len(scales) == len(stages)
                        and all(e is not None and e <= args.reference_error * v for v, e in scales.values())):
                    break
            reference = {s: v for s, (v, _) in scales.items()}
            exact_text = ", ".join(f"stage {s} {v:,.0f} +- {e or 0:,.0f} (largest sequence {ref.peak_share(s):.1%} of "
                                   f"the sum of |g|^2)" for s, (v, e) in sorted(scales.items()))
            print(f"\n{corpus} corpus, {when}: exact noise scale {exact_text} tokens (jackknife standard error; "
                  f"{ref.sequences} sequences, {time.perf_counter() - t0:.0f} s)", flush=True)
            for seed in seeds:
                batches = Batches(tokens, global_batch=M * MB_SIZE, seq_len=SEQ, seed=seed)
                trails = pipeline_estimate(stages, loss_fn, batches, steps=args.steps, num_microbatches=M,
                                           estimators=tuple(args.estimators.split(",")),
                                           measures=tuple(args.measures.split(",")))
                cells = []
                for (measure, estimator), trail in trails.items():
                    ratios = []
                    for s in sorted(reference):
                        values = [row[s] for row in trail if row[s] is not None]
                        ratios.append(statistics.median(values) / reference[s])
                        key = (measure, estimator)
                        worst[key] = max(worst.get(key, 1.0), ratios[-1], 1 / ratios[-1])
                    cells.append(f"{measure} {estimator} " + " / ".join(f"x{r:.2f}" for r in ratios))
                print(f"  batch seed {seed}: " + "; ".join(cells), flush=True)
    print("\nlargest factor from the definition over every case, stage and batch seed: " + "; ".join(
        f"{m} {e} {v:.2f}" for (m, e), v in worst.items()), flush=True)


if __name__ == "__main__":
    main()
