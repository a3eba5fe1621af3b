"""``flash-cann demo``: forward + backward through torch.ops.flash_cann on the best
available device, checked against the float64 oracle, then timed and measured against
torch's own fused attention (``scaled_dot_product_attention``, the fastest reference
present) and against naive materialising attention, at a sequence length where the
difference shows."""

from __future__ import annotations

import math

import torch

from ..contract import ops, reference
from . import accuracy, memory
from ..api.interface import attention
from .timing import median_seconds

# Per device type: the dtype and the size of the speed/memory comparison.
SCALE_DEFAULTS = {
    "cpu": {"dtype": torch.float32, "batch": 1, "heads": 8, "seqlen": 4096, "head_dim": 64},
    "accelerator": {"dtype": torch.bfloat16, "batch": 1, "heads": 8, "seqlen": 16384,
                    "head_dim": 128},
}
REPEATS = 3


def _inputs(device_type: str, dtype: torch.dtype, batch: int, heads: int, seqlen: int,
            head_dim: int):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(batch, heads, seqlen, head_dim, generator=gen, dtype=dtype)
                 .to(device_type).requires_grad_() for _ in range(3))


def _flash_fwd_bwd(q, k, v):
    attention(q, k, v, causal=True).sum().backward()


def _sdpa_fwd_bwd(q, k, v):
    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()


def _naive_fwd_bwd(q, k, v):
    out, _ = reference.attention(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), causal=True,
                                 compute_dtype=q.dtype)
    out.sum().backward()


# What the demo measures, in order: ours, then the references it is compared with.
CONTENDERS = (("flash_cann", _flash_fwd_bwd),
              ("torch SDPA (fused)", _sdpa_fwd_bwd),
              ("naive (materialising)", _naive_fwd_bwd))


def check_accuracy(device: torch.device, dtype: torch.dtype, with_backward: bool = True) -> bool:
    """GQA (8 query heads, 2 kv heads), causal, key padding, seqlen_q != seqlen_k."""
    gen = torch.Generator().manual_seed(1)
    b, sq, sk, d = 2, 1000, 1200, 64
    q = torch.randn(b, sq, 8, d, generator=gen).to(device, dtype)
    k = torch.randn(b, sk, 2, d, generator=gen).to(device, dtype)
    v = torch.randn(b, sk, 2, d, generator=gen).to(device, dtype)
    mask = torch.ones(b, sk, dtype=torch.bool)
    mask[1, 900:] = False  # the second sequence is padded to 900 keys
    mask = mask.to(device)
    scale = 1.0 / math.sqrt(d)
    print(f"accuracy: batch {b}, heads 8 (kv 2), seqlen_q {sq}, seqlen_k {sk}, head_dim {d}, "
          f"{str(dtype).removeprefix('torch.')}, causal, key padding mask, layout BSND"
          f"{'' if with_backward else ', forward only'}; checking against the float64 "
          f"oracle...", flush=True)
    results = accuracy.check_against_oracle(
        lambda q_, k_, v_: attention(q_, k_, v_, layout="BSND", causal=True, scale=scale,
                                     key_padding_mask=mask, return_lse=True),
        q, k, v, scale=scale, causal=True, layout="BSND", key_padding_mask=mask,
        generator=gen, backward="full" if with_backward else "none")
    for r in results:
        print("  " + str(r))
    return all(r.ok for r in results)


def compare_with_references(device: torch.device, seqlen: int | None) -> None:
    cfg = dict(SCALE_DEFAULTS["cpu" if device.type == "cpu" else "accelerator"])
    if seqlen:
        cfg["seqlen"] = seqlen
    args = (device.type, cfg["dtype"], cfg["batch"], cfg["heads"], cfg["seqlen"],
            cfg["head_dim"])
    print(f"\nspeed and memory, forward + backward: batch {cfg['batch']}, heads "
          f"{cfg['heads']}, seqlen {cfg['seqlen']}, head_dim {cfg['head_dim']}, "
          f"{str(cfg['dtype']).removeprefix('torch.')}, causal (median of {REPEATS})",
          flush=True)
    rows = []
    for name, fn in CONTENDERS:
        print(f"  timing {name} ({REPEATS} runs after a warm-up) and measuring its peak "
              f"memory...", flush=True)
        try:
            seconds = median_seconds(fn, *_inputs(*args), device=device, repeats=REPEATS)
            peak = memory.peak_extra_bytes(device, _inputs, fn, args,
                                           warmup_args=(*args[:4], 256, args[5]))
        except torch.OutOfMemoryError:
            seconds, peak = float("nan"), float("inf")
        rows.append((name, seconds, peak))
    print(f"  {'':<24}{'time':>12}{'peak extra memory':>22}")
    for name, seconds, peak in rows:
        print(f"  {name:<24}{seconds:>10.3f} s{peak / 2**20:>18,.1f} MiB")
    (_, t_ours, m_ours), *references = rows
    for name, seconds, peak in references:
        print(f"  flash_cann vs {name}: {seconds / t_ours:.2f}x its speed (> 1: faster), "
              f"{m_ours / max(peak, 1):.2f}x its peak memory (< 1: less)")


class CannotRun(ValueError):
    """The demo cannot run as asked on this machine; the message says why, in one line."""


def _require_device(device_type: str) -> None:
    """Refuse a device type torch knows but sees none of (no GPU here), before any backend
    says what it would need; a device type torch does not know yet (npu without
    torch_npu) is left to the backend's own reason."""
    module = getattr(torch, device_type, None) if device_type != "cpu" else None
    if module is not None and hasattr(module, "is_available") and not module.is_available():
        raise CannotRun(f"there is no {device_type.upper()} device here "
                        f"(torch.{device_type}.is_available() is False); run on another with "
                        f"--device cpu, or --backend twin for the Ascend C kernel on the CPU")


def choose(device_type: str | None, backend: str | None):
    """(device type, backend spec) for ``--device`` / ``--backend`` (names the CLI has
    checked against the spec); raises CannotRun if they disagree or cannot run here."""
    if backend is not None:
        chosen = ops.SPEC.backends[backend]
        if device_type is not None and device_type not in chosen.device_types:
            raise CannotRun(f"--backend {backend} runs on device type(s) "
                            f"{', '.join(chosen.device_types)}, not --device {device_type}")
        device_type = device_type or chosen.device_type
    else:
        device_type = device_type or ops.best_device().type
        chosen = ops.backend_for(device_type)
    _require_device(device_type)
    reason = ops.unavailable_reason(chosen, device_type)
    if reason is not None:
        raise CannotRun(f"backend '{chosen.name}' (device type '{device_type}') cannot run "
                        f"here: {reason}")
    return device_type, chosen


def main(device: str | None = None, seqlen: int | None = None,
         backend: str | None = None) -> int:
    device_type, chosen = choose(device, backend)
    dev = torch.device(device_type)
    with ops.use_backend(chosen.name):
        print(f"flash-cann demo on {dev} (backend '{chosen.name}'), torch {torch.__version__}\n",
              flush=True)
        if chosen.name == "twin":
            # The Ascend C kernel on the CPU twin: a functional simulation, so check
            # accuracy in its NPU dtype; its speed says nothing about the NPU.
            ok = check_accuracy(dev, torch.bfloat16, with_backward=chosen.backward)
            print("  accuracy: " + ("PASS" if ok else "FAIL"))
            print("\n(no speed/memory comparison: the twin simulates the NPU kernel's API "
                  "calls on the CPU; its timings say nothing about the NPU)")
            return 0 if ok else 1
        dtype = SCALE_DEFAULTS["cpu" if dev.type == "cpu" else "accelerator"]["dtype"]
        ok = check_accuracy(dev, dtype, with_backward=chosen.backward)
        print("  accuracy: " + ("PASS" if ok else "FAIL"))
        compare_with_references(dev, seqlen)
        return 0 if ok else 1
