"""PyTorch's Python DDP on the same MLP, batch and Gloo backend as bench_ddp.cpp.

Run under torchrun (see run_ddp_bench.sh): prints the median step time on the slowest rank.
"""
import argparse
import time

import torch
import torch.distributed as dist
from gloo_init import init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU()]
    model = DDP(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = args.global_batch // world
    x, y = torch.randn(batch, args.hidden), torch.randn(batch, args.hidden)
    times = []
    for step in range(5 + args.steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if step >= 5:
            times.append(time.perf_counter() - start)
    times.sort()
    median = torch.tensor([times[len(times) // 2]], dtype=torch.double)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"python ddp world={world} params={params} global_batch={args.global_batch} "
              f"median_step_ms={median.item() * 1e3:.2f}")


if __name__ == "__main__":
    main()
