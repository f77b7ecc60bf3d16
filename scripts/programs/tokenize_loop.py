"""A `tokenizers` preprocessing loop: train a byte-level BPE tokenizer on generated text, then
encode the corpus in batches (Hugging Face `tokenizers`: Rust, multi-threaded with rayon), pad and
collect the ids as a data loader would.

Recorded by scripts/record_programs.sh; the work is the `tokenizers` library's, this file only
drives it. Needs `tokenizers` (pip install tokenizers).
    python3 tokenize_loop.py [--docs 4000] [--batch 64] [--seed 1]
"""

import argparse
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def corpus(n, seed):
    rng = random.Random(seed)
    vocab = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 10)))
        for _ in range(3000)
    ]
    for _ in range(n):
        yield " ".join(rng.choice(vocab) for _ in range(rng.randrange(20, 400)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    docs = list(corpus(a.docs, a.seed))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs[: a.docs // 4], trainers.BpeTrainer(vocab_size=4000, show_progress=False))
    tok.enable_padding(pad_id=0)
    tok.enable_truncation(max_length=512)
    total = 0
    batches = []
    for i in range(0, len(docs), a.batch):
        enc = tok.encode_batch(docs[i : i + a.batch])
        batches.append([e.ids for e in enc])
        total += sum(len(e.ids) for e in enc)
        if len(batches) > 8:
            batches.pop(0)  # a loader keeps a few batches in flight
    print(f"encoded {len(docs)} documents into {total} ids in batches of {a.batch}")


if __name__ == "__main__":
    main()
