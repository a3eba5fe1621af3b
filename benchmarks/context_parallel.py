"""Context-parallel attention (flash_cann.distributed): strong and weak scaling, the share
of communication hidden behind compute, and memory per rank.

    python benchmarks/context_parallel.py [--backend auto|gloo|nccl] [--world 2]
        [--quick] [--rotate p2p|allgather] [--out benchmarks/results] [--tag NAME]

Causal forward + backward of one sequence (batch 1, layout BSND, zigzag sharding), on
gloo (CPU, float32, small) or NCCL (one GPU per rank, bfloat16, the triton backend);
``auto`` picks NCCL when there are >= --world GPUs. Rank 0 also runs the whole sequence
alone (the one-device baseline; the other ranks wait).

- strong scaling: the same total length on 1 and W devices; speedup = T_1 / T_W.
- weak scaling: the same length per device (W x as many tokens in total); tokens/s on W
  devices over one device's, and the same normalised by the work (causal attention's
  FLOPs grow with the square of the length, so literal tokens/s cannot scale linearly:
  work-efficiency = (FLOPs_W / T_W) / (W x FLOPs_1 / T_1)).
- hidden communication (--rotate p2p): 1 - (T - T_compute) / T_comm, where T_compute is the same run
  with every transfer replaced by a no-op (the ring's exchanges return the rank's own
  tensors: the same compute) and T_comm the transfers alone (the ring's K/V and dK/dV
  exchanges, nothing computed). 1 = every byte moved behind compute.
- memory per rank: peak extra memory of forward + backward (CUDA: the allocator's peak;
  CPU: the resident-set high-water mark, Linux).

Times: median of --reps runs after a warm-up, each run's time the slowest rank's. Prints
the tables and writes context-parallel-<backend>[-TAG].json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import flash_cann  # noqa: E402
import flash_cann.distributed as cp  # noqa: E402
from flash_cann.distributed import attention as cp_attention  # noqa: E402
from flash_cann.distributed import rotation  # noqa: E402

CONFIGS = {  # heads, heads_kv, head_dim, dtype; strong totals; weak per-device lengths
    "gloo": dict(heads=2, heads_kv=2, head_dim=64, dtype=torch.float32,
                 strong=[1024, 2048], weak=[512, 1024], quick_strong=[1024], quick_weak=[512],
                 reps=3),
    "nccl": dict(heads=16, heads_kv=16, head_dim=128, dtype=torch.bfloat16,
                 strong=[16384, 32768, 65536], weak=[16384, 32768], quick_strong=[16384, 65536],
                 quick_weak=[32768], reps=5),
}


def _flops(seqlen: int, cfg) -> float:
    """Causal attention forward + backward: 3.5 x the forward's 2 * 2 * S^2 * H * D / 2."""
    return 3.5 * 2 * seqlen * seqlen * cfg["heads"] * cfg["head_dim"]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(length, cfg, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    def rand(h):
        return torch.randn(1, length, h, cfg["head_dim"], generator=g).to(device, cfg["dtype"])
    return rand(cfg["heads"]), rand(cfg["heads_kv"]), rand(cfg["heads_kv"]), rand(cfg["heads"])


def _step(fn, q, k, v, dout):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    fn(q, k, v).backward(dout)


def _timed(fn, inputs, reps, device, group=None):
    """Median over reps of the slowest rank's time (seconds)."""
    _step(fn, *inputs)  # warm-up (and Triton compilation)
    times = []
    for _ in range(reps):
        if group is not None:
            dist.barrier(group)
        _sync(device)
        start = time.perf_counter()
        _step(fn, *inputs)
        _sync(device)
        # on the device: NCCL reduces device tensors only
        elapsed = torch.tensor([time.perf_counter() - start], device=device)
        if group is not None:
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        times.append(elapsed.item())
    return statistics.median(times)


def _peak_bytes(fn, inputs, device):
    """Peak extra memory of one forward + backward on this rank."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        _step(fn, *inputs)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    def kib(field):
        with open("/proc/self/status", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    before = kib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset the high-water mark to the current resident set
    _step(fn, *inputs)
    return (kib("VmHWM") - before) * 1024


class _NoTransfers:
    """The ring without communication: each exchange hands back the rank's own tensors
    (the same compute, nothing moved), for T_compute."""

    def __enter__(self):
        self.saved = rotation.Ring.exchange
        rotation.Ring.exchange = lambda ring, tensors, offset, tag=0: rotation.Pending(
            [t.contiguous() for t in tensors], [])

    def __exit__(self, *exc):
        rotation.Ring.exchange = self.saved


def _transfers_only(setup, k, v):
    """The ring's transfers of one forward + backward, nothing computed (T_comm)."""
    ring, steps = setup.ring, setup.steps
    for _ in range(steps - 1):                                   # forward: K/V
        k, v = ring.exchange((k, v), 1).wait()
    dk, dv = (t.float() for t in (k, v))
    for _ in range(steps - 1):                                   # backward: K/V, dK/dV
        pending = ring.exchange((k, v), 1)
        dk, dv = ring.exchange((dk, dv), 1, tag=2).wait()
        k, v = pending.wait()
    if steps > 1:
        ring.exchange((dk, dv), -(steps - 1), tag=2).wait()      # back to the owners


def _rank_main(rank, world, port, backend, args, results_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group(backend, rank=rank, world_size=world)
    cfg = CONFIGS[backend]
    reps = 2 if args.quick and backend == "gloo" else cfg["reps"]
    strong = cfg["quick_strong"] if args.quick else cfg["strong"]
    weak = cfg["quick_weak"] if args.quick else cfg["weak"]
    single = lambda q, k, v: flash_cann.flash_attn_func(q, k, v, causal=True)  # noqa: E731
    parallel = lambda q, k, v: cp.context_parallel_attn_func(  # noqa: E731
        q, k, v, causal=True, rotate=args.rotate)
    rows = []

    def one_device(length):
        """Rank 0 alone on the whole ``length``; the others wait."""
        value = torch.zeros(2, device=device)
        if rank == 0:
            inputs = _inputs(length, cfg, device)
            value[0] = _timed(single, inputs, reps, device)
            value[1] = _peak_bytes(single, inputs, device)
        dist.broadcast(value, 0)
        return value[0].item(), value[1].item()

    def several(length):
        inputs = [cp.shard(t, 1) for t in _inputs(length, cfg, device)]
        t_all = _timed(parallel, inputs, reps, device, dist.group.WORLD)
        peak = torch.tensor([float(_peak_bytes(parallel, inputs, device))], device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        peak = peak.item()
        if args.rotate != "p2p":  # the split below is the ring's
            return t_all, float("nan"), float("nan"), float("nan"), peak
        with _NoTransfers():
            t_compute = _timed(parallel, inputs, reps, device, dist.group.WORLD)
        setup = cp_attention.prepare(*inputs[:3], None, scale=1.0, causal=True,
                                     window=(-1, -1), softcap=0.0, sharding="zigzag",
                                     rotate=args.rotate, deterministic=False, layout="BSND")
        t_comm = _timed(lambda q, k, v: _FakeOut(q, k, v, setup), inputs, reps, device,
                        dist.group.WORLD)
        hidden = 1 - (t_all - t_compute) / t_comm if t_comm > 0 else float("nan")
        return t_all, t_compute, t_comm, max(0.0, min(1.0, hidden)), peak

    for kind, lengths in (("strong", strong), ("weak", weak)):
        for length in lengths:
            total = length if kind == "strong" else length * world
            t1, mem1 = one_device(length)
            tw, tc, tcomm, hidden, memw = several(total)
            work_1, work_w = _flops(length, cfg), _flops(total, cfg)
            rows.append(dict(
                scaling=kind, world=world, total_tokens=total, tokens_per_device=total // world,
                t_one_device_s=t1, t_world_s=tw, t_compute_only_s=tc, t_comm_only_s=tcomm,
                speedup=t1 / tw if kind == "strong" else None,
                tokens_per_s_ratio=(total / tw) / (length / t1),
                work_efficiency=(work_w / tw) / (world * work_1 / t1),
                hidden_comm=hidden, peak_bytes_one_device=mem1, peak_bytes_per_rank=memw))
    if rank == 0:
        Path(results_path).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


class _FakeOut:
    """Runs the transfers of one forward + backward when its backward is called: lets
    _timed time T_comm with the same harness as the others."""

    def __init__(self, q, k, v, setup):
        self.args = (setup, k.detach(), v.detach())

    def backward(self, dout):
        _transfers_only(*self.args)


def _table(rows, backend):
    head = (f"{'scaling':7} {'W':>2} {'tokens':>7} {'per dev':>7} {'T1 ms':>9} {'TW ms':>9} "
            f"{'speedup':>7} {'tok/s x':>7} {'work eff':>8} {'hidden':>6} {'MiB/rank':>9} "
            f"{'MiB 1dev':>9}")
    lines = [f"context parallelism, {backend}", head, "-" * len(head)]
    for r in rows:
        speedup = f"{r['speedup']:.2f}" if r["speedup"] is not None else "-"
        lines.append(
            f"{r['scaling']:7} {r['world']:>2} {r['total_tokens']:>7} {r['tokens_per_device']:>7} "
            f"{1e3 * r['t_one_device_s']:>9.2f} {1e3 * r['t_world_s']:>9.2f} {speedup:>7} "
            f"{r['tokens_per_s_ratio']:>7.2f} {r['work_efficiency']:>8.2f} "
            f"{100 * r['hidden_comm']:>5.0f}% {r['peak_bytes_per_rank'] / 2**20:>9.1f} "
            f"{r['peak_bytes_one_device'] / 2**20:>9.1f}")
    return "\n".join(lines)


def _targets(rows) -> str:
    """Issue 27's targets, read off the rows (meaningful on NCCL): >= 1.8x one device for
    causal fwd+bwd at 64k tokens in total, and >= 90 % of the communication hidden. The
    issue says "at equal per-device length ... tokens/s": causal attention's work grows
    with the square of the length, so that is read here as the weak-scaling work
    efficiency x W (64k on W devices vs 64k / W on one), next to the strong speedup."""
    lines = []
    for r in rows:
        if r["total_tokens"] != 65536:
            continue
        if r["scaling"] == "strong":
            value, what = r["speedup"], "strong: 64k on W devices vs 64k on one"
        else:
            value = r["work_efficiency"] * r["world"]
            what = f"weak: 64k on W devices vs {r['tokens_per_device']} on one, work-normalised"
        lines.append(f"target >= 1.8x ({what}): {value:.2f}x "
                     f"{'PASS' if value >= 1.8 else 'FAIL'}; hidden communication "
                     f"{100 * r['hidden_comm']:.0f}% "
                     f"{'PASS' if r['hidden_comm'] >= 0.9 else 'FAIL'} (target >= 90%)")
    return "\n".join(lines) or "target rows (64k tokens in total) not in this run"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rotate", choices=("p2p", "allgather"), default="p2p")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.device_count() >= args.world else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < args.world:
        parser.error(f"--backend nccl needs {args.world} GPUs "
                     f"({torch.cuda.device_count()} visible)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"context-parallel-{backend}{'-' + args.tag if args.tag else ''}.json"
    scratch = out / f".{name}.rows"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.time()
    mp.start_processes(_rank_main, nprocs=args.world, join=True,
                       args=(args.world, port, backend, args, str(scratch)),
                       start_method="spawn")
    rows = json.loads(scratch.read_text())
    scratch.unlink()
    report = dict(backend=backend, world=args.world, rotate=args.rotate, quick=args.quick,
                  config={k: str(v) for k, v in CONFIGS[backend].items()},
                  torch=torch.__version__, host=platform.node(),
                  gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                  seconds=round(time.time() - started, 1), rows=rows)
    (out / name).write_text(json.dumps(report, indent=1))
    print(_table(rows, f"{backend}, {args.world} ranks, rotate={args.rotate}"))
    print(_targets(rows))
    print(f"wrote {out / name} ({report['seconds']} s)")


if __name__ == "__main__":
    main()
