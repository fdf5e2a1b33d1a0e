"""PyTorch's own FSDP1 and DDP on bench_fsdp.cpp's transformer (examples/transformer.h), same
sizes, local batch, loss, Adam, warm-up and timing, one thread per rank, Gloo on CPU.
Run under torchrun (see run_anchor_bench.sh); prints the slowest rank's median step time.

--mode fsdp2 tries FSDP2's fully_shard instead, and prints what PyTorch 2.6 does with it on CPU.
"""
import argparse
import functools
import time

import torch
import torch.distributed as dist
from gloo_init import init_process_group
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.n_heads

        def heads(t):
            return t.view(b, s, self.n_heads, hd).transpose(1, 2)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / hd**0.5
        causal = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        out = torch.matmul(torch.softmax(scores, -1), v)
        return self.wo(out.transpose(1, 2).reshape(b, s, d))


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention, self.feed_forward = Attention(dim, n_heads), FeedForward(dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, layers, dim, vocab, seq, n_heads):
        super().__init__()
        self.tok_embeddings, self.pos_embeddings = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.layers = nn.Sequential(*(TransformerBlock(dim, n_heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.size(1)))
        return self.output(self.norm(self.layers(h)))


def wrap(model, mode):
    if mode == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if mode == "fsdp":  # every block a unit, then the root, as bench_fsdp's ModuleWrapPolicy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        # device_id: 2.6 otherwise looks for an accelerator and refuses to run on CPU
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}), device_id=torch.device("cpu"))
    from torch.distributed.fsdp import fully_shard  # fsdp2

    for block in model.layers:
        fully_shard(block)
    return fully_shard(model)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["fsdp", "ddp", "fsdp2"], default="fsdp")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--local-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    seq, n_heads, warmup = 32, 4, 3
    torch.set_num_threads(1)
    init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(rank)
    tokens = torch.randint(args.vocab, (args.local_batch, seq))
    targets = torch.randint(args.vocab, (args.local_batch, seq))
    torch.manual_seed(0)
    model = wrap(Transformer(args.layers, args.dim, args.vocab, seq, n_heads), args.mode)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)).backward()
        opt.step()

    step()  # Adam state exists from here on, as in bench_fsdp
    times = []
    for i in range(warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    median = torch.tensor([times[len(times) // 2]], dtype=torch.double)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"pytorch {torch.__version__} {args.mode} world={dist.get_world_size()} "
              f"median_step_ms={median.item() * 1e3:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
