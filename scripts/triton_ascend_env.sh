#!/usr/bin/env bash
# Build the environment the Ascend compile check needs (tests/test_triton_npu.py):
# triton-ascend (Huawei's Triton backend; it owns the `triton` package directory, so it
# cannot share a virtual environment with upstream triton) and ascendnpu-ir
# (bishengir-compile), pinned, from PyPI. pybind11: triton-ascend's backend imports it
# without declaring it. About 215 MB of wheels (cp311, manylinux x86_64).
#   [PYTHON=python3.11] scripts/triton_ascend_env.sh [DIR]   (default: build/triton-ascend-env)
# PYTHON must be the tests' interpreter (same version): they put DIR's site-packages in
# front of their own (torch comes from theirs).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build/triton-ascend-env}"
pins=(triton-ascend==3.2.0 ascendnpu-ir==1.2.0 pybind11==3.1.0)
if [ "$(cat "$dir/.pins" 2>/dev/null)" = "${pins[*]}" ]; then exit 0; fi
rm -rf "$dir"
python="${PYTHON:-python3}"
"$python" -m venv --without-pip "$dir"
"$python" -m pip --python "$dir/bin/python" install --quiet --disable-pip-version-check "${pins[@]}"
echo "${pins[*]}" > "$dir/.pins"
