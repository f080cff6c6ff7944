"""Chat-format data (tfrun.data.chat Note [chat rendering]): ids and loss masks equal transformers'
`apply_chat_template(..., return_assistant_tokens_mask=True)` on a small conversation corpus, for templates with
generation blocks and (the prefix rule) without; the per-token loss equals transformers' with those labels; the
cache keys on the template and the masking; bad rows refused by row. transformers is the reference (dev extra)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.chat_fixture import CHATML, LLAMA3, conversations, train_chat_tokenizer, unmarked, write_chat_jsonl
from tests.conftest import torch_or_skip

torch = torch_or_skip()
pytest.importorskip("tokenizers", reason="the hf extra")
pytest.importorskip("jinja2", reason="the hf extra")
from tfrun.data import DataError, chat, tokenized  # noqa: E402


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory) -> Path:
    return train_chat_tokenizer(tmp_path_factory.mktemp("chat") / "tokenizer.json")


def _reference(tok_path: Path, template: str, chats: list[list[dict]]) -> list[tuple[list[int], list[int]]]:
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from transformers import PreTrainedTokenizerFast

    ref = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    out = []
    for c in chats:
        enc = ref.apply_chat_template(c, chat_template=template, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        out.append((list(enc["input_ids"]), list(enc["assistant_masks"])))
    return out


def _ours(tok_path: Path, template: str, chats: list[list[dict]]) -> list[tuple[list[int], list[int]]]:
    tok = tokenized.load_tokenizer(str(tok_path))
    renderer = chat.Renderer(chat.Template(source="t", text=template, special={"bos_token": "<s>",
                                                                               "eos_token": "</s>"}))
    out = []
    for i, c in enumerate(chats):
        ids, mask = chat.encode_rows([(f"row {i}", {"messages": c})], tok, renderer, np.dtype("<u2"))
        out.append((ids.tolist(), mask.tolist()))
    return out


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_ids_and_masks_equal_transformers(tok_path, template):
    chats = conversations()
    expected = _reference(tok_path, template, chats)
    assert _ours(tok_path, template, chats) == expected
    assert all(0 < sum(m) < len(m) for _, m in expected)  # something counts, not everything


@pytest.mark.parametrize("template", [CHATML, LLAMA3], ids=["chatml", "llama3"])
def test_a_template_without_generation_blocks_masks_the_same_answers(tok_path, template):
    """The prefix rule on the unmarked template counts what the marked one's blocks enclose (an equivalent
    reference: transformers cannot mask without blocks)."""
    chats = conversations()
    assert _ours(tok_path, unmarked(template), chats) == _reference(tok_path, template, chats)


def test_the_per_token_loss_equals_transformers_with_those_labels(tok_path, tmp_path):
    pytest.importorskip("transformers", reason="transformers is the reference (dev extra)")
    from tests.hf_models import make_llama
    from tfrun import models
    from tfrun.data import IGNORE, MaskedTokens
    from tfrun.data.batches import _windows
    from tfrun.models import masked_loss

    reference = make_llama(tmp_path / "m", vocab=400, layers=2, scale=5.0, max_pos=512)
    ids, mask = _ours(tok_path, CHATML, conversations(4))[2]
    stream = MaskedTokens(np.asarray(ids), np.asarray(mask, dtype=np.uint8))
    x, y = _windows(stream, torch.tensor([0]), len(ids) - 1)
    assert torch.equal(y[0] != IGNORE, torch.tensor(mask[1:], dtype=torch.bool))
    labels = torch.tensor([ids]).masked_fill(torch.tensor([mask]) == 0, -100)
    with torch.no_grad():
        expected = reference(torch.tensor([ids]), labels=labels).loss
        ours = masked_loss(models.build(f"hf:{tmp_path / 'm'}", 0, 1, seed=0)(x), y, float((y != IGNORE).sum()))
    assert math.isclose(ours.item(), expected.item(), rel_tol=0, abs_tol=1e-5)


def test_the_cache_keys_on_the_template_and_the_masking(tok_path, tmp_path):
    data = write_chat_jsonl(tmp_path / "chats.jsonl", conversations(8))
    tok = tokenized.load_tokenizer(str(tok_path))
    marked, plain = (chat.Template(source=s, text=t, special={}) for s, t in (("a", CHATML), ("b", LLAMA3)))
    first = tokenized.tokenize(str(data), tok, tmp_path / "cache", marked)
    first.save()
    assert tokenized.tokenize(str(data), tok, tmp_path / "cache", marked).hit
    again = tokenized.tokenize(str(data), tok, tmp_path / "cache", marked)
    assert np.array_equal(again.tokens.mask, first.tokens.mask) and again.meta["masked"]
    for other in (tokenized.tokenize(str(data), tok, tmp_path / "cache", plain),
                  tokenized.tokenize(str(data), tok, tmp_path / "cache", marked, chat_loss="all")):
        assert not other.hit and other.file != first.file
    everything = tokenized.tokenize(str(data), tok, tmp_path / "cache", marked, chat_loss="all")
    assert everything.tokens.mask.all() and np.array_equal(everything.tokens.ids, first.tokens.ids)


def test_prompt_completion_rows_with_and_without_a_template(tok_path, tmp_path):
    tok = tokenized.load_tokenizer(str(tok_path))
    rows = [("r", {"prompt": "What is a list?", "completion": " A mutable sequence."})]
    ids, mask = chat.encode_rows(rows, tok, None, np.dtype("<u2"))
    counted = tok.impl.decode([i for i, m in zip(ids.tolist(), mask.tolist()) if m])
    assert counted == " A mutable sequence." and not mask[0]
    renderer = chat.Renderer(chat.Template(source="t", text=CHATML, special={}))
    templated, tmask = chat.encode_rows(rows, tok, renderer, np.dtype("<u2"))
    both = _ours(tok_path, CHATML, [[{"role": "user", "content": "What is a list?"},
                                     {"role": "assistant", "content": " A mutable sequence."}]])
    assert (templated.tolist(), tmask.tolist()) == both[0]


@pytest.mark.parametrize("row, message", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "line 2: no assistant message"),
    ({"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]},
     "line 2: messages\\[0\\].role 'robot' is not one of system, user, assistant, tool"),
    ({"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "x"}]},
     "line 2: the chat template fails on it \\(roles must be system, user or assistant\\)"),
    ({"messages": "hello"}, "line 2: \"messages\" must be a non-empty list"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]},
     "line 2: messages\\[0\\] must be an object with string \"role\" and \"content\""),
    ({"prompt": "q", "completion": 3}, "line 2: \"prompt\" and \"completion\" must both be strings"),
    ({"prompt": "q", "completion": ""}, "line 2: an empty \"completion\""),
    ({"text": "a document"}, "line 2: must have \"messages\", or \"prompt\" and \"completion\""),
])
def test_bad_rows_are_refused_by_row(tok_path, tmp_path, row, message):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    tok = tokenized.load_tokenizer(str(tok_path))
    with pytest.raises(DataError, match=message) as info:
        tokenized.tokenize(str(data), tok, tmp_path / "cache", chat.Template(source="t", text=LLAMA3, special={}))
    assert str(data) in str(info.value) and "\n" not in str(info.value)


def test_messages_need_a_template_and_a_broken_one_is_one_line(tok_path, tmp_path):
    data = write_chat_jsonl(tmp_path / "chats.jsonl", conversations(2))
    tok = tokenized.load_tokenizer(str(tok_path))
    with pytest.raises(DataError, match="line 1: \"messages\" rows need a chat template"):
        tokenized.tokenize(str(data), tok, tmp_path / "cache", None)
    with pytest.raises(DataError, match="--chat-template t: not a jinja2 template"):
        chat.Renderer(chat.Template(source="t", text="{% for m in messages %}", special={}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(DataError, match="no chat_template in it"):
        chat.load_template(tmp_path / "tokenizer_config.json")


def test_a_template_that_rewrites_earlier_turns_is_refused_for_the_prefix_rule(tok_path):
    # earlier answers rendered without their last character: the render of a conversation does not begin with
    # the render of the turns before its last answer
    rewriting = ("{%- for m in messages %}{{- m['role'] + ': ' }}{%- if m['role'] == 'assistant' and not loop.last %}"
                 "{{- m['content'][:-1] }}{%- else %}{{- m['content'] }}{%- endif %}{{- '\\n' }}{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}")
    tok = tokenized.load_tokenizer(str(tok_path))
    renderer = chat.Renderer(chat.Template(source="t", text=rewriting, special={}))
    rows = [("row 7", {"messages": conversations(3)[2]})]
    with pytest.raises(DataError, match="row 7: the chat template fails on it .*rewrites earlier turns"):
        chat.encode_rows(rows, tok, renderer, np.dtype("<u2"))
