"""Context parallelism: attention over sequences sharded among the ranks of a
torch.distributed group (NCCL on CUDA, HCCL on Ascend, gloo on the CPU), forward and
backward, on ``torch.ops.flash_cann`` (so on every backend). docs/distributed.md.

    import torch.distributed as dist, flash_cann.distributed as cp
    dist.init_process_group("nccl")   # "hccl" on Ascend (import torch_npu), "gloo" on CPU
    q, k, v = (cp.shard(t, seq_dim=1) for t in (q, k, v))          # zigzag by default
    out = cp.context_parallel_attn_func(q, k, v, causal=True)       # this rank's rows
    full = cp.unshard(out, seq_dim=1)

Packed documents (llama3-style: contiguous token shards, K/V all-gathered):
:func:`varlen_shard` and :func:`context_parallel_varlen_attn_func`.

The layer sits above ``api`` and ``contract`` (it calls the op and the API's argument
helpers) and below ``integrations`` (torch's own ``context_parallel`` is served from
there).
"""

from .attention import context_parallel_attn_func
from .sharding import SHARDINGS, chunks_of, restore, shard, unshard
from .varlen import VarlenShard, context_parallel_varlen_attn_func, varlen_shard

__all__ = ["context_parallel_attn_func", "context_parallel_varlen_attn_func", "varlen_shard",
           "VarlenShard", "shard", "unshard", "restore", "chunks_of", "SHARDINGS"]
