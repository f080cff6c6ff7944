"""Peak memory of loading one pipeline stage from a Hugging Face checkpoint (tfrun.models.hf Note [stage-local
loading]): writes a random float32 LLaMA checkpoint in shards, then loads each stage of a 2-stage split in a
fresh process and prints its peak resident memory (VmHWM) against the whole checkpoint's size.

    python benchmarks/hf_load_memory.py --dir /tmp/hf-mem          # about 4.4 GB of disk; one stage at a time

The default shape is LLaMA-3.2-1B's blocks with a 32,000-token vocabulary and untied embeddings (1.1 B
parameters): the largest that two ranks' worth of loading fits in this machine's memory beside other work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048,
          "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
          "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32"}


def write_checkpoint(folder: Path, layers_per_shard: int = 2) -> int:
    """A random checkpoint of CONFIG in shards of `layers_per_shard` blocks; returns its bytes."""
    import torch
    from safetensors.torch import save_file

    from tfrun.models import build_stage, hf

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    cfg = hf.read_config(folder)
    meta = build_stage(cfg, 0, 1, seed=0, device="meta")
    groups: dict[str, dict[str, tuple]] = {}
    for name, p in meta.named_parameters():
        key = "top" if not name.startswith("layers.") else f"layers{int(name.split('.')[1]) // layers_per_shard}"
        groups.setdefault(key, {})[hf.hf_name(name)] = tuple(p.shape)
    weight_map, total = {}, 0
    gen = torch.Generator().manual_seed(0)
    for i, (_, shapes) in enumerate(sorted(groups.items())):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: torch.randn(shape, generator=gen) * 0.02 for n, shape in shapes.items()}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        total += sum(t.numel() * 4 for t in tensors.values())
        weight_map |= {n: file for n in tensors}
        del tensors
    (folder / hf.INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return total


PROBE = """
import sys, torch
torch.set_num_threads(1)
from tfrun import models
stage = models.build("hf:" + sys.argv[1], int(sys.argv[2]), 2, seed=0)
params = sum(p.numel() * p.element_size() for p in stage.parameters())
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024
print(params, hwm)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/tfrun-hf-mem")
    args = parser.parse_args()
    folder = Path(args.dir)
    if not (folder / "model.safetensors.index.json").exists():
        print(f"writing a random checkpoint to {folder} ...", flush=True)
        write_checkpoint(folder)
    total = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    baseline = subprocess.run([sys.executable, "-c", "import torch, tfrun.models; print(next(int(l.split()[1]) for l "
                               "in open('/proc/self/status') if l.startswith('VmHWM')) * 1024)"],
                              capture_output=True, text=True, check=True)
    base = int(baseline.stdout.split()[-1])
    print(f"checkpoint: {total / 2**30:.2f} GiB in {len(list(folder.glob('*.safetensors')))} shards; "
          f"python + torch + tfrun alone: peak {base / 2**30:.2f} GiB")
    for stage in (0, 1):
        out = subprocess.run([sys.executable, "-c", PROBE, str(folder), str(stage)], capture_output=True, text=True,
                             check=True)
        params, hwm = (int(x) for x in out.stdout.split()[-2:])
        print(f"stage {stage} of 2: parameters {params / 2**30:.2f} GiB ({params / total:.0%} of the checkpoint); "
              f"peak RSS {hwm / 2**30:.2f} GiB = {hwm / total:.0%} of the checkpoint")


if __name__ == "__main__":
    main()
