"""Chat data for the tests, made here (nothing downloaded): a small conversation corpus, a byte-level BPE with chat
special tokens, and ChatML and Llama-3 style templates, with and without `{% generation %}` blocks (the marked
ones enclose exactly what tfrun.data.chat counts for the unmarked ones: Note [chat rendering])."""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML (Qwen's turn format) with generation blocks."""

LLAMA3 = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('roles must be system, user or assistant') }}"
    "{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}"
    "{{- message['content'] | trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
"""Llama 3's turn format (with its bos_token) with generation blocks, refusing a tool role as some templates do."""


def unmarked(template: str) -> str:
    """The template without its generation blocks, as most templates on the Hub are."""
    return template.replace("{% generation %}", "").replace("{% endgeneration %}", "")


def conversations(n: int = 24) -> list[list[dict]]:
    """n conversations of 1-3 exchanges, some with a system message, from the pydoc topics' sentences."""
    from pydoc_data.topics import topics

    sentences = [s.strip() for k in sorted(topics) for s in topics[k].split(". ") if 20 < len(s.strip()) < 160]
    out, k = [], 0
    for i in range(n):
        chat = [{"role": "system", "content": "You answer questions about Python."}] if i % 3 == 0 else []
        for _ in range(1 + i % 3):
            chat += [{"role": "user", "content": sentences[k] + "?"},
                     {"role": "assistant", "content": sentences[k + 1]}]
            k += 2
        out.append(chat)
    return out


def train_chat_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE whose special tokens are the templates' (tokenizer.json), trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([m["content"] for chat in conversations(60) for m in chat], trainer)
    tok.save(str(path))
    return path


def write_tokenizer_config(folder: Path, template: str) -> Path:
    """tokenizer_config.json beside tokenizer.json, as transformers saves it: the chat template and special tokens."""
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>",
                                "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    return path


def write_chat_jsonl(path: Path, chats: list[list[dict]]) -> Path:
    path.write_text("".join(json.dumps({"messages": c, "id": i}) + "\n" for i, c in enumerate(chats)))
    return path
