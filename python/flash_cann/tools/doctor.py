"""``flash-cann doctor``: what an Ascend server has of what flash-cann's NPU path needs.

Each check reports ``ok``, ``fail`` or ``skip`` (it needs something that failed before it),
a detail line (versions, paths, what was found) and, when it fails, what to do. Then, when
the NPU backend can run, a short smoke on the NPU: forward and backward of each feature,
decode over a paged cache and a packed (TND) batch, each against the CPU backend, with the
max absolute error. ``--json`` prints the same as one JSON object. The exit status is 0 when
every check and smoke case passed, 1 otherwise: it is the report to paste into a bug report.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import importlib
import importlib.util
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Callable, Mapping

OK, FAIL, SKIP = "ok", "fail", "skip"


@dataclasses.dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def _first_line_with(path: Path, key: str) -> str | None:
    try:
        for line in path.read_text(errors="replace").splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == key:
                return value.strip()
    except OSError:
        return None
    return None


def cann_version(home: Path) -> str | None:
    """The toolkit's version as its install info files state it."""
    for info in [home / "version.cfg", *sorted(home.glob("*-linux/ascend_toolkit_install.info")),
                 home / "ascend_toolkit_install.info"]:
        for key in ("version", "Version", "toolkit_version"):
            value = _first_line_with(info, key)
            if value:
                return value.strip("[]\"'")
    return None


SET_ENV = "source /usr/local/Ascend/ascend-toolkit/set_env.sh (CANN 8.3 or later; docs/npu.md)"


def check_cann(environ: Mapping[str, str]) -> list[Check]:
    checks = []
    home_text = environ.get("ASCEND_HOME_PATH") or environ.get("ASCEND_TOOLKIT_HOME")
    if not home_text:
        checks.append(Check("cann toolkit", FAIL, "neither ASCEND_HOME_PATH nor "
                            "ASCEND_TOOLKIT_HOME is set", SET_ENV))
    elif not Path(home_text).is_dir():
        checks.append(Check("cann toolkit", FAIL, f"ASCEND_HOME_PATH={home_text} is not a "
                            "directory", SET_ENV))
    else:
        home = Path(home_text)
        version = cann_version(home)
        checks.append(Check("cann toolkit", OK if version else FAIL,
                            f"ASCEND_HOME_PATH={home}, version {version or 'unknown'}",
                            "" if version else f"no version.cfg or ascend_toolkit_install.info "
                            f"under {home}: reinstall the CANN toolkit"))
        compilers = [p for p in (home / "compiler" / "ccec_compiler" / "bin" / "ccec",
                                 home / "compiler" / "ccec_compiler" / "bin" / "bisheng")
                     if p.is_file()]
        compilers += [Path(p) for p in filter(None, (shutil.which("ccec", path=environ.get("PATH")),))]
        checks.append(Check("cann compiler", OK if compilers else FAIL,
                            str(compilers[0]) if compilers else f"no ccec under {home}/compiler",
                            "" if compilers else "install the CANN toolkit with its compiler "
                            "(the Ascend C kernels are built with ccec): " + SET_ENV))
    driver = Path(environ.get("ASCEND_DRIVER_PATH", "/usr/local/Ascend/driver"))
    driver_version = _first_line_with(driver / "version.info", "Version")
    checks.append(Check("npu driver", OK if driver_version else FAIL,
                        f"{driver}: version {driver_version}" if driver_version
                        else f"no {driver / 'version.info'}",
                        "" if driver_version else "install the Ascend NPU driver and firmware "
                        "(npu-smi info must list the cards); set ASCEND_DRIVER_PATH if it is "
                        "elsewhere"))
    devices = sorted(glob.glob(environ.get("FLASH_CANN_DOCTOR_DEVICES", "/dev/davinci[0-9]*")))
    visible = environ.get("ASCEND_RT_VISIBLE_DEVICES")
    checks.append(Check("visible npus", OK if devices else FAIL,
                        f"{len(devices)} device node(s) {', '.join(devices)}"
                        + (f"; ASCEND_RT_VISIBLE_DEVICES={visible}" if visible is not None else ""),
                        "" if devices else "no /dev/davinci* device: run on an Ascend server "
                        "(in a container, pass the /dev/davinci*, davinci_manager, devmm_svm and "
                        "hisi_hdc devices through)"))
    return checks


def _version(module) -> str:
    return str(getattr(module, "__version__", "unknown"))


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def check_frameworks() -> tuple[list[Check], object | None]:
    import torch

    from ..backends.npu import launcher

    checks = [Check("torch", OK, f"torch {torch.__version__}")]
    try:
        torch_npu = launcher._import_torch_npu()
    except launcher._Missing as missing:
        checks.append(Check("torch_npu", FAIL, str(missing).split(":")[0],
                            launcher._install_hint()))
        checks.append(Check("torchair", SKIP, "needs torch_npu"))
        return checks, None
    npu_version = _version(torch_npu)
    match = _major_minor(npu_version) == _major_minor(torch.__version__)
    checks.append(Check("torch_npu", OK if match else FAIL,
                        f"torch_npu {npu_version} ({'matches' if match else 'does not match'} "
                        f"torch {torch.__version__})",
                        "" if match else f"install the torch_npu release for torch "
                        f"{_major_minor(torch.__version__)} (torch_npu's version table), then "
                        "rebuild the extension: pip install --no-build-isolation ./framework"))
    try:
        torchair = importlib.import_module("torchair")
        getattr(torchair, "get_npu_backend")
        checks.append(check_torchair_origin(torchair, torch_npu))
    except Exception as err:  # torchair raises more than ImportError without CANN
        checks.append(Check("torchair", FAIL, f"{type(err).__name__}: {err}",
                            "torchair ships with torch_npu (torch_npu/dynamo/torchair): "
                            "reinstall the matching torch_npu; graph mode needs it"))
    return checks, torch_npu


def check_torchair_origin(torchair, torch_npu) -> Check:
    """torchair matches torch_npu when it is the copy torch_npu ships: the module
    torch_npu.dynamo.torchair, which torch_npu's lazy ``sys.modules["torchair"]`` loads;
    a separate install must have been built for this torch_npu, which nothing here can
    tell, so it fails with what to do."""
    where = Path(getattr(torchair, "__file__", "") or "?").resolve()
    bundled = Path(getattr(torch_npu, "__file__", "") or "?").resolve().parent / "dynamo" / "torchair"
    name = str(getattr(torchair, "__name__", ""))
    if name == "torch_npu.dynamo.torchair" or bundled in where.parents:
        return Check("torchair", OK, f"torchair {_version(torchair)}, the copy torch_npu "
                     f"{_version(torch_npu)} ships ({where})")
    return Check("torchair", FAIL, f"torchair {_version(torchair)} from {where}, not the copy "
                 f"torch_npu {_version(torch_npu)} ships ({bundled}): its match with this "
                 "torch_npu cannot be checked",
                 "uninstall the separate torchair (pip uninstall torchair) to use torch_npu's, "
                 "or build torchair for exactly this torch_npu")


def _vendor_dir(library: str) -> Path:
    return Path(library).parents[2]  # <vendor>/op_api/lib/libcust_opapi.so


def check_op_package(environ: Mapping[str, str]) -> list[Check]:
    from ..backends.npu import aclnn, opp_paths
    from ..contract.spec import load

    spec = load()
    hint = spec.backends["npu"].install_hint
    found = opp_paths.candidates(environ)
    if not found:
        return [Check("op package", FAIL, f"no libcust_opapi.so "
                      f"({opp_paths.describe_search(environ)})", hint),
                Check("op package aclnn symbols", SKIP, "needs the op package"),
                Check("op package op proto", SKIP, "needs the op package")]
    names = [n for op in aclnn.required_ops(spec)
             for n in (aclnn.aclnn_api(op).get_workspace_size, aclnn.aclnn_api(op).execute)]
    ours, reasons = None, []
    for library in found:
        try:
            handle = ctypes.CDLL(library)
        except OSError as err:
            reasons.append(f"{library}: does not load ({err})")
            continue
        missing = [n for n in names if not hasattr(handle, n)]
        if missing:
            reasons.append(f"{library}: another vendor's (lacks {', '.join(missing)})")
        else:
            ours = library
            break
    checks = [Check("op package", OK if ours else FAIL,
                    f"vendor dir {_vendor_dir(ours)}" if ours else "; ".join(reasons), "" if ours
                    else hint)]
    if not ours:
        checks += [Check("op package aclnn symbols", SKIP, "needs the op package"),
                   Check("op package op proto", SKIP, "needs the op package")]
        return checks
    checks.append(Check("op package aclnn symbols", OK, f"{', '.join(names)} in {ours}"))
    proto = sorted((_vendor_dir(ours) / "op_proto").glob("lib/linux/*/libcust_opsproto_rt2.0.so"))
    checks.append(Check("op package op proto", OK if proto else FAIL,
                        str(proto[0]) if proto else f"no op_proto/lib/linux/<arch>/"
                        f"libcust_opsproto_rt2.0.so under {_vendor_dir(ours)}",
                        "" if proto else "graph mode (torchair/GE) needs the op prototypes: "
                        "reinstall the .run package (docs/packaging.md)"))
    return checks


def check_extension() -> tuple[Check, object | None]:
    from ..backends.npu import launcher

    try:
        launchers = launcher._load_extension()
    except launcher._Missing as missing:
        return Check("npu extension", FAIL, str(missing).split(": build it")[0],
                     launcher.BUILD_HINT), None
    origin = importlib.util.find_spec(launcher.EXTENSION).origin
    return Check("npu extension", OK, f"{origin} loads against this torch/torch_npu and its "
                 "launcher schemas match the op spec"), launchers


def extension_installed() -> Check:
    """Without torch_npu the extension cannot load; whether it is installed still shows."""
    from ..backends.npu import launcher

    try:
        spec = importlib.util.find_spec(launcher.EXTENSION)
    except ImportError:
        spec = None
    if spec is None or spec.origin is None:
        return Check("npu extension", FAIL, f"{launcher.EXTENSION} is not installed",
                     launcher.BUILD_HINT)
    return Check("npu extension", SKIP, f"installed at {spec.origin}; loading it needs "
                 "torch_npu seeing an NPU")


def check_soc(torch_npu) -> tuple[list[Check], str | None]:
    from ..ascend import planner

    soc = None
    if torch_npu is not None:
        try:
            soc = str(torch_npu.npu.get_device_name(0))
        except Exception as err:
            return [Check("soc", FAIL, f"torch_npu.npu.get_device_name(0): {err}",
                          "check `npu-smi info`")], None
    if soc is None:
        return [Check("soc", SKIP, "needs torch_npu seeing an NPU"),
                Check("plan", SKIP, "needs the SoC")], None
    checks = [Check("soc", OK, soc)]
    try:
        p = planner.plan(soc, 1, 16, 4096, 128, dtype="float16", layout="BNSD", causal=True)
    except Exception as err:  # an unknown SoC, the planner refusing, a native build failure
        checks.append(Check("plan", FAIL, f"{type(err).__name__}: {err}",
                            "flash-cann's kernels are defined for ascend910b and ascend910_93 "
                            "SoCs; `flash-cann plan --soc SOC --shape 1,16,4096,128 --causal` "
                            "shows the planner's reason"))
        return checks, None
    summary = {k: p[k] for k in ("block_dim", "tiling_key") if k in p}
    predicted = (p.get("prediction") or {}).get("time_us")
    checks.append(Check("plan", OK, f"1x16x4096x128 fp16 causal on {soc}: {summary}"
                        + (f", predicted {predicted:.1f} us" if predicted else "")))
    return checks, soc


@dataclasses.dataclass
class SmokeCase:
    name: str
    run: Callable  # (device) -> list of tensors, compared position by position
    tolerance: float
    features: tuple = ()  # the spec's feature names the case exercises


def _smoke_cases() -> list[SmokeCase]:
    import torch

    import flash_cann

    def inputs(device, b=1, s=128, h=2, hk=2, d=64, grad=True):
        g = torch.Generator().manual_seed(0)
        make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float32)
        q, k, v = make(b, s, h, d), make(b, s, hk, d), make(b, s, hk, d)
        return [t.to(device=device, dtype=torch.float16).requires_grad_(grad) for t in (q, k, v)]

    def fwd_bwd(hk=2, alibi=False, sinks=False, **kwargs):
        def run(device):
            q, k, v = inputs(device, hk=hk)
            extra = dict(kwargs)
            if alibi:
                extra["alibi_slopes"] = torch.tensor([0.5, 0.25], device=device)
            if sinks:
                extra["sinks"] = torch.tensor([0.5, -1.0], device=device).requires_grad_()
            out = flash_cann.flash_attn_func(q, k, v, **extra)
            out.float().pow(2).sum().backward()
            return [out, q.grad, k.grad, v.grad] + ([extra["sinks"].grad] if sinks else [])
        return run

    def dropout(device):
        # The op itself, with the same (seed, offset) on both devices: the kernel draws
        # contract.variant.keep_mask's Philox mask, which the cpu backend also follows, so
        # the two keep the same probabilities. (flash_attn_func draws the seed from the
        # device's own generator, which differs between devices.)
        q, k, v = inputs(device)
        rng_state = torch.tensor([1234, 0], dtype=torch.int64, device=device)
        out, _ = torch.ops.flash_cann.fwd(q, k, v, None, 0.125, layout="BSND",
                                          rng_state=rng_state, dropout_p=0.25)
        out.float().pow(2).sum().backward()
        return [out, q.grad, k.grad, v.grad]

    def decode(device):
        g = torch.Generator().manual_seed(1)
        q = torch.randn(2, 1, 2, 64, generator=g).half().to(device)
        k_cache = torch.randn(4, 128, 2, 64, generator=g).half().to(device)
        v_cache = torch.randn(4, 128, 2, 64, generator=g).half().to(device)
        block_table = torch.tensor([[0, 2], [3, 1]], dtype=torch.int32, device=device)
        seqlens = torch.tensor([200, 77], dtype=torch.int32, device=device)
        return [flash_cann.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                   block_table=block_table, causal=True)]

    def tnd(device):
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(160, 2, 64, generator=g).half().to(device).requires_grad_()
                   for _ in range(3))
        cu = torch.tensor([0, 100, 160], dtype=torch.int32, device=device)
        out = flash_cann.flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, causal=True)
        out.float().pow(2).sum().backward()
        return [out, q.grad, k.grad, v.grad]

    tol = 2e-2  # fp16 inputs, fp32 accumulation on both sides; outputs and grads are O(1)
    return [SmokeCase("plain fwd+bwd", fwd_bwd(), tol),
            SmokeCase("causal fwd+bwd", fwd_bwd(causal=True), tol),
            SmokeCase("window fwd+bwd", fwd_bwd(window_size=(32, 0)), tol, ("window",)),
            SmokeCase("softcap fwd+bwd", fwd_bwd(softcap=30.0), tol, ("softcap",)),
            SmokeCase("alibi fwd+bwd", fwd_bwd(causal=True, alibi=True), tol, ("alibi",)),
            SmokeCase("dropout fwd+bwd", dropout, tol, ("dropout",)),
            SmokeCase("sinks fwd+bwd", fwd_bwd(sinks=True), tol, ("sinks",)),
            SmokeCase("gqa fwd+bwd", fwd_bwd(hk=1), tol),
            SmokeCase("decode paged", decode, tol, ("kvcache",)),
            SmokeCase("tnd fwd+bwd", tnd, tol, ("varlen",))]


def smoke(device: str = "npu") -> list[Check]:
    checks = []
    for case in _smoke_cases():
        try:
            got = [t.detach().float().cpu() for t in case.run(device)]
            want = [t.detach().float() for t in case.run("cpu")]
            errors = [(g - w).abs().max().item() if g.shape == w.shape else float("inf")
                      for g, w in zip(got, want)]
            worst = max(errors)
            ok = worst <= case.tolerance  # NaN compares False: a failure
            checks.append(Check(f"smoke {case.name}", OK if ok else FAIL,
                                f"max |npu - cpu| {', '.join(f'{e:.3g}' for e in errors)} "
                                f"(tolerance {case.tolerance})",
                                "" if ok else "a wrong result on this NPU: paste this report "
                                "into an issue"))
        except Exception as err:
            checks.append(Check(f"smoke {case.name}", FAIL, f"{type(err).__name__}: {err}",
                                "paste this report into an issue"))
    return checks


def diagnose(environ: Mapping[str, str] = os.environ) -> list[Check]:
    checks = [Check("python", OK, f"{sys.version.split()[0]} on {platform.machine()}")]
    checks += check_cann(environ)
    framework_checks, torch_npu = check_frameworks()
    checks += framework_checks
    if torch_npu is not None and not torch_npu.npu.is_available():
        checks.append(Check("npu seen by torch_npu", FAIL, "torch_npu.npu.is_available() is "
                            "False", "check `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES"))
        torch_npu = None
    checks += check_op_package(environ)
    if torch_npu is not None:
        checks.append(check_extension()[0])
    else:
        checks.append(extension_installed())
    soc_checks, _ = check_soc(torch_npu)
    checks += soc_checks
    from ..backends.npu import launcher
    reason = launcher.unavailable_reason() if torch_npu is not None else "no NPU"
    if reason is None:
        checks += smoke("npu")
    else:
        checks.append(Check("smoke", SKIP, f"the NPU backend cannot run: {reason}"))
    return checks


def report(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"[{c.status:>4}] {c.name:<{width}}  {c.detail}")
        if c.status == FAIL and c.fix:
            lines.append(f"       {'':<{width}}  fix: {c.fix}")
    failed = [c.name for c in checks if c.status == FAIL]
    lines.append(f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed
                 else "every check passed")
    return "\n".join(lines)


def main(as_json: bool = False, environ: Mapping[str, str] = os.environ) -> int:
    checks = diagnose(environ)
    failed = any(c.status == FAIL for c in checks)
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [dataclasses.asdict(c) for c in checks]},
                         indent=1))
    else:
        print(report(checks))
    return 1 if failed else 0
