"""A tokenizer / data-loader loop, as an ML host runs it: text documents are split into words,
mapped to ids through a growing vocabulary dict, cut into fixed-length samples, shuffled in a
buffer and collated into padded batches (lists of lists and dicts of features), which the
"training step" then drops.

    python3 tokenizer_loader.py [--batches 300] [--batch 16] [--seq 256] [--seed 7]
"""
import argparse
import random

WORDS = [
    "the", "model", "gradient", "tensor", "allocator", "memory", "token", "batch", "layer", "attention",
    "cache", "fragment", "python", "serve", "train", "loss", "step", "weight", "bias", "embedding",
]


def documents(rng):
    """An endless stream of documents of a few hundred to a few thousand words."""
    while True:
        n = rng.randint(200, 3000)
        words = [rng.choice(WORDS) + (str(rng.randint(0, 5000)) if rng.random() < 0.3 else "") for _ in range(n)]
        yield " ".join(words)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--shuffle-buffer", type=int, default=512)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    vocab = {"<pad>": 0, "<eos>": 1}
    buffer = []
    pending = []
    tokens_seen = 0
    docs = documents(rng)
    for _ in range(a.batches):
        while len(buffer) < a.shuffle_buffer:
            text = next(docs)
            ids = [vocab.setdefault(w, len(vocab)) for w in text.split()]
            ids.append(1)
            tokens_seen += len(ids)
            pending.extend(ids)
            while len(pending) >= a.seq:
                buffer.append({"input_ids": pending[: a.seq], "source": text[:32]})
                pending = pending[a.seq :]
        rng.shuffle(buffer)
        samples = [buffer.pop() for _ in range(a.batch)]
        lengths = [rng.randint(a.seq // 2, a.seq) for _ in samples]
        longest = max(lengths)
        batch = {
            "input_ids": [s["input_ids"][:n] + [0] * (longest - n) for s, n in zip(samples, lengths)],
            "attention_mask": [[1] * n + [0] * (longest - n) for n in lengths],
            "sources": [s["source"] for s in samples],
        }
        # The "step": a checksum stands for the model consuming the batch.
        tokens_seen += sum(map(sum, batch["attention_mask"])) % 7
        del batch, samples
    print(f"loader: {a.batches} batches, vocabulary {len(vocab)}, {tokens_seen} tokens read")


if __name__ == "__main__":
    main()
