"""Text through a real tokenizer: `--data` a text file, a `.jsonl` file (one JSON object a line, its `text`
field a document) or a folder of them, tokenized with `--tokenizer tokenizer.json` (the `tokenizers` package)
once, and cached.

Documents: a text file is one document, a jsonl line is one; a folder's `.txt`, `.md` and `.jsonl` files are
read in sorted path order. Each document is encoded with the tokenizer's special tokens (LLaMA's tokenizer
starts each with <|begin_of_text|>), and the documents' ids are concatenated into one stream.

Note [token cache]: tokenizing is the slow part of reading text, so the stream is written once, as a token
file (tfrun.data.tokenfile's layout) named by a hash of the data's bytes and the tokenizer file's bytes, with
a JSON sidecar written after it (the sidecar's presence marks a complete entry). tfrun.cli.setup tokenizes (or
finds the entry) before any rank starts, writes it only after every check passed, and the ranks memory-map
it; a second run on the same data and tokenizer reads the entry and tokenizes nothing. Ranks of an external
torchrun job each run setup: they may each write the same entry, atomically.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfrun.data import tokenfile
from tfrun.data.batches import DataError, MaskedTokens

TEXT_SUFFIXES = (".txt", ".md")
JSONL = ".jsonl"
CACHE_VERSION = 2
"""Bump when the way documents become ids changes: old cache entries are then never matched (2: the rendering
of chat data, its template and loss mask, in the key)."""
BATCH_DOCUMENTS = 1024
"""Documents per encode_batch call (bounds the memory of the encodings)."""


def _files(path: Path) -> list[Path]:
    """The files --data names: itself, or a folder's text and jsonl files (recursive, sorted)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(f"--data {path}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (*TEXT_SUFFIXES, JSONL)
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise DataError(f"--data {path}: a folder without {', '.join(TEXT_SUFFIXES)} or {JSONL} files")
    return files


def source_hash(path: str | Path) -> str:
    """sha256 hex of the data --data names: a file's bytes, or each file's relative path and bytes' hash."""
    path = Path(path)
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    sha = hashlib.sha256()
    for file in _files(path):
        sha.update(f"{file.relative_to(path)}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\n".encode())
    return sha.hexdigest()


def _jsonl_rows(file: Path, text: str) -> list[tuple[str, object]]:
    """("FILE: line N", parsed JSON) for every non-blank line."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{file}: line {n}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(f"{file}: line {n}: not JSON ({exc.msg})") from None
    return rows


def _text_of(where: str, obj: object) -> str:
    if not isinstance(obj, dict) or "text" not in obj:
        raise DataError(f"{where} has no \"text\" field")
    if not isinstance(obj["text"], str):
        raise DataError(f"{where}: \"text\" must be a string")
    return obj["text"]


def read_rows(path: str | Path) -> tuple[list[str], list[tuple[str, object]]]:
    """(documents, chat rows) --data names, in order (module docstring): a jsonl file whose first row is a chat
    row (tfrun.data.chat.is_chat_row) holds chat rows, every other file documents; one --data holds one kind.

    Raises:
        DataError: a missing path, a file that is not UTF-8 text, a jsonl line that is not JSON or (documents)
            not an object with a string `text` field (naming the file and the line), both kinds in one --data.
    """
    from tfrun.data.chat import is_chat_row

    path = Path(path)
    docs: list[str] = []
    chats: list[tuple[str, object]] = []
    for file in _files(path):
        try:
            text = file.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{file}: not UTF-8 text (byte offset {exc.start})") from None
        except OSError as exc:
            raise DataError(f"{file}: cannot read ({exc.strerror})") from None
        if file.suffix != JSONL:
            docs.append(text)
            continue
        rows = _jsonl_rows(file, text)
        if rows and is_chat_row(rows[0][1]):
            chats.extend(rows)
        else:
            docs.extend(_text_of(where, obj) for where, obj in rows)
        if docs and chats:
            raise DataError(f"--data {path}: both text documents and chat rows ({file}); give one kind")
    return docs, chats


def documents(path: str | Path) -> list[str]:
    """Every text document --data names, in order (read_rows; chat rows are refused here: they need a
    tokenizer)."""
    docs, chats = read_rows(path)
    if chats:
        raise DataError(f"{chats[0][0]}: a chat row; chat data needs --tokenizer (and a chat template)")
    return docs


@dataclass(frozen=True, kw_only=True, slots=True)
class Tokenizer:
    """A `tokenizer.json` loaded with the tokenizers package."""

    path: str
    """The file."""
    sha256: str
    """sha256 hex of its bytes (the cache key's and the run's identity)."""
    vocab_size: int
    """Token ids it can produce: its vocabulary with the added (special) tokens."""
    impl: object
    """tokenizers.Tokenizer."""


def load_tokenizer(path: str) -> Tokenizer:
    """Raises DataError (one line) for a missing or unreadable file, or one the tokenizers package rejects."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"--tokenizer {path}: no such file")
    try:
        from tokenizers import Tokenizer as Impl
    except ImportError:
        raise DataError("--tokenizer needs the tokenizers package: pip install 'timelyfreeze[hf]'") from None
    data = file.read_bytes()
    try:
        impl = Impl.from_str(data.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exceptions
        raise DataError(f"--tokenizer {path}: not a tokenizer.json ({str(exc).splitlines()[0][:160]})") from None
    return Tokenizer(path=path, sha256=hashlib.sha256(data).hexdigest(),
                     vocab_size=impl.get_vocab_size(with_added_tokens=True), impl=impl)


def encode_documents(docs: list[str], tok: Tokenizer) -> np.ndarray:
    """The documents' ids, concatenated, in the smallest dtype of tfrun.data.tokenfile that holds them."""
    dtype = tokenfile.DTYPES[tokenfile.smallest_dtype(tok.vocab_size)]
    parts = [np.zeros(0, dtype=dtype)]
    for i in range(0, len(docs), BATCH_DOCUMENTS):
        for enc in tok.impl.encode_batch(docs[i: i + BATCH_DOCUMENTS], add_special_tokens=True):
            parts.append(np.asarray(enc.ids, dtype=dtype))
    return np.concatenate(parts)


@dataclass(slots=True)
class Cached:
    """A tokenized stream and its cache entry (Note [token cache])."""

    tokens: object
    """The ids (N,), memory-mapped when the entry existed; MaskedTokens for chat data (its loss mask beside)."""
    file: Path
    """The entry's token file."""
    meta: dict
    """The entry's sidecar."""
    hit: bool
    """Whether the entry existed (nothing was tokenized)."""

    def save(self) -> None:
        """Write the entry (the token file, then its sidecar); nothing when it existed."""
        if self.hit:
            return
        from tfplan.errors import TfplanError
        from tfplan.fileio import write_json_atomic

        try:
            if isinstance(self.tokens, MaskedTokens):
                tokenfile.write(self.file, self.tokens.ids)
                tokenfile.write(mask_file(self.file), self.tokens.mask)
            else:
                tokenfile.write(self.file, self.tokens)
            write_json_atomic(self.file.with_suffix(".json"), self.meta)
        except (OSError, TfplanError) as exc:
            raise DataError(f"token cache: cannot write {self.file} ({getattr(exc, 'strerror', None) or exc}); "
                            f"choose a writable --token-cache DIR") from None


def tokenize(data_path: str, tok: Tokenizer, cache_dir: Path, template=None, chat_loss: str = "assistant") -> Cached:
    """The stream of --data through `tok` (chat rows rendered with `template`, a tfrun.data.chat.Template, and
    masked as `chat_loss` says: tfrun.data.chat), from the cache when an entry exists (Note [token cache]); a new
    one is returned unsaved (Cached.save)."""
    from tfrun.data import chat

    data_sha = source_hash(data_path)
    render = {"template_sha256": template.sha256 if template is not None else None, "chat_loss": chat_loss}
    key = hashlib.sha256(f"v{CACHE_VERSION}/{data_sha}/{tok.sha256}/{json.dumps(render, sort_keys=True)}".encode()
                         ).hexdigest()[:32]
    file = Path(cache_dir) / f"{key}{tokenfile.SUFFIX}"
    found = _read_entry(file, data_sha, tok.sha256, render)
    if found is not None:
        return Cached(tokens=found[0], file=file, meta=found[1], hit=True)
    docs, rows = read_rows(data_path)
    dtype = tokenfile.DTYPES[tokenfile.smallest_dtype(tok.vocab_size)]
    if rows:
        ids, mask = chat.encode_rows(rows, tok, chat.Renderer(template) if template is not None else None, dtype)
        tokens = MaskedTokens(ids, np.ones_like(mask) if chat_loss == "all" else mask)
    else:
        tokens = encode_documents(docs, tok)
    meta = {"schema_version": CACHE_VERSION, "data": str(data_path), "data_sha256": data_sha,
            "tokenizer": tok.path, "tokenizer_sha256": tok.sha256, "vocab_size": tok.vocab_size,
            "token_dtype": tokenfile.smallest_dtype(tok.vocab_size), "num_tokens": int(len(tokens)),
            "documents": len(rows) or len(docs), "masked": bool(rows), **render,
            **({"chat_template": template.source, "counted_tokens": int(tokens.mask.sum())} if rows else {})}
    return Cached(tokens=tokens, file=file, meta=meta, hit=False)


def mask_file(file: Path) -> Path:
    """The loss mask (uint8, 1 a counted token) beside a cache entry's token file."""
    return file.with_suffix(".mask")


def open_entry(file: Path, meta: dict):
    """A cache entry's stream: its ids memory-mapped, with its mask (MaskedTokens) when it has one."""
    ids = tokenfile.open_tokens(file, meta["token_dtype"])
    if not meta.get("masked"):
        return ids
    return MaskedTokens(ids, np.memmap(mask_file(file), dtype=np.uint8, mode="r"))


def _read_entry(file: Path, data_sha: str, tok_sha: str, render: dict) -> tuple[object, dict] | None:
    """An existing complete entry for this data, tokenizer and rendering, or None (absent, partial or another's)."""
    try:
        meta = json.loads(file.with_suffix(".json").read_text())
        ok = (meta.get("schema_version") == CACHE_VERSION and meta.get("data_sha256") == data_sha
              and meta.get("tokenizer_sha256") == tok_sha and meta.get("token_dtype") in tokenfile.DTYPES
              and all(meta.get(k) == v for k, v in render.items()))
        tokens = open_entry(file, meta) if ok else None
    except (OSError, ValueError, KeyError, AttributeError, DataError):
        return None
    if tokens is None or len(tokens) != meta.get("num_tokens"):
        return None
    return tokens, meta


def cache_meta(file: Path) -> dict:
    """A cache entry's sidecar, for the ranks that memory-map it (open_entry).

    Raises:
        DataError: the entry is gone or damaged since setup wrote it.
    """
    try:
        meta = json.loads(Path(file).with_suffix(".json").read_text())
        tokenfile.dtype_of(meta["token_dtype"])
    except (OSError, ValueError, KeyError, TypeError, DataError):
        raise DataError(f"token cache {file}: missing or damaged since the run started; start it again") from None
    return meta
