"""Python object churn (the seed's demo, as a real program): bytearrays of 100 B ... 100 KB with
random lifetimes, then a drain phase that frees everything and idles, so an allocator's decay and
purge timers show in the RSS timeline.

    python3 object_churn.py [--steps 3000] [--drain 1.0] [--seed 5]
"""
import argparse
import random
import time

SIZES = [100, 1_000, 10_000, 100_000]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--per-step", type=int, default=50)
    ap.add_argument("--drain", type=float, default=1.0, help="seconds to idle after freeing everything")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    # Live objects by the step they die at: lifetimes from one step to a few hundred (long tail).
    dying = {}
    live = 0
    for step in range(a.steps):
        for _ in range(a.per_step):
            size = rng.choice(SIZES)
            obj = bytearray(size)
            obj[-1] = 1  # touched, as a real object would be
            lifetime = 1 + int(rng.expovariate(1 / 40))
            dying.setdefault(step + lifetime, []).append(obj)
            live += 1
        live -= len(dying.pop(step, []))
    print(f"churn: {a.steps} steps, {a.steps * a.per_step} objects, {live} live before the drain")
    dying.clear()
    time.sleep(a.drain)


if __name__ == "__main__":
    main()
