"""Helpers for tests/test_package.py: a test-only package build with stand-in files, opp trees
to install into, tree snapshots, and running the .run / uninstall.sh.

The stand-in build goes through the same code as the CANN build: op_project/cmake/payload.cmake
(flash_cann_payload_add, target `package`) -> stage_payload.py -> make_run.py. Only the input files
differ: every stand-in says in its content that it is one, and the package's compiler version
reads "test stand-in".
"""

from __future__ import annotations

import os
import platform
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACK_DIR = REPO / "op_project" / "scripts" / "pack"
PAYLOAD_CMAKE = REPO / "op_project" / "cmake" / "payload.cmake"
VENDOR = "flash_cann"
SOCS = ("ascend910b", "ascend910_93")
ARCH = platform.machine()
STANDIN_COMPILER_VERSION = "test stand-in, not built with CANN"
UNPRIVILEGED = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--")


def standin(path: Path, what: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"TEST STAND-IN for {what}: not a CANN build output\n")
    return path


def make_standin_build(root: Path) -> list[tuple[str, Path]]:
    """Stand-ins for what the CANN build produces, as (payload role, path) pairs, named like the
    real outputs (CANN's msOpGen projects, asc-devkit's fwk_modules)."""
    entries = [
        ("op_api_lib", standin(root / "libcust_opapi.so", "the aclnn API library")),
        ("op_api_header", standin(root / "autogen/aclnn_flash_cann_attention.h", "an aclnn header")),
        ("op_api_header", standin(root / "autogen/aclnn_flash_cann_attention_grad.h", "an aclnn header")),
        ("op_proto_lib", standin(root / "libcust_opsproto_rt2.0.so", "the op prototype library")),
        ("op_proto_header", standin(root / "autogen/op_proto.h", "the op prototype header")),
        ("op_tiling_lib", standin(root / "libcust_opmaster_rt2.0.so", "the tiling library")),
        ("framework@tensorflow", standin(root / "npu_supported_ops.json", "the supported-ops list")),
    ]
    kernel = root / "kernel"
    for soc in SOCS:
        entries.append((f"ops_info@{soc}", standin(kernel / f"tbe/{soc}/aic-{soc}-ops-info.json",
                                                   "an ops-info file")))
        for op, op_type in (("flash_cann_attention", "FlashCannAttention"),
                            ("flash_cann_attention_grad", "FlashCannAttentionGrad")):
            for suffix in (".o", ".json"):
                standin(kernel / f"binary/{soc}/{op}/{op_type}_standin{suffix}", "a kernel binary")
            standin(kernel / f"binary/config/{soc}/{op}.json", "a kernel selection table")
        standin(kernel / f"binary/config/{soc}/binary_info_config.json", "a kernel selection table")
        entries += [(f"kernel_binaries@{soc}", kernel / f"binary/{soc}"),
                    (f"kernel_config@{soc}", kernel / f"binary/config/{soc}")]
    for name in ("flash_cann_attention.cpp", "flash_cann_attention_grad.cpp", "flash_cann_tiling.h"):
        standin(kernel / "binary/dynamic" / name, "a kernel source")
    entries.append(("kernel_source", kernel / "binary/dynamic"))
    return entries


def build_standin_package(root: Path) -> Path:
    """Builds the stand-in .run with CMake through payload.cmake, as cann.cmake does."""
    adds = "\n".join(f"flash_cann_payload_add({role} [==[{path}]==])"
                     for role, path in make_standin_build(root / "standins"))
    project = root / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(f"""\
cmake_minimum_required(VERSION 3.16)
project(flash_cann_standin_package NONE)
include([==[{PAYLOAD_CMAKE}]==])
{adds}
flash_cann_add_package(VENDOR {VENDOR} COMPUTE_UNITS {';'.join(SOCS)} KERNEL_PACKAGES binary source
                       COMPILER_VERSION "{STANDIN_COMPILER_VERSION}")
""")
    build = root / "build"
    for command in (["cmake", "-S", project, "-B", build, f"-DPython3_EXECUTABLE={sys.executable}"],
                    ["cmake", "--build", build, "--target", "package"]):
        subprocess.run([str(part) for part in command], check=True, capture_output=True)
    (run_file,) = build.glob("custom_opp_*.run")
    return run_file


def make_opp(root: Path, config_ini: str | None = "load_priority=other_vendor,customize\n",
             vendors_dir: bool = True) -> Path:
    """A CANN opp tree that already holds another vendor (and a config.ini listing it)."""
    (root / "built-in" / "op_impl").mkdir(parents=True)
    (root / "built-in" / "op_impl" / "placeholder").write_text("CANN's own operators\n")
    if vendors_dir:
        other = root / "vendors" / "other_vendor" / "op_api" / "lib"
        other.mkdir(parents=True)
        (other / "libcust_opapi.so").write_text("another vendor's library\n")
        if config_ini is not None:
            (root / "vendors" / "config.ini").write_bytes(config_ini.encode())
    return root


def snapshot(root: Path) -> dict:
    """Everything under root: type, permissions and bytes (or link target) of each entry."""
    entries = {}
    for path in sorted([root, *root.rglob("*")]):
        info = path.lstat()
        key = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            entries[key] = ("link", os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            entries[key] = ("dir", stat.S_IMODE(info.st_mode))
        else:
            entries[key] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
    return entries


def run(command, *, opp: Path | None = None, cwd: Path | None = None, unprivileged=False,
        extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs a .run or uninstall.sh with ASCEND_OPP_PATH=opp (unset when None)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("ASCEND_OPP_PATH", "ASCEND_CUSTOM_OPP_PATH")}
    if opp is not None:
        env["ASCEND_OPP_PATH"] = str(opp)
    env.update(extra_env or {})
    command = [str(part) for part in command]
    if unprivileged:
        command = [*UNPRIVILEGED, *command]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=3600)


def installed_payload(run_file: Path, into: Path) -> Path:
    """The vendor tree of run_file's payload, unpacked with --extract (to compare installs with)."""
    into.mkdir()
    result = run([run_file, f"--extract={into}"])
    assert result.returncode == 0, result.stderr
    return into / "packages" / "vendors" / VENDOR
