"""Chat-format fine-tuning data: jsonl rows of `messages` (OpenAI's role/content), or `prompt`/`completion` pairs,
rendered with the checkpoint's chat template, with the loss on the assistant's (the completion's) tokens only.

Note [chat rendering]: a row's conversation is rendered as transformers' `apply_chat_template(messages,
tokenize=True, return_assistant_tokens_mask=True)` renders it: the template is compiled in a sandboxed jinja2
environment with transformers' settings (trim_blocks, lstrip_blocks, loop controls, `tojson` without HTML
escapes, `raise_exception`, `strftime_now`), given the tokenizer's special tokens by name (bos_token,
eos_token, ...), and the text is tokenized without added special tokens (the template writes them). Which
characters the loss counts:
  * a template with `{% generation %}` blocks: the characters they render (transformers' own rule);
  * a template without (Llama 3's, Qwen's, most on the Hub): each assistant message's characters are those the
    conversation up to and including it adds to the render of the conversation before it with the generation
    prompt (`add_generation_prompt=True`): the answer and whatever closes its turn (an end-of-turn token),
    which the model must learn to emit. A template whose render of a conversation does not begin with its
    render of the conversation before it (one that rewrites earlier turns, as Qwen3's does with reasoning) is
    refused for that row: no prefix rule is safe there.
A token counts when its characters overlap a counted span (transformers' rule). `prompt`/`completion` rows are
the conversation [user: prompt, assistant: completion] under a template, else the plain text prompt + completion
with the completion counted. Rows are checked one by one, and every problem names its line.

Documents are packed into the stream one after another (tfrun.data.batches cuts windows across them): a window's
tokens attend to the end of the document before theirs, as in pretraining's packing; boundaries are not masked.
The loss is the mean over the counted tokens of the step (tfrun.models.llama.masked_loss).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfrun.data.batches import DataError

ROLES = ("system", "user", "assistant", "tool")
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


@dataclass(frozen=True, kw_only=True, slots=True)
class Template:
    """A chat template and the special tokens it is rendered with."""

    source: str
    """Where it came from (a file), for messages."""
    text: str
    """The jinja2 source."""
    special: dict[str, str]
    """bos_token, eos_token, ... by name (the tokenizer config's)."""

    @property
    def sha256(self) -> str:
        """Its identity for the token cache: the source and the special tokens."""
        return hashlib.sha256(json.dumps([self.text, sorted(self.special.items())]).encode()).hexdigest()


def load_template(path: str | Path) -> Template:
    """A chat template from a tokenizer_config.json (its `chat_template`: a string, or a list whose `default`
    entry is taken) or a .jinja file (the special tokens then from a tokenizer_config.json beside it, if any).

    Raises:
        DataError: a missing or unreadable file, or a config without a chat template.
    """
    file = Path(path)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"--chat-template {path}: cannot read it ({exc})") from None
    config: dict[str, Any] = {}
    if file.suffix == ".json":
        try:
            config = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"--chat-template {path}: not JSON ({exc.msg})") from None
        text = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(text, list):
            text = next((t.get("template") for t in text if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(text, str):
            raise DataError(f"--chat-template {path}: no chat_template in it")
    elif (file.parent / "tokenizer_config.json").is_file():
        try:
            config = json.loads((file.parent / "tokenizer_config.json").read_text())
        except (OSError, ValueError):
            config = {}
    special = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special[name] = value
    return Template(source=str(path), text=text, special=special)


def find_template(tokenizer_path: str | None) -> str | None:
    """The chat template beside a tokenizer.json (chat_template.jinja, else tokenizer_config.json with one)."""
    if tokenizer_path is None:
        return None
    folder = Path(tokenizer_path).parent
    if (folder / "chat_template.jinja").is_file():
        return str(folder / "chat_template.jinja")
    config = folder / "tokenizer_config.json"
    try:
        if config.is_file() and "chat_template" in json.loads(config.read_text()):
            return str(config)
    except (OSError, ValueError):
        return None
    return None


def _compile(text: str):
    """The template compiled as transformers compiles it (Note [chat rendering]); its generation spans recorded in
    `spans` (a list the caller clears) while rendering."""
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise DataError("chat data needs the jinja2 package: pip install 'timelyfreeze[hf]'") from None

    spans: list[tuple[int, int]] = []
    parts: list[str] = []

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            text = caller()
            start = len("".join(parts))
            spans.append((start, start + len(text)))
            return text

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        import datetime

        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env.from_string(text), spans, parts


class Renderer:
    """Renders conversations with one template (Note [chat rendering])."""

    def __init__(self, template: Template) -> None:
        self.template = template
        try:
            self.compiled, self._spans, self._parts = _compile(template.text)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
            raise DataError(f"--chat-template {template.source}: not a jinja2 template ({exc})") from None
        self.marked = bool(GENERATION.search(template.text))

    def _render(self, messages: list[dict], generation_prompt: bool) -> tuple[str, list[tuple[int, int]]]:
        """(text, generation spans), rendered block by block as transformers does so that spans are offsets."""
        self._spans.clear()
        self._parts.clear()
        context = self.compiled.new_context({"messages": messages, "add_generation_prompt": generation_prompt,
                                             **self.template.special})
        for block in self.compiled.root_render_func(context):
            self._parts.append(block)
        return "".join(self._parts), list(self._spans)

    def render(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the character spans the loss counts."""
        text, spans = self._render(messages, False)
        if self.marked:
            return text, spans
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before, _ = self._render(messages[:i], True)
            upto, _ = self._render(messages[:i + 1], False)
            if not text.startswith(upto) or not upto.startswith(before):
                raise ValueError("the template's render of the conversation does not begin with its render of the "
                                 "turns before an answer (it rewrites earlier turns): add {% generation %} blocks "
                                 "to the template to mark the answers")
            if len(upto) > len(before):
                spans.append((len(before), len(upto)))
        return text, spans


def _row_messages(obj: Any, where: str, has_template: bool) -> tuple[list[dict] | None, tuple[str, str] | None]:
    """(messages, None) for a chat row, (None, (prompt, completion)) for a plain pair without a template."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: must be a JSON object with \"messages\", or \"prompt\" and \"completion\"")
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: \"messages\" must be a non-empty list")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise DataError(f"{where}: messages[{i}] must be an object with string \"role\" and \"content\"")
            if m["role"] not in ROLES:
                raise DataError(f"{where}: messages[{i}].role {m['role']!r} is not one of {', '.join(ROLES)}")
        if not any(m["role"] == "assistant" for m in messages):
            raise DataError(f"{where}: no assistant message (nothing to train on)")
        if not has_template:
            raise DataError(f"{where}: \"messages\" rows need a chat template (--chat-template, or a "
                            f"tokenizer_config.json with one beside --tokenizer)")
        return messages, None
    if "prompt" in obj or "completion" in obj:
        prompt, completion = obj.get("prompt"), obj.get("completion")
        if not isinstance(prompt, str) or not isinstance(completion, str):
            raise DataError(f"{where}: \"prompt\" and \"completion\" must both be strings")
        if not completion:
            raise DataError(f"{where}: an empty \"completion\" (nothing to train on)")
        if has_template:
            return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}], None
        return None, (prompt, completion)
    raise DataError(f"{where}: must have \"messages\", or \"prompt\" and \"completion\"")


def is_chat_row(obj: Any) -> bool:
    """Whether a jsonl row is a chat row (`messages`, or `prompt`/`completion`) rather than a `text` document."""
    return isinstance(obj, dict) and ("messages" in obj or "prompt" in obj or "completion" in obj)


def encode_rows(rows: list[tuple[str, Any]], tok, renderer: Renderer | None, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The rows' ids and loss mask (1: the token counts), concatenated. `rows`: (where, parsed JSON) per row.

    Raises:
        DataError: naming the row: its shape, a role, no assistant turn, a template that fails on it.
    """
    ids: list[np.ndarray] = [np.zeros(0, dtype=dtype)]
    masks: list[np.ndarray] = [np.zeros(0, dtype=np.uint8)]
    for where, obj in rows:
        messages, pair = _row_messages(obj, where, renderer is not None)
        if messages is not None:
            try:
                text, spans = renderer.render(messages)
            except DataError:
                raise
            except Exception as exc:  # noqa: BLE001 - jinja2 errors, raise_exception's, ValueError above
                raise DataError(f"{where}: the chat template fails on it ({str(exc).splitlines()[0][:200]})") from None
        else:
            text, spans = pair[0] + pair[1], [(len(pair[0]), len(pair[0]) + len(pair[1]))]
        enc = tok.impl.encode(text, add_special_tokens=False)
        ids.append(np.asarray(enc.ids, dtype=dtype))
        masks.append(token_mask(enc.offsets, spans))
        if not masks[-1].any():
            raise DataError(f"{where}: no token of its answers survives tokenization (nothing to train on)")
    return np.concatenate(ids), np.concatenate(masks)


def token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    """1 for each token whose characters overlap a span (both in order: one pass), as transformers masks.

    >>> token_mask([(0, 2), (2, 5), (5, 6), (6, 9)], [(3, 6)]).tolist()
    [0, 1, 1, 0]
    """
    mask = np.zeros(len(offsets), dtype=np.uint8)
    k = 0
    for i, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[i] = 1
    return mask
