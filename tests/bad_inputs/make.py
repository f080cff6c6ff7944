"""Write the hostile-input corpus's input files (the expectations live in manifest.json, written by hand):

    PYTHONPATH=. python tests/bad_inputs/make.py

Everything derives from one valid plan (`valid-plan.json`: 1F1B, 2 ranks, 4 micro-batches, a hand profile) and
one valid run config, each broken in one way. Run it again after a format change and review the diff.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _write(rel: str, content: str | bytes) -> None:
    path = HERE / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)


def _json(rel: str, obj) -> None:
    _write(rel, json.dumps(obj, indent=1) + "\n")


def _valid_plan() -> dict:
    from tfplan.cost import profile
    from tfplan.plan import plan
    from tfplan.schedule import schedules
    from tfplan.solve import solver
    from tfplan.step import dag

    prof = profile.uniform(2, name="unit")
    d = dag.build(schedules.generate("1f1b", 2, 4), prof)
    obj = plan.to_dict(plan.make_plan(d, solver.solve(d, 0.9), [0.9, 0.9], prof))
    obj["created"] = "2026-12-01T00:00:00Z"
    obj["solver"] = None  # no timings: the file stays byte-identical when regenerated
    return obj


def plans(valid: dict) -> None:
    _json("valid-plan.json", valid)

    def variant(name: str, change) -> None:
        obj = copy.deepcopy(valid)
        change(obj)
        _write(f"plans/{name}.json", json.dumps(obj, indent=1) + "\n")  # NaN stays a JSON NaN literal

    _write("plans/empty.json", "")
    _write("plans/binary.json", bytes(range(256)) * 4)
    _write("plans/not-json.json", '{"schema_version": 3, "schedule": ')
    _write("plans/array.json", "[]\n")
    _write("plans/deep.json", "[" * 5_000 + "]" * 5_000)
    variant("schema-9", lambda o: o.update(schema_version=9))
    variant("no-schedule", lambda o: o.pop("schedule"))
    variant("bad-action", lambda o: o["schedule"]["order"][0].__setitem__(0, "0X0"))
    variant("ratio-above-one", lambda o: o["freeze_ratio"][1].__setitem__(2, 1.5))
    variant("ratio-nan", lambda o: o["freeze_ratio"][1].__setitem__(2, float("nan")))
    variant("missing-action", lambda o: o["freeze_ratio"][1].pop())
    variant("cap-exceeded", lambda o: o.update(max_freeze_ratio=[0.1, 0.1]))
    variant("microbatches-string", lambda o: o["schedule"].update(num_microbatches="4"))
    variant("ranks-mismatch", lambda o: o["schedule"].update(num_ranks=3))
    nested = {"kind": "measured", "model": {"name": "tiny"}}
    variant("source-nested", lambda o: o["profile"].update(source=nested))
    measured = {"kind": "measured", "tool": "tfrun", "model": "small", "microbatch_size": 4, "seq_len": 128,
                "device": "cpu", "threads_per_rank": 1, "torch": "2.13.0+cpu"}
    variant("other-model", lambda o: o["profile"].update(source=measured))
    variant("other-shape", lambda o: o["profile"].update(source=measured | {"model": "tiny"}))
    analytic = {"kind": "analytic", "model": "llama3.1-8b", "gpu": "h200", "microbatch_size": 1, "seq_len": 2048}
    variant("analytic-h200", lambda o: o["profile"].update(source=analytic))


def profiles() -> None:
    stage = {"forward_ms": 1.0, "backward_ms": 2.0, "backward_frozen_ms": 1.0, "backward_input_ms": 1.0,
             "backward_weight_ms": 1.0, "backward_weight_frozen_ms": 0.0}
    valid = {"schema_version": 2, "name": "p", "source": {"kind": "hand"}, "p2p_ms": 0.0,
             "stages": [dict(stage), dict(stage)]}

    def variant(name: str, change) -> None:
        obj = copy.deepcopy(valid)
        change(obj)
        _json(f"profiles/{name}.json", obj)

    _write("profiles/empty.json", "")
    _write("profiles/binary.json", b"\x89PNG\r\n\x1a\n" + bytes(200))
    variant("negative", lambda o: o["stages"][1].update(forward_ms=-1.0))
    variant("both-stages-layers", lambda o: o.update(layers=o["stages"]))
    variant("unknown-field", lambda o: o.update(speed="fast"))
    variant("frozen-above-full", lambda o: o["stages"][0].update(backward_frozen_ms=5.0))
    variant("string-number", lambda o: o.update(p2p_ms="0.1"))
    variant("schema-0", lambda o: o.update(schema_version=0))
    variant("empty-stages", lambda o: o.update(stages=[]))
    variant("bool-number", lambda o: o["stages"][0].update(forward_ms=True))
    # the noise section (schema 3, issue 21): negative, NaN, missing, or measured at another batch shape
    noise = {"noise_scale_tokens": [1800.0, 2400.0], "grad_sq_share": [0.4, 0.6], "microbatch_tokens": 512,
             "source": "measured"}
    shaped = {"schema_version": 3, "source": {"kind": "measured", "microbatch_size": 4, "seq_len": 128}}
    variant("no-noise", lambda o: o.update(shaped))
    variant("noise-negative", lambda o: o.update(shaped, noise=noise | {"noise_scale_tokens": [1800.0, -5.0]}))
    variant("noise-nan", lambda o: o.update(shaped, noise=noise | {"noise_scale_tokens": [float("nan"), 1.0]}))
    variant("noise-missing-share", lambda o: o.update(shaped, noise={k: v for k, v in noise.items()
                                                                     if k != "grad_sq_share"}))
    variant("noise-other-shape", lambda o: o.update(shaped, noise=noise | {"microbatch_tokens": 64}))


def configs(valid: dict) -> None:
    base = {"order": valid["schedule"]["order"], "num_stages": 2, "num_microbatches": 4, "stage_to_rank": [0, 1]}

    def variant(name: str, change) -> None:
        obj = copy.deepcopy(base)
        change(obj)
        _json(f"configs/{name}.json", obj)

    _write("configs/not-json.json", "order: [[0F0]]\n")
    _write("configs/array.json", "[1, 2]\n")
    variant("unknown-field", lambda o: o.update(learning_rate=0.1))
    variant("missing-order", lambda o: o.pop("order"))
    variant("steps-string", lambda o: o.update(steps="ten"))
    variant("seed-bool", lambda o: o.update(seed=True))
    variant("steps-zero", lambda o: o.update(steps=0))
    variant("order-not-list", lambda o: o.update(order="0F0 0B0"))
    # tfrun train --config files (TOML, tfrun.cli.config_file)
    _write("configs/not-toml.toml", "lr = \n")
    _write("configs/unknown-key.toml", 'lr-shedule = "cosine"\n')
    _write("configs/wrong-type.toml", 'lr = "fast"\n')
    _write("configs/steps-float.toml", "steps = 1.5\n")
    variant("lr-nan", lambda o: o.update(lr=float("nan")))


def data() -> None:
    _write("data/empty.txt", b"")
    _write("data/binary.dat", (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))) * 20)
    _write("data/tiny.txt", b"too short to train on\n" * 4)
    line = b"The quick brown fox jumps over the lazy dog.\n"
    _write("data/short-for-seq.txt", line * (5000 // len(line) + 1))


def tokens() -> None:
    """Pre-tokenized .bin files (uint16 ids for the tiny model's 256-token vocabulary), a jsonl file, and a
    tokenizer whose vocabulary (320) exceeds it (a byte-level BPE trained on a few lines: tokenizers)."""
    import numpy as np
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    ids = (np.arange(6000) % 200).astype("<u2")
    ids[4321] = 300
    _write("data/id-beyond-vocab.bin", ids.tobytes())
    _write("data/odd-size.bin", (np.arange(6000) % 200).astype("<u2").tobytes() + b"\0")
    line = '{"text": "The quick brown fox jumps over the lazy dog."}\n'
    _write("data/no-text.jsonl", line * 200 + '{"title": "a line without its text"}\n')
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<unk>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([json.loads(line)["text"]] * 50 + [f"word{i} " * 3 for i in range(200)], trainer)
    _write("tokenizers/vocab-320.json", tok.to_str())


CHAT_TEMPLATE = ("{%- for m in messages %}{%- if m['role'] == 'system' %}{{- raise_exception('this template has "
                 "no system role') }}{%- endif %}{{- '<t> ' + m['role'] + ' ' + m['content'] + ' </t> ' }}"
                 "{%- endfor %}{%- if add_generation_prompt %}{{- '<t> assistant ' }}{%- endif %}")


def chat_data() -> None:
    """Chat rows (tfrun.data.chat), each file broken in one row after 200 good ones, a word-level tokenizer small
    enough for the tiny model's 256 ids, and a template that refuses a system message."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<t>", "</t>", "user", "assistant", "system", "tool", "robot", "what", "is", "a", "list",
             "mutable", "sequence", "hello"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    _write("tokenizers/words.json", tok.to_str())
    _write("templates/no-system.jinja", CHAT_TEMPLATE)
    good = json.dumps({"messages": [{"role": "user", "content": "what is a list"},
                                    {"role": "assistant", "content": "a mutable sequence"}]}) + "\n"
    answer = {"role": "assistant", "content": "a"}
    bad = {"no-assistant": {"messages": [{"role": "user", "content": "hello"}]},
           "unknown-role": {"messages": [{"role": "robot", "content": "hello"}, answer]},
           "system-refused": {"messages": [{"role": "system", "content": "hello"}, answer]},
           "bad-shape": {"messages": "hello"}}
    for name, row in bad.items():
        _write(f"data/chat-{name}.jsonl", good * 200 + json.dumps(row) + "\n")


def hf_checkpoints() -> None:
    """Hugging Face checkpoint folders, each broken in one way: a 2-layer model of the tiny vocabulary, written
    from our own stage with Hugging Face's names (tfrun.models.hf), sharded one tensor group per file."""
    import torch
    from safetensors.torch import save_file

    from tfrun.models import ModelConfig, build_stage, hf

    shutil.rmtree(HERE / "hf", ignore_errors=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "float32"}
    model = build_stage(ModelConfig(vocab_size=256, dim=8, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=16,
                                    max_seq_len=256), 0, 1, seed=0)
    tensors = {hf.hf_name(n): p.detach().clone() for n, p in model.named_parameters()}

    def folder(name: str, change=None, config=None) -> None:
        shards = {"model-00001-of-00002.safetensors": {k: v for k, v in tensors.items() if "layers.1." not in k},
                  "model-00002-of-00002.safetensors": {k: v for k, v in tensors.items() if "layers.1." in k}}
        if change is not None:
            change(shards)
        _json(f"hf/{name}/config.json", config or cfg)
        weight_map = {k: f for f, shard in shards.items() for k in shard}
        _json(f"hf/{name}/model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
        for file, shard in shards.items():
            save_file(shard, str(HERE / "hf" / name / file), metadata={"format": "pt"})

    second = "model-00002-of-00002.safetensors"
    key = "model.layers.1.mlp.up_proj.weight"
    folder("other-architecture", config=cfg | {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]})
    embed = "model.embed_tokens.weight"  # a tied config whose file holds a head of its own: not tied in fact
    folder("tied-not-tied", lambda shards: shards["model-00001-of-00002.safetensors"].update(
        {"lm_head.weight": tensors[embed] + 0.01}), config=cfg | {"tie_word_embeddings": True})
    folder("undeclared-biases", lambda shards: shards["model-00001-of-00002.safetensors"].update(
        {"model.layers.0.self_attn.q_proj.bias": torch.zeros(8)}))
    folder("odd-head-dim", config=cfg | {"head_dim": 3})
    folder("wrong-shape", lambda shards: shards[second].update({key: torch.zeros(16, 4)}))
    folder("wrong-dtype", lambda shards: shards[second].update({key: torch.zeros(16, 8, dtype=torch.int32)}))
    folder("missing-shard")
    (HERE / "hf" / "missing-shard" / second).unlink()
    folder("truncated-shard")
    path = HERE / "hf" / "truncated-shard" / second
    path.write_bytes(path.read_bytes()[:-100])


def runs() -> None:
    shutil.rmtree(HERE / "runs", ignore_errors=True)
    _write("runs/no-checkpoints/README", "A run folder without a checkpoints folder.\n")
    _write("runs/garbage-latest/checkpoints/latest.json", "garbage\n")

    def checkpoint(run: str, world: int, change=None) -> None:
        files = {}
        for r in range(world):
            blob = f"not a real checkpoint of rank {r}\n".encode()
            _write(f"runs/{run}/checkpoints/step0000002/rank{r}.pt", blob)
            files[f"rank{r}.pt"] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        index = {"schema_version": 1, "step": 2, "world_size": world, "time": 0.0, "files": files, "run": {}}
        if change is not None:
            change(index)
        _json(f"runs/{run}/checkpoints/step0000002/index.json", index)
        _json(f"runs/{run}/checkpoints/latest.json", {"step": 2, "world_size": world})

    checkpoint("truncated", 2, lambda i: i["files"]["rank1.pt"].update(bytes=1000))
    checkpoint("bad-index", 2, lambda i: i.update(schema_version=7))
    checkpoint("four-ranks", 4)
    _json("runs/bad-summary/run_config.json", {"order": [["0F0"]], "plan_path": None, "freeze": "plan"})
    _json("runs/bad-summary/timings.json", {"schema_version": 2, "actions": {}, "makespan_ms": {"3": 1.0}})
    _json("runs/bad-summary/summary.json", {"step_time_ms": "fast"})
    _json("runs/bad-config/run_config.json", {"order": 5, "freeze": "plan"})
    _json("runs/bad-config/timings.json", {"schema_version": 2, "actions": {}, "makespan_ms": {"3": 1.0}})
    _json("runs/bad-config/summary.json", {"step_time_ms": 10.0})


def main() -> None:
    valid = _valid_plan()
    plans(valid)
    profiles()
    configs(valid)
    data()
    tokens()
    chat_data()
    hf_checkpoints()
    runs()


if __name__ == "__main__":
    main()
