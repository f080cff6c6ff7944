"""Regenerate the shipped analytic profiles in profiles/ (the paper's settings and common cluster shapes).

    python benchmarks/make_profiles.py

Every file is exactly what `tfplan profile --analytic ...` writes for the arguments listed here; the
assumptions (micro-batch size, sequence length, mfu, link) are recorded in each file's "source".
"""

from __future__ import annotations

from pathlib import Path

from tfplan.cost import costmodel
from tfplan.cost.profile import split_profile
from tfplan.fileio import write_json_atomic

ROOT = Path(__file__).resolve().parent.parent / "profiles"

# name -> (model, gpu, pipeline stages x chunks per rank, micro-batch size, seq len, link, note)
SHIPPED = {
    # The paper's setting (METHOD.md section 7): 4 stages on 4 H200, 8 micro-batches. Micro-batch size and
    # sequence length are not stated there; 1 x 2048 tokens is torchtitan's default shape for LLaMA-3.
    "llama3.1-8b-h200-4stages": ("llama3.1-8b", "h200", 4, 1, 2048, "nvlink", "paper setting"),
    "llama3.2-1b-h200-4stages": ("llama3.2-1b", "h200", 4, 1, 2048, "nvlink", "paper setting"),
    # Interleaved 1F1B on the same 4 GPUs needs 8 model chunks.
    "llama3.1-8b-h200-8chunks": ("llama3.1-8b", "h200", 8, 1, 2048, "nvlink", "4 ranks x 2 chunks"),
    # Common cluster shapes.
    "llama3.1-8b-h100-8stages": ("llama3.1-8b", "h100", 8, 2, 4096, "nvlink", "one 8-GPU node"),
    "llama3.1-70b-h100-16stages-ib": ("llama3.1-70b", "h100", 16, 1, 4096, "ib", "two nodes over InfiniBand"),
    "llama3.2-3b-a100-4stages-pcie": ("llama3.2-3b", "a100", 4, 2, 2048, "pcie", "PCIe workstation"),
}
PER_LAYER = {"llama3.1-8b-h200-layers": ("llama3.1-8b", "h200", 1, 2048, "nvlink")}


def main() -> None:
    for name, (model, gpu, stages, mbs, seq, link, note) in SHIPPED.items():
        prof = split_profile(costmodel.analytic_profile(model, gpu, mbs, seq, link=link), stages)
        data = prof.to_dict()
        data["name"] = name
        data["source"]["note"] = note
        write_json_atomic(ROOT / f"{name}.json", data)
        print(f"wrote profiles/{name}.json")
    for name, (model, gpu, mbs, seq, link) in PER_LAYER.items():
        data = costmodel.analytic_profile(model, gpu, mbs, seq, link=link).to_dict()
        data["name"] = name
        write_json_atomic(ROOT / f"{name}.json", data)
        print(f"wrote profiles/{name}.json")


if __name__ == "__main__":
    main()
