"""Build flash-cann's NPU extension, ``flash_cann_npu``, on an Ascend server.

It needs what running it needs: CANN (``source .../set_env.sh``), torch and a matching
torch_npu importable in this Python, and this repository (the op spec and the
``flash_cann`` sources next to this directory). From the repository root::

    pip install --no-build-isolation ./framework                  # into this environment
    pip wheel --no-build-isolation --no-deps -w build_out ./framework   # a wheel to ship

``--no-build-isolation`` keeps the torch / torch_npu of this environment: the extension
must be compiled against the ones it will run with. Build files go to ``build/framework``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BUILD = REPO / "build" / "framework"


def _flash_cann():
    """The flash_cann package of this repository (not an installed one): the extension is
    generated from the spec it ships."""
    sources = REPO / "python"
    if not (sources / "flash_cann" / "backends" / "npu" / "aclnn.py").is_file():
        sys.exit(f"framework/setup.py: flash_cann sources not found in {sources}; build from "
                 f"a checkout of the repository (pip >= 21.3 builds in place)")
    sys.path.insert(0, str(sources))
    import flash_cann
    import flash_cann.backends.npu.aclnn
    return flash_cann


def _npu_extension(generated: Path):
    try:
        import torch_npu  # noqa: F401  (NpuExtension needs it importable)
        from torch_npu.utils.cpp_extension import NpuExtension
    except Exception as err:  # torch_npu raises more than ImportError without CANN
        sys.exit(f"framework/setup.py: building the NPU extension needs an importable "
                 f"torch_npu (and CANN's set_env.sh sourced): {type(err).__name__}: {err}")
    return NpuExtension(
        name="flash_cann_npu._launcher",
        sources=[str(p) for p in sorted((HERE / "csrc").glob("*.cpp"))],  # from any cwd
        include_dirs=[str(HERE / "csrc"), str(generated)],
        extra_compile_args=["-Wall", "-Wextra"],
    )


def main() -> None:
    from torch.utils.cpp_extension import BuildExtension

    flash_cann = _flash_cann()
    generated = BUILD / "generated"
    flash_cann.backends.npu.aclnn.write_headers(generated)
    setup(
        name="flash-cann-npu",
        version=flash_cann.__version__,
        description="flash-cann's torch_npu extension: launches the flash-cann CANN op "
                    "package's aclnn API for torch.ops.flash_cann on NPU tensors",
        packages=[],
        ext_modules=[_npu_extension(generated)],
        cmdclass={"build_ext": BuildExtension},
        options={"build": {"build_base": str(BUILD)}},
    )


if __name__ == "__main__":
    main()
