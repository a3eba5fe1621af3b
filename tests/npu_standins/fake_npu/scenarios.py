"""TEST-ONLY: drives flash_cann's NPU backend on the fake "npu" device and prints, as one
JSON object, what each call gave the (fake) aclnn library next to what Python passed.
Run by tests/test_npu_extension.py in a fresh process (it renames PrivateUse1 to "npu"),
with PYTHONPATH holding the fake torch_npu and the built extension, and:
  FAKE_TORCH_NPU_LIB, FAKE_ACLNN_LOG   see torch_npu/__init__.py and fake_cust_opapi.c
  (FAKE_NPU_CORE_CONTROL is set here for one call: see fake_torch_npu.cpp)
  ASCEND_CUSTOM_OPP_PATH               "<not an op library>:<fake op package>"
  BAD_LIBRARIES                        two files that are not the op package's library
"""

import dataclasses
import json
import os
import sys

import torch

import flash_cann  # before torch_npu: the NPU kernels must register lazily
from flash_cann.backends.npu import launcher as npu

LOG = os.environ["FAKE_ACLNN_LOG"]
open(LOG, "w").close()
results = {}


def log_lines():
    with open(LOG) as f:
        lines = [json.loads(line) for line in f]
    open(LOG, "w").close()
    return lines


def describe(t):
    return {"dims": list(t.shape), "strides": list(t.stride()), "offset": t.storage_offset(),
            "dtype": str(t.dtype), "data": t.untyped_storage().data_ptr(),
            "contiguous": t.is_contiguous(),
            "storage_elements": t.untyped_storage().nbytes() // t.element_size()}


def record(name, calls, **tensors):
    results[name] = {"log": log_lines(),
                     "tensors": {k: None if v is None else describe(v)
                                 for k, v in tensors.items()}, **calls}


def error_of(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 -- the message is what is tested
        return f"{type(err).__name__}: {err}"
    return None


# Before torch_npu is imported: import flash_cann must not have imported it.
results["imported_before"] = {"torch_npu": "torch_npu" in sys.modules}

import torch_npu  # noqa: E402,F401  (the fake; renames PrivateUse1 to "npu")

bad = os.environ["BAD_LIBRARIES"].split(":")
torch.ops.load_library(__import__("importlib").util.find_spec(npu.EXTENSION).origin)
results["bad_libraries"] = {"error": error_of(lambda: torch.ops.flash_cann_npu.load_opapi(bad))}

real_schema = npu.launcher_schema
npu.launcher_schema = lambda op: real_schema(op).replace("bool causal", "int causal")
results["stale_extension"] = {"reason": npu.unavailable_reason()}
npu.launcher_schema = real_schema
results["available"] = {"reason": npu.unavailable_reason(),
                        "loaded": torch.ops.flash_cann_npu.load_opapi([])}
log_lines()


def on_npu(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype).to("npu")


# Forward: BNSD GQA causal, through the public API (lazy registration of "npu").
q, k, v = on_npu(2, 4, 8, 16), on_npu(2, 2, 12, 16), on_npu(2, 2, 12, 16)
out, lse = flash_cann.attention(q, k, v, causal=True, scale=0.125, return_lse=True)
record("fwd_bnsd_gqa", {"attrs": {"scale": 0.125, "causal": True, "layout": "BNSD"}},
       query=q, key=k, value=v, key_padding_mask=None, out=out, softmax_lse=lse)

# Forward: K and V contiguous views of one stacked buffer (V at an offset): each reaches
# aclnn as a view of the whole storage, no copy.
q, kv = on_npu(2, 4, 8, 16), on_npu(2, 2, 2, 12, 16)
out, lse = flash_cann.attention(q, kv[0], kv[1], scale=0.125, return_lse=True)
record("fwd_kv_views", {"attrs": {"scale": 0.125, "causal": False, "layout": "BNSD"}},
       query=q, key=kv[0], value=kv[1], key_padding_mask=None, out=out, softmax_lse=lse)

# Forward: BSND, a strided q (slice of packed qkv) and a mask, bfloat16.
qkv = on_npu(2, 6, 3, 4, 8, dtype=torch.bfloat16)
mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]).to("npu")
out, lse = flash_cann.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], layout="BSND",
                                key_padding_mask=mask, scale=0.1, return_lse=True)
# 0.1 is not a float32: a float where aclnn takes a double would change it.
record("fwd_bsnd_strided_masked", {"attrs": {"scale": 0.1, "causal": False, "layout": "BSND"}},
       query=qkv[:, :, 0], key=qkv[:, :, 1], value=qkv[:, :, 2], key_padding_mask=mask,
       out=out, softmax_lse=lse)

# Forward: BSH with MQA (a BSND view of one kv head).
q, k, v = on_npu(1, 5, 4 * 8), on_npu(1, 7, 8), on_npu(1, 7, 8)
out = flash_cann.attention(q, k, v, layout="BSH", num_heads=4)
record("fwd_bsh_mqa", {"out_shape": list(out.shape)},
       query=q.unflatten(-1, (4, 8)), key=k.unflatten(-1, (1, 8)), value=v.unflatten(-1, (1, 8)))

# Forward with features through flash_attn_func (BSND, GQA): window, softcap and (nheads,)
# ALiBi slopes, which reach aclnn as the caller's (heads_q,) tensor itself (the checks'
# stride-0 expansion undone, no copy).
q, k, v = on_npu(2, 8, 4, 16), on_npu(2, 12, 2, 16), on_npu(2, 12, 2, 16)
slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).to("npu")
out = flash_cann.flash_attn_func(q, k, v, softmax_scale=0.25, window_size=(3, 1), softcap=20.0,
                                 alibi_slopes=slopes)
record("fwd_window_softcap_alibi",
       {"attrs": {"scale": 0.25, "causal": False, "layout": "BSND", "window_left": 3,
                  "window_right": 1, "softcap": 20.0, "dropout_p": 0.0}},
       query=q, key=k, value=v, key_padding_mask=None, alibi_slopes=slopes, rng_state=None,
       sinks=None)

# The op itself (BNSD, causal): (batch, heads_q) slopes, dropout with its rng_state, a left
# window, sinks; causal is the right bound, so window_right reaches aclnn as -1.
q, k, v = on_npu(2, 4, 8, 16), on_npu(2, 4, 8, 16), on_npu(2, 4, 8, 16)
slopes = torch.rand(2, 4).to("npu")
rng_state = torch.tensor([1234, 8], dtype=torch.int64).to("npu")
sinks = torch.randn(4).to("npu")
out, lse = torch.ops.flash_cann.fwd(q, k, v, None, 0.25, causal=True, alibi_slopes=slopes,
                                    rng_state=rng_state, sinks=sinks, window_left=5,
                                    window_right=2, dropout_p=0.1)
record("fwd_batch_alibi_dropout",
       {"attrs": {"scale": 0.25, "causal": True, "layout": "BNSD", "window_left": 5,
                  "window_right": -1, "softcap": 0.0, "dropout_p": 0.1}},
       query=q, key=k, value=v, key_padding_mask=None, alibi_slopes=slopes,
       rng_state=rng_state, sinks=sinks, out=out, softmax_lse=lse)

# The decode op, vLLM's call shape (the cache written beforehand): paged, GQA, causal, a
# window and softcap; the kernel gets key = value = None and the lengths the contract
# computed on the device, never read on the host.
q = on_npu(2, 1, 4, 16)
kc, vc = on_npu(6, 16, 2, 16), on_npu(6, 16, 2, 16)
lengths = torch.tensor([20, 7], dtype=torch.int32).to("npu")
table = torch.tensor([[3, 1, 5], [0, 2, 4]], dtype=torch.int32).to("npu")
out, lse = torch.ops.flash_cann.fwd_kvcache(q, kc, vc, None, None, lengths, None, table, None,
                                            0.25, True, window_left=9, softcap=12.0,
                                            num_splits=3)
record("kvcache_paged", {"attrs": {"scale": 0.25, "causal": True, "layout": "BSND",
                                   "window_left": 9, "window_right": -1, "softcap": 12.0,
                                   "num_splits": 3}},
       query=q, k_cache=kc, v_cache=vc, key=None, value=None, cache_batch_idx=None,
       block_table=table, cache_leftpad=None, alibi_slopes=None, sinks=None, out=out,
       softmax_lse=lse)

# Packed sequences (vLLM's prefill: flash_attn_varlen_func, TND): cu_seqlens_q/k reach
# aclnn as the caller's int32 device tensors, max_seqlen_q/k as attributes, lse (heads_q,
# tokens_q); the backward gets the same tensors. Nothing is read on the host.
q = on_npu(9, 4, 16).requires_grad_()
k, v = on_npu(12, 2, 16).requires_grad_(), on_npu(12, 2, 16).requires_grad_()
cu_q = torch.tensor([0, 4, 4, 9], dtype=torch.int32).to("npu")
cu_k = torch.tensor([0, 5, 6, 12], dtype=torch.int32).to("npu")
out = flash_cann.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 6, softmax_scale=0.25,
                                        causal=True)
record("fwd_varlen", {"attrs": {"scale": 0.25, "causal": True, "layout": "TND",
                                "max_seqlen_q": 5, "max_seqlen_k": 6}},
       query=q, key=k, value=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
out.sum().backward()
record("bwd_varlen", {"attrs": {"layout": "TND", "max_seqlen_q": 5, "max_seqlen_k": 6}},
       cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)

# Backward through autograd: torch.ops.flash_cann.bwd on NPU tensors reaches the Grad
# kernel's aclnn API. First loss.backward() through flash_attn_func (BSND, GQA,
# deterministic=True carried from the forward call to the Grad op).
q = on_npu(1, 4, 4, 8).requires_grad_()
k, v = on_npu(1, 6, 2, 8).requires_grad_(), on_npu(1, 6, 2, 8).requires_grad_()
log_lines()
out = flash_cann.flash_attn_func(q, k, v, causal=True, softmax_scale=0.5, deterministic=True)
out.sum().backward()
record("bwd_loss_backward",
       {"attrs": {"scale": 0.5, "causal": True, "layout": "BSND", "deterministic": True}},
       query=q, key=k, value=v, out=out, key_padding_mask=None, grad_softmax_lse=None,
       grad_query=q.grad, grad_key=k.grad, grad_value=v.grad)

# Then both outputs' gradients (BNSD, masked, grad_softmax_lse fed), deterministic off.
q, k, v = (on_npu(1, 2, 4, 8).requires_grad_(), on_npu(1, 2, 6, 8).requires_grad_(),
           on_npu(1, 2, 6, 8).requires_grad_())
mask = torch.tensor([[True] * 5 + [False]]).to("npu")
out, lse = flash_cann.attention(q, k, v, causal=True, scale=0.5, key_padding_mask=mask,
                                return_lse=True)
grad_out, grad_lse = on_npu(*out.shape), on_npu(*lse.shape, dtype=torch.float32)
log_lines()
dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse), retain_graph=True)
record("bwd_autograd",
       {"attrs": {"scale": 0.5, "causal": True, "layout": "BNSD", "deterministic": False}},
       grad_out=grad_out, query=q, key=k, value=v, out=out, softmax_lse=lse,
       key_padding_mask=mask, grad_softmax_lse=grad_lse, grad_query=dq, grad_key=dk,
       grad_value=dv)

# loss.backward() with every feature: the Grad op gets the forward's feature arguments,
# the same rng_state tensor (the mask is regenerated from it, never stored) and the sinks,
# and writes grad_sinks, which autograd hands to the sinks.
# (Names of their own: the failure cases below reuse the tensors above.)
fq = on_npu(1, 6, 4, 8).requires_grad_()
fk, fv = on_npu(1, 6, 2, 8).requires_grad_(), on_npu(1, 6, 2, 8).requires_grad_()
slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625]).to("npu")
fsinks = torch.randn(4).to("npu").requires_grad_()
log_lines()
rng_state = torch.tensor([99, 0], dtype=torch.int64).to("npu")
fout, _ = torch.ops.flash_cann.fwd(fq, fk, fv, None, 0.5, True, "BSND", alibi_slopes=slopes,
                                   rng_state=rng_state, sinks=fsinks, window_left=2,
                                   window_right=0, softcap=10.0, dropout_p=0.2)
fout.sum().backward()
log = log_lines()
forward_call = next(c for c in log if c["call"] == "aclnnFlashCannAttentionGetWorkspaceSize")
results["bwd_features"] = {
    "log": log, "forward_rng_state": forward_call["rng_state"],
    "attrs": {"scale": 0.5, "causal": True, "layout": "BSND", "deterministic": False,
              "window_left": 2, "window_right": -1, "softcap": 10.0, "dropout_p": 0.2},
    "tensors": {"alibi_slopes": describe(slopes), "sinks": describe(fsinks)},
    "sinks_grad": None if fsinks.grad is None else list(fsinks.grad.shape)}

# A failing Grad call is explained as the forward's are, at either stage.
for name, fail in [("bwd_stage1_561002", "aclnnFlashCannAttentionGradGetWorkspaceSize=561002"),
                   ("bwd_stage2_561003", "aclnnFlashCannAttentionGrad=561003")]:
    os.environ["FAKE_ACLNN_FAIL"] = fail
    results[name] = {"error": error_of(lambda: torch.autograd.grad(
        (out, lse), (q, k, v), (grad_out, grad_lse), retain_graph=True)), "log": log_lines()}
os.environ.pop("FAKE_ACLNN_FAIL")

# A spec whose npu backend has no backward kernel refuses before reaching aclnn.
spec = flash_cann.contract.spec.load()
spec.backends["npu"] = dataclasses.replace(spec.backends["npu"], backward=False)
results["bwd_refused"] = {"error": error_of(
    lambda: torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse))),
    "log": log_lines()}
spec.backends["npu"] = dataclasses.replace(spec.backends["npu"], backward=True)

# torch_npu's core control on: each aclnn stage runs after its thread took the stream's
# resources (op-plugin's EXEC_NPU_CMD pattern).
os.environ["FAKE_NPU_CORE_CONTROL"] = "1"
q, k, v = on_npu(1, 2, 4, 8), on_npu(1, 2, 4, 8), on_npu(1, 2, 4, 8)
log_lines()
torch.ops.flash_cann.fwd(q, k, v, None, 0.25)
results["core_control"] = {"log": log_lines()}
os.environ["FAKE_ACLNN_FAIL"] = "aclrtUseStreamResInCurrentThread=107002"
results["core_control_failing"] = {
    "error": error_of(lambda: torch.ops.flash_cann.fwd(q, k, v, None, 0.25)), "log": log_lines()}
os.environ.pop("FAKE_ACLNN_FAIL")
for stage in ("enqueue", "dequeue"):  # only one of the two checks says yes
    os.environ["FAKE_NPU_CORE_CONTROL"] = stage
    torch.ops.flash_cann.fwd(q, k, v, None, 0.25)
    results[f"core_control_{stage}"] = {"log": log_lines()}
os.environ.pop("FAKE_NPU_CORE_CONTROL")

# Every non-zero status is an exception that says what it means.
q, k, v = on_npu(2, 4, 8, 16), on_npu(2, 2, 12, 16), on_npu(2, 2, 12, 16)
for name, fail in [("stage1_161002", "aclnnFlashCannAttentionGetWorkspaceSize=161002"),
                   ("stage2_561003", "aclnnFlashCannAttention=561003"),
                   ("stage1_unknown", "aclnnFlashCannAttentionGetWorkspaceSize=4242")]:
    os.environ["FAKE_ACLNN_FAIL"] = fail
    results[name] = {"error": error_of(lambda: torch.ops.flash_cann.fwd(q, k, v, None, 0.25)),
                     "log": log_lines()}
os.environ.pop("FAKE_ACLNN_FAIL")
results["strided_output"] = {"error": error_of(lambda: torch.ops.flash_cann_npu.fwd(
    q, k, v, None, None, None, None, None, None, 0.25, False, "BNSD", 0, 0, -1, -1, 0.0, 0.0, False,
    on_npu(2, 16, 8, 4).transpose(1, 3), on_npu(2, 4, 8, dtype=torch.float32)))}

print(json.dumps(results))
