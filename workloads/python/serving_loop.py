"""A bursty serving front end: requests arrive in Poisson bursts separated by idle gaps; each
builds a prompt string, a request dict and a growing list of generated chunks (a token-by-token
stream, as an LLM server's Python side holds it), and is dropped when it finishes. Idle gaps let
an allocator's purge timers run between bursts.

    python3 serving_loop.py [--bursts 12] [--rate 60] [--idle 0.05] [--seed 11]
"""
import argparse
import random
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=12)
    ap.add_argument("--rate", type=float, default=60, help="mean requests per burst")
    ap.add_argument("--idle", type=float, default=0.05, help="seconds between bursts")
    ap.add_argument("--seed", type=int, default=11)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    served = 0
    generated = 0
    for burst in range(a.bursts):
        n = max(1, int(rng.gauss(a.rate, a.rate / 3)))
        active = []
        for i in range(n):
            prompt = " ".join(f"w{rng.randint(0, 50000)}" for _ in range(rng.randint(20, 2000)))
            active.append({"id": f"req-{burst}-{i}", "prompt": prompt, "max_tokens": rng.randint(16, 256), "chunks": []})
        # Decode: every active request grows by one chunk per round until it is done.
        while active:
            still = []
            for req in active:
                req["chunks"].append("tok%d " % rng.randint(0, 32000) + "x" * rng.randint(0, 64))
                if len(req["chunks"]) >= req["max_tokens"]:
                    generated += len("".join(req["chunks"]))
                    served += 1
                else:
                    still.append(req)
            active = still
        time.sleep(a.idle)
    print(f"serving: {a.bursts} bursts, {served} requests, {generated} bytes generated")


if __name__ == "__main__":
    main()
