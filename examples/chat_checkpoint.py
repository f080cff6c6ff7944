"""A small Hugging Face checkpoint as users bring them, made here from nothing (nothing is downloaded): a randomly
initialised model of a family (default Qwen2: q/k/v biases, tied embeddings), a byte-level BPE tokenizer with a
ChatML chat template in its tokenizer_config.json, and chat-format fine-tuning data (jsonl rows of messages)
made from CPython's pydoc topics. The README's fine-tuning tour trains it; on a cluster, point the same commands
at your own checkpoint folder instead.

    python examples/chat_checkpoint.py --out runs/ckpt                  # runs/ckpt/{config.json, ...}, chats.jsonl
    python examples/chat_checkpoint.py --out runs/ckpt --family qwen3 --untied

Needs the hf extra (safetensors, tokenizers) and torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen's turn format (ChatML), without generation blocks, as Qwen's own template has none."""
FAMILY_OPTIONS = {"llama": {}, "qwen2": {"qkv_bias": True}, "qwen3": {"qk_norm": True, "attn_head_dim": 64},
                  "mistral": {"sliding_window": 512}}


def topics() -> list[tuple[str, str]]:
    """(topic, its first sentences) from the pydoc topics that ship with CPython."""
    from pydoc_data.topics import topics as pydoc

    out = []
    for key in sorted(pydoc):
        text = " ".join(pydoc[key].split())
        answer = ". ".join(text.split(". ")[:3])[:600]
        if len(answer) > 80:
            out.append((key, answer))
    return out


def chats(pairs: list[tuple[str, str]]) -> list[dict]:
    """One conversation per topic: a system message every third, a question, the topic's text as the answer."""
    rows = []
    for i, (topic, answer) in enumerate(pairs):
        messages = [{"role": "system", "content": "You explain Python."}] if i % 3 == 0 else []
        messages += [{"role": "user", "content": f"What does the Python reference say about {topic}?"},
                     {"role": "assistant", "content": answer}]
        rows.append({"messages": messages})
    return rows


def tokenizer(folder: Path, texts: list[str], vocab_size: int) -> int:
    """A byte-level BPE with the chat special tokens (tokenizer.json) and its tokenizer_config.json (the chat
    template, eos); returns its vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHATML, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 512}, indent=2) + "\n")
    return tok.get_vocab_size(with_added_tokens=True)


def checkpoint(folder: Path, family: str, tied: bool, vocab: int, seed: int) -> None:
    """config.json of the family and model.safetensors: a random model of our own block with the family's
    options (tfrun.models.shape Note [families]), named as Hugging Face names it."""
    from safetensors.torch import save_file

    from tfrun.models import ModelConfig, build_stage, hf
    from tfrun.records.export import config_of

    cfg = ModelConfig(vocab_size=vocab, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=512,
                      rope_theta=1e6, norm_eps=1e-6, tie_embeddings=tied, family=family, **FAMILY_OPTIONS[family])
    model = build_stage(cfg, 0, 1, seed=seed)
    tensors = {hf.hf_name(n): p.detach().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(folder / hf.WEIGHTS), metadata={"format": "pt"})
    (folder / hf.CONFIG).write_text(json.dumps(config_of(cfg) | {"torch_dtype": "float32"}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the checkpoint folder to make (chats.jsonl goes in it too)")
    ap.add_argument("--family", default="qwen2", choices=sorted(FAMILY_OPTIONS))
    ap.add_argument("--untied", action="store_true", help="an LM head of its own (default: tied to the embedding)")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    folder = Path(args.out)
    if folder.exists() and any(folder.iterdir()):
        sys.exit(f"--out {folder}: exists and is not empty")
    folder.mkdir(parents=True, exist_ok=True)
    pairs = topics()
    rows = chats(pairs)
    vocab = tokenizer(folder, [text for _, text in pairs] + [m["content"] for r in rows for m in r["messages"]],
                      args.vocab)
    checkpoint(folder, args.family, not args.untied, vocab, args.seed)
    (folder / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{folder}: a random {'tied ' if not args.untied else ''}{args.family} checkpoint (vocabulary {vocab}), "
          f"its tokenizer and chat template, and {len(rows)} conversations in {folder / 'chats.jsonl'}")


if __name__ == "__main__":
    main()
