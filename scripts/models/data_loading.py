#!/usr/bin/env python3
"""A training loop whose CPU side is the work: a DataLoader over synthetic 3x256x256 images with
the usual per-sample transforms (random crop, flip, float conversion, normalisation), each batch
sent to the device for a small model's step. Prints the seconds spent producing batches
(`loading: S s`), the figure `scripts/capture_speed.sh` compares traced and untraced."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n):
        self.n = n
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        image = torch.randint(0, 256, (3, 256, 256), dtype=torch.uint8, generator=g)
        top, left = torch.randint(0, 32, (2,), generator=g).tolist()
        crop = image[:, top:top + 224, left:left + 224]
        if torch.rand(1, generator=g).item() < 0.5:
            crop = crop.flip(-1)
        return (crop.float() / 255 - self.mean) / self.std, i % 10


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 224 * 224, 10)).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Images(a.samples), batch_size=a.batch, shuffle=True, num_workers=0)
    loading = 0.0
    batches = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            x, y = next(batches)
        except StopIteration:
            break
        loading += time.perf_counter() - start
        x, y = x.to(a.device, non_blocking=True), y.to(a.device, non_blocking=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"loading: {loading:.3f} s")


if __name__ == "__main__":
    main()
