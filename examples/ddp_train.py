"""Data-parallel training with ember on CPU (gloo), launched by torchrun:

    torchrun --nproc-per-node 2 examples/ddp_train.py [--steps 20] [--backend ember]
             [--bucket-cap-mb 0.05] [--no-split] [--eager]

`ember.compile(DDP(model))` compiles the wrapped module in place; the captured graph is cut at
DDP's bucket boundaries so gradient all-reduce of early buckets overlaps the backward of later
ones (`--no-split` compiles one graph). Each rank trains on its own random data; rank 0 prints
the loss, the step time, and a checksum of the parameters (equal on every rank).
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ember


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.c3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.relu(self.c3(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--backend", default="ember", help="ember | aot_eager | eager")
    p.add_argument("--bucket-cap-mb", type=float, default=0.05)
    p.add_argument("--no-split", action="store_true", help="one graph, no bucket split")
    p.add_argument("--eager", action="store_true", help="plain eager DDP, no ember")
    args = p.parse_args()

    dist.init_process_group("gloo")   # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank = dist.get_rank()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // dist.get_world_size()))
    torch.manual_seed(0)
    model = DDP(CNN(), bucket_cap_mb=args.bucket_cap_mb)
    if not args.eager:
        ember.compile(model, backend=args.backend, options={"ddp_split": not args.no_split})
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (args.batch,), generator=g)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss.item():.4f}  {times[-1] * 1e3:.1f} ms", flush=True)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    if rank == 0:
        from ember.distributed import split_backend
        split = split_backend(model)
        pieces = split.pieces_per_graph if split is not None else None
        steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
        print(f"median step {steady * 1e3:.1f} ms (first {times[0]:.2f} s); graphs split into "
              f"{pieces}; parameter checksum {checksum:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
