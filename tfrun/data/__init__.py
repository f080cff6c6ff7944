"""What a run can read, one module per source, all ending in one token stream:

  text.py        the built-in corpora (pydoc topics, `stdlib`) or one text file, as bytes (vocabulary 256)
  tokenized.py   a text file, a `.jsonl` file (`text` fields, or chat rows) or a folder of them through
                 `--tokenizer tokenizer.json`, tokenized once and cached (Note [token cache])
  chat.py        chat rows (`messages`, or `prompt`/`completion`) rendered with a chat template, the loss on
                 the answers only (Note [chat rendering])
  tokenfile.py   a pre-tokenized flat `.bin` of uint16 or uint32 ids (nanoGPT's layout), memory-mapped
  batches.py     any stream -> train/validation split, resumable random batches, micro-batches

`open_stream` is what tfrun.cli.setup calls before any rank starts (every check, the vocabulary agreement, the
cache written last); `rank_tokens` is what each rank calls (the checked stream, without checking again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfrun.data import chat, text, tokenfile, tokenized
from tfrun.data.batches import IGNORE, Batches, DataError, MaskedTokens, eval_batches, split_microbatches, split_tokens
from tfrun.data.text import STDLIB, VOCAB_SIZE, decode, encode, load_corpus

__all__ = ["IGNORE", "STDLIB", "VOCAB_SIZE", "Batches", "DataError", "MaskedTokens", "TokenStream", "decode",
           "encode", "eval_batches",
           "load_corpus", "open_stream", "rank_tokens", "split_microbatches", "split_tokens"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenStream:
    """A run's whole token stream, as setup found it."""

    tokens: object
    """(N,) ids: a torch uint8 tensor (bytes) or a numpy array (a token file or a tokenized stream)."""
    identity: str
    """TrainConfig.data_hash: "sha256:..." of the bytes of byte-level text, or of the token stream itself (its ids
    as little-endian bytes of their dtype) for tokenized data and token files, so that a tokenized stream and
    the same ids given back as a `.bin` file are the same data (a resume may switch between them)."""
    where: str
    """How the user named it, for messages ("--data x.bin", "default corpus")."""
    cache: str | None = None
    """Tokenized data: the cache entry's token file the ranks read (TrainConfig.token_cache)."""
    save: Callable[[], None] | None = None
    """Tokenized data: writes the cache entry (setup calls it once every check passed)."""


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _stream_sha(ids) -> str:
    """sha256 of a token stream's bytes (a .bin file's bytes), read in chunks (a memory map stays unread)."""
    sha = hashlib.sha256()
    for start in range(0, len(ids), tokenfile.CHUNK_TOKENS):
        sha.update(np.ascontiguousarray(ids[start: start + tokenfile.CHUNK_TOKENS]).tobytes())
    return "sha256:" + sha.hexdigest()


def open_stream(data_path: str | None, *, tokenizer_path: str | None, token_dtype: str, model_vocab: int,
                cache_dir: str | Path, chat_template: str | None = None, chat_loss: str = "assistant") -> TokenStream:
    """The stream --data, --tokenizer and --token-dtype name, checked against the model's vocabulary; chat rows
    rendered with --chat-template (default: the template beside --tokenizer) and masked as --chat-loss says
    (tfrun.data.chat).

    Raises:
        DataError: one line naming the file (and the line, field or offset): see each source module; and
            a vocabulary that does not fit the model's.
    """
    tokenfile.dtype_of(token_dtype)
    if tokenfile.is_token_file(data_path):
        if tokenizer_path is not None:
            raise DataError(f"--data {data_path} is already tokenized (a {tokenfile.SUFFIX} file); --tokenizer "
                            f"applies to text data")
        ids = tokenfile.open_tokens(data_path, token_dtype)
        tokenfile.check(ids, model_vocab, f"--data {data_path}")
        return TokenStream(tokens=ids, identity=_stream_sha(ids), where=f"--data {data_path}")
    if tokenizer_path is None:
        if model_vocab < text.VOCAB_SIZE:
            raise DataError(f"byte-level text needs a vocabulary of {text.VOCAB_SIZE}, the model has {model_vocab}: "
                            f"pass --tokenizer (the model's tokenizer.json) or a {tokenfile.SUFFIX} token file")
        raw = _bytes(data_path)
        return TokenStream(tokens=encode(raw), identity=_sha(raw),
                           where="default corpus" if data_path is None else f"--data {data_path}")
    tok = tokenized.load_tokenizer(tokenizer_path)
    if tok.vocab_size > model_vocab:
        raise DataError(f"--tokenizer {tokenizer_path}: its vocabulary of {tok.vocab_size} tokens is larger than the "
                        f"model's {model_vocab}")
    if data_path is None or data_path == STDLIB and not Path(data_path).exists():
        raise DataError("--tokenizer needs --data (a text file, a .jsonl file or a folder of them)")
    template_path = chat_template or chat.find_template(tokenizer_path)
    template = chat.load_template(template_path) if template_path is not None else None
    cached = tokenized.tokenize(data_path, tok, Path(cache_dir), template, chat_loss)
    return TokenStream(tokens=cached.tokens, identity=_identity(cached.tokens), where=f"--data {data_path}",
                       cache=str(cached.file), save=cached.save)


def _identity(tokens) -> str:
    """TokenStream.identity of a tokenized stream: its ids', and a masked stream's mask too."""
    if not isinstance(tokens, MaskedTokens):
        return _stream_sha(tokens)
    return _sha((_stream_sha(tokens.ids) + _stream_sha(tokens.mask)).encode())


def _bytes(data_path: str | None) -> bytes:
    """Byte-level text: a built-in corpus or a text file (tfrun.data.text), or a jsonl file or folder's
    documents joined by newlines."""
    if data_path is None or Path(data_path).is_file() and Path(data_path).suffix != tokenized.JSONL \
            or data_path == STDLIB and not Path(data_path).exists():
        return load_corpus(data_path)
    raw = "\n".join(tokenized.documents(data_path)).encode("utf-8")
    if len(raw) < text.MIN_CORPUS_BYTES:
        raise DataError(f"--data {data_path}: {len(raw)} bytes of text, need at least {text.MIN_CORPUS_BYTES}")
    return raw


def rank_tokens(data_path: str | None, *, token_cache: str | None, token_dtype: str):
    """In a rank: the stream setup checked (tfrun.cli.setup), read again without the checks: bytes decoded anew, a
    token file or the tokenized cache entry memory-mapped."""
    if token_cache is not None:
        return tokenized.open_entry(Path(token_cache), tokenized.cache_meta(Path(token_cache)))
    if tokenfile.is_token_file(data_path):
        return tokenfile.open_tokens(data_path, token_dtype)
    return encode(_bytes(data_path))
