"""A small byte-level BPE tokenizer trained in the test on the default corpus (the tokenizers package), and that
corpus as jsonl documents: real tokenization with nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path


def corpus_documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def train_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """Train a byte-level BPE of `vocab_size` tokens (special tokens <unk>, <s>) and save it as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_documents(), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path))
    return path


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path
