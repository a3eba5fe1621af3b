"""op_project/cmake/cann.cmake, the CANN build's CMake, configured against stand-in CANN modules.

The real modules (asc-devkit's find_package(ASC)) exist only with the CANN toolkit, so here a
stand-in asc-config.cmake defines npu_op_package, npu_op_code_gen, npu_op_library,
npu_op_kernel_sources, npu_op_kernel_library and npu_op_package_add as recorders (and the targets
the real ones create). Configuring op_project with FLASH_CANN_HOST_ONLY=OFF then shows what
cann.cmake hands CANN: every op_host shell and the planner's sources to op_build, the planner
linked into the proto and tiling libraries with CANN's pre-C++11 ABI, hidden visibility, every
payload role; and its refusals of an incomplete configuration. Nothing is compiled: what CANN's
modules do with these arguments runs only on a CANN machine (docs/packaging.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from native_build import needs

pytestmark = needs("cmake")

ROOT = Path(__file__).resolve().parents[1]
SHELLS = [str(ROOT / "op_host" / f"{name}.cpp") for name in
          ("flash_cann_attention", "flash_cann_attention_grad", "flash_cann_attention_kvcache")]
SOCS = ("ascend910b", "ascend910_93")

# The stand-in of asc-devkit's CMake modules: each function records its arguments; the library
# functions create the targets the real ones do (never built), and a deferred call reports the
# properties cann.cmake sets on them afterwards.
ASC_CONFIG = r"""
set(ASCEND_AUTOGEN_PATH "${CMAKE_BINARY_DIR}/autogen")
file(MAKE_DIRECTORY "${ASCEND_AUTOGEN_PATH}")
file(WRITE "${ASCEND_AUTOGEN_PATH}/aclnn_flash_cann_attention.h" "")
set(_fake_log "${CMAKE_BINARY_DIR}/fake_asc.log")
file(WRITE "${_fake_log}" "")
file(WRITE "${CMAKE_BINARY_DIR}/fake_asc_dummy.cpp" "")
function(_fake_record name)
  string(REPLACE ";" "|" args "${ARGN}")
  file(APPEND "${_fake_log}" "${name}=${args}\n")
endfunction()
function(npu_op_package)
  _fake_record(npu_op_package ${ARGN})
endfunction()
function(npu_op_code_gen)
  _fake_record(npu_op_code_gen ${ARGN})
endfunction()
function(npu_op_library name kind)
  _fake_record(npu_op_library_${name} ${kind} ${ARGN})
  add_library(${name} STATIC EXCLUDE_FROM_ALL "${CMAKE_BINARY_DIR}/fake_asc_dummy.cpp")
endfunction()
function(npu_op_kernel_sources)
  _fake_record(npu_op_kernel_sources ${ARGN})
endfunction()
function(npu_op_kernel_library name)
  _fake_record(npu_op_kernel_library ${name} ${ARGN})
  set_property(GLOBAL PROPERTY _ASC_TGT_KERNEL_${name}_BINARY_DIR "${CMAKE_BINARY_DIR}/kernels")
endfunction()
function(npu_op_package_add package)
  _fake_record(npu_op_package_add ${package} ${ARGN})
  foreach(library cust_opapi cust_op_proto cust_optiling)
    add_library(${package}_ascendc_${library} SHARED EXCLUDE_FROM_ALL "${CMAKE_BINARY_DIR}/fake_asc_dummy.cpp")
  endforeach()
endfunction()
function(_fake_report)
  foreach(target cust_opapi cust_op_proto cust_optiling)
    get_target_property(options ${target} COMPILE_OPTIONS)
    get_target_property(links ${target} LINK_LIBRARIES)
    _fake_record(${target}_options ${options})
    _fake_record(${target}_links ${links})
  endforeach()
  get_target_property(definitions flash_cann_planner INTERFACE_COMPILE_DEFINITIONS)
  _fake_record(planner_definitions ${definitions})
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _fake_report)
"""

SETTINGS = {"ASCEND_COMPUTE_UNIT": ";".join(SOCS), "vendor_name": "flash_cann",
            "ENABLE_SOURCE_PACKAGE": "ON", "ENABLE_BINARY_PACKAGE": "ON"}


def _cann(tmp_path: Path, version: str = "Version=8.3.RC1\n") -> Path:
    cann = tmp_path / "cann"
    modules = cann / "compiler" / "tikcpp" / "ascendc_kernel_cmake"
    modules.mkdir(parents=True)
    (modules / "asc-config.cmake").write_text(ASC_CONFIG)
    (cann / "compiler" / "version.info").write_text(version)
    return cann


def _configure(tmp_path: Path, cann: Path, **changes) -> subprocess.CompletedProcess:
    settings = {**SETTINGS, "ASCEND_CANN_PACKAGE_PATH": str(cann), **changes}
    defines = [f"-D{k}={v}" for k, v in settings.items() if v is not None]
    return subprocess.run(["cmake", "-S", str(ROOT / "op_project"), "-B", str(tmp_path / "build"),
                           "-DFLASH_CANN_HOST_ONLY=OFF", "-DFLASH_CANN_TESTS=OFF",
                           f"-DPython3_EXECUTABLE={sys.executable}", *defines],
                          capture_output=True, text=True)


def _recorded(build: Path) -> dict[str, list[str]]:
    calls = {}
    for line in (build / "fake_asc.log").read_text().splitlines():
        name, _, args = line.partition("=")
        calls[name] = args.split("|") if args else []
    return calls


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cann_cmake")
    done = _configure(tmp, _cann(tmp))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return tmp / "build"


def test_op_build_gets_every_shell_and_the_planners_sources(configured):
    calls = _recorded(configured)
    code_gen = calls["npu_op_code_gen"]
    sources = code_gen[code_gen.index("SRC") + 1:code_gen.index("PACKAGE")]
    # the static library's (the tiling and proto libraries link it); c_api.cpp is the
    # Python ABI's shared library only
    planner = sorted(str(p) for p in (ROOT / "op_host" / "planner").glob("*.cpp")
                     if p.name != "c_api.cpp")
    assert sources[:3] == SHELLS
    assert sorted(s for s in sources[3:] if s.endswith(".cpp")) == planner
    assert code_gen[code_gen.index("PACKAGE") + 1] == "flash_cann"
    assert "-std=c++17" in code_gen and f"-I{ROOT / 'op_host' / 'planner'}" in code_gen


def test_host_libraries_take_the_shells_and_link_the_planner_with_canns_abi(configured):
    calls = _recorded(configured)
    assert calls["npu_op_library_cust_opapi"][0] == "ACLNN"
    for library, kind in (("cust_op_proto", "GRAPH"), ("cust_optiling", "TILING")):
        args = calls[f"npu_op_library_{library}"]
        assert args[0] == kind and args[1:4] == SHELLS, library
        assert calls[f"{library}_links"] == ["flash_cann_planner"], library
    for library in ("cust_opapi", "cust_op_proto", "cust_optiling"):
        assert calls[f"{library}_options"] == ["-fvisibility=hidden"], library
    # CANN's host libraries use the pre-C++11 libstdc++ ABI: so must the planner in them
    assert "_GLIBCXX_USE_CXX11_ABI=0" in calls["planner_definitions"]
    assert calls["npu_op_package_add"] == ["flash_cann", "LIBRARY", "cust_optiling", "cust_opapi",
                                           "cust_op_proto", "ascendc_kernels"]


def test_the_payload_lists_every_role_of_both_socs(configured):
    roles = {line.split("\t")[0] for line in
             (configured / "payload_files.tsv").read_text().splitlines() if line}
    assert roles == {"op_api_lib", "op_api_header", "op_proto_lib", "op_proto_header",
                     "op_tiling_lib", "framework@tensorflow", "kernel_source",
                     *(f"{role}@{soc}" for soc in SOCS
                       for role in ("ops_info", "kernel_binaries", "kernel_config"))}


@pytest.mark.parametrize("changes, message", [
    ({"vendor_name": None}, "flash-cann: vendor_name is not set; configure with ./build.sh"),
    ({"ASCEND_COMPUTE_UNIT": None}, "flash-cann: ASCEND_COMPUTE_UNIT is not set"),
    ({"ENABLE_SOURCE_PACKAGE": "OFF", "ENABLE_BINARY_PACKAGE": "OFF"},
     "ENABLE_SOURCE_PACKAGE and ENABLE_BINARY_PACKAGE are both off"),
], ids=["no-vendor", "no-soc", "no-kernels"])
def test_an_incomplete_configuration_is_refused_by_name(tmp_path, changes, message):
    done = _configure(tmp_path, _cann(tmp_path), **changes)
    assert done.returncode != 0 and message in done.stderr


def test_a_toolkit_without_a_compiler_version_is_refused(tmp_path):
    done = _configure(tmp_path, _cann(tmp_path, version="Name=compiler\n"))
    assert done.returncode != 0 and "no Version= line in" in done.stderr
