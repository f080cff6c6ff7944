"""`python -m tfrun.data`: the default corpus's size, split sizes and its first batch, decoded."""

from tfrun.data.batches import Batches, split_tokens
from tfrun.data.text import decode, encode, load_corpus

if __name__ == "__main__":
    stream = encode(load_corpus(None))
    train, val = split_tokens(stream)
    print(f"default corpus: {len(stream):,} tokens; train {len(train):,}, validation {len(val):,}")
    inputs, _ = next(Batches(train, global_batch=2, seq_len=64, seed=0))
    print(repr(decode(inputs[0])))
