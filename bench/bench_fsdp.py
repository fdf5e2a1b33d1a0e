"""PyTorch's own FSDP1, FSDP2 and DDP on bench_fsdp.cpp's transformer (examples/transformer.h):
same layers, sizes, local batch, loss, Adam, warm-up and timing, one thread per rank, Gloo on CPU.
Run under torchrun (see run_anchor_bench.sh); prints the slowest rank's median step time.

--mode fsdp2 is FSDP2's fully_shard; where PyTorch cannot run it (2.6 on CPU) it prints the error
and where it was raised, and exits 0.

--device cuda (issue 37's GPU benchmark, the counterpart of bench_fsdp_device.cpp): one rank per
GPU over NCCL, the model and batch on the GPU, --param-dtype bf16 FSDP2's MixedPrecisionPolicy
(bfloat16 parameters, float32 reduction); Adam with foreach=False, the per-tensor loop that
libtorch's C++ Adam runs, so both libraries launch the same kernels; the GPU synchronized around
each step; also prints the caching allocator's peak over a step, tokens/s and the MFU.
"""
import argparse
import gc
import os
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from gloo_init import init_process_group


# The modules below are examples/transformer.h's, attribute for attribute and in its
# registration order: that order decides DDP's buckets and FSDP's flat parameters.
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
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
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
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim)

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
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.size(1), device=tokens.device))
        return self.output(self.norm(self.layers(h)))


def wrap(model, args):
    mode = args.mode
    if mode == "ddp":  # defaults = fsdpp's: 25 MiB buckets (the first 1 MiB), grads copied out
        return nn.parallel.DistributedDataParallel(model)
    if mode == "fsdp":
        from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        # Every block a unit, then the root, as bench_fsdp's ModuleWrapPolicy<TransformerBlockImpl>;
        # blocks reshard after forward, the root does not (both libraries). fsdpp prefetches the
        # next unit in forward and in backward, so FSDP1 is asked to do both too.
        return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}),
                    sharding_strategy=ShardingStrategy.FULL_SHARD,
                    backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True,
                    use_orig_params=args.use_orig_params,
                    device_id=torch.device("cpu"))  # else 2.6 looks for an accelerator and stops
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard  # fsdp2

    # As fsdpp's bench: every block, then the root; reshard_after_forward left at its default
    # (blocks reshard, the root does not). The mesh is named: by default FSDP2 takes the
    # accelerator's, and a CUDA wheel on a machine with a GPU would then not be on Gloo/CPU.
    mesh = init_device_mesh(args.device, (dist.get_world_size(),))
    kwargs = {"mesh": mesh}
    if args.param_dtype == "bf16":
        from torch.distributed.fsdp import MixedPrecisionPolicy
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, **kwargs)
    return fully_shard(model, **kwargs)


def report_failure(e, rank):
    """One line: the error and the line of torch that raised it."""
    if rank == 0:
        where = traceback.extract_tb(e.__traceback__)[-1]
        path = os.path.relpath(where.filename, os.path.dirname(os.path.dirname(torch.__file__)))
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"pytorch {torch.__version__} fsdp2 fully_shard failed in its first step: {message} "
              f"(at {path}:{where.lineno})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["fsdp", "ddp", "fsdp2"], default="fsdp")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--local-batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--param-dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--peak-tflops", type=float, default=989.0)  # H100 / H200 SXM, dense bf16
    parser.add_argument("--steps", type=int, default=10)
    # FSDP1's default (off) gives Adam one flat shard per unit; on, Adam steps each original
    # parameter's piece of the shard, as fsdpp's per-parameter shards are stepped.
    parser.add_argument("--use-orig-params", action="store_true")
    args = parser.parse_args()
    seq, n_heads, warmup = args.seq, args.heads, 3  # bench_fsdp's max_seq_len, n_heads and warm-up
    cuda = args.device == "cuda"
    torch.set_num_threads(1)
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        init_process_group()
    rank = dist.get_rank()
    torch.manual_seed(rank)
    tokens = torch.randint(args.vocab, (args.local_batch, seq)).to(device)
    targets = torch.randint(args.vocab, (args.local_batch, seq)).to(device)
    torch.manual_seed(0)
    plain = Transformer(args.layers, args.dim, args.vocab, seq, n_heads).to(device)
    params = sum(p.numel() for p in plain.parameters())
    model = wrap(plain, args)
    # On CPU, PyTorch's Adam (2.6 and 2.15) is the per-tensor loop (foreach kernels are for
    # accelerators), as libtorch's C++ Adam is; on a GPU it is asked for that loop.
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)

    def step():
        opt.zero_grad()
        logits = model(tokens)
        F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1)).backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    # Untimed steps before the timed loop's own warm-up, as many as bench_fsdp runs: FSDP's
    # first step, its memory probe and its wire-count step; DDP's first step and memory probe.
    try:
        for _ in range(2 if args.mode == "ddp" else 3):
            step()
    except Exception as e:
        if args.mode != "fsdp2":
            raise
        report_failure(e, rank)
        return  # without destroy_process_group: an all-gather may still be in flight
    times = []
    for i in range(warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    median = torch.tensor([times[len(times) // 2]], dtype=torch.double)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)  # the slowest rank's median
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated()
        tokens_per_step = args.local_batch * seq * dist.get_world_size()
        # PaLM's count, as bench_fsdp_device.cpp (examples/transformer.h's training_flops_per_token)
        flops_per_token = 6 * params + 12 * args.layers * args.dim * seq
        mfu = flops_per_token * tokens_per_step / median.item() / dist.get_world_size() / (args.peak_tflops * 1e12)
        if rank == 0:
            print(f"pytorch {torch.__version__} {args.mode} {device} world={dist.get_world_size()} "
                  f"layers={args.layers} dim={args.dim} seq={seq} local_batch={args.local_batch} "
                  f"params={params / 1e6:.1f}M dtype={args.param_dtype} median_step_ms={median.item() * 1e3:.3f} "
                  f"peak_step_MiB={peak / 2**20:.1f} held_MiB={held / 2**20:.1f} "
                  f"tokens_per_s={tokens_per_step / median.item():.0f} mfu={mfu:.4f} (of {args.peak_tflops:.0f} TFLOP/s)")
    elif rank == 0:
        print(f"pytorch {torch.__version__} {args.mode} world={dist.get_world_size()} "
              f"layers={args.layers} dim={args.dim} params={params * 4 / 2**20:.2f}MiB "
              f"local_batch={args.local_batch}x{seq} "
              f"median_step_ms={median.item() * 1e3:.2f}")
    # The wrapped model holds the process group: dropped first, the group is freed by
    # destroy_process_group rather than at interpreter exit, where a rank at times aborted
    # ("terminate called without an active exception"; 2.15, FSDP1, N = 4) after the result.
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
