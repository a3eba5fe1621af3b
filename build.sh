#!/usr/bin/env bash
# Builds flash-cann: with CANN, the operator package build_out/custom_opp_<os>_<arch>.run; with
# --host-only (no CANN needed), the portable parts in build/host. `./build.sh --help` lists every
# option; docs/packaging.md describes the steps and what each produces.
set -euo pipefail

repo=$(CDPATH='' cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
presets=$repo/op_project/CMakePresets.json
build_out=$repo/build_out
host_build=$repo/build/host

die() {
  printf 'build.sh: error: %s\n' "$*" >&2
  exit 1
}

# A cache variable of the preset "default": the CANN build's defaults are written there, once.
preset_default() {  # NAME
  python3 - "$presets" "$1" <<'PY'
import json, sys
path, name = sys.argv[1:]
with open(path) as presets:
    default = next(p for p in json.load(presets)["configurePresets"] if p["name"] == "default")
print(default["cacheVariables"][name]["value"])
PY
}

usage() {
  cat <<EOF
Usage: ./build.sh [option...]

Builds the flash-cann CANN operator package build_out/custom_opp_<os>_<arch>.run: op_host
libraries (tiling, op prototypes), kernels per SoC, the aclnn API, the installer. Needs the CANN
toolkit (8.3 or later). Without CANN, --host-only builds the portable parts.

CANN build:
  --cann-path=DIR       CANN toolkit to build with, e.g. /usr/local/Ascend/ascend-toolkit/latest
                        (default: \$ASCEND_HOME_PATH, else \$ASCEND_TOOLKIT_HOME; CANN's
                        set_env.sh sets them)
  --soc=LIST            compute units to build kernels for, comma-separated
                        (default, and supported: ${default_socs//;/,}); alias --compute-unit=LIST
  --vendor=NAME         vendor name; the package installs into vendors/NAME (default: $default_vendor)
  --no-binary-package   ship no compiled kernels, only their sources (CANN compiles them online)
  --no-source-package   ship no kernel sources, only compiled kernels
  --torch-npu-extension=auto|on|off
                        also build the torch_npu extension (framework/) as a wheel in build_out/:
                        pip wheel --no-build-isolation --no-deps -w build_out ./framework
                        (default auto: when python3 can import torch_npu)
Portable build:
  --host-only           build only the parts that need no CANN (tiling planner, CPU twin) in
                        build/host, as the Python package does on first use: cmake -S op_project
                        -B build/host -DFLASH_CANN_HOST_ONLY=ON -DCMAKE_BUILD_TYPE=Release
Both:
  --jobs=N, -j N        parallel build jobs (default: $(nproc))
  --clean               delete the build directory (build_out/ or build/host/) first
  --help, -h            print this text

Options take their value as --option=VALUE or --option VALUE. Install the package with
./build_out/custom_opp_<os>_<arch>.run --help.
EOF
}

# Sets socs (';'-separated, for CMake) from a comma- or ';'-separated list, checked against the
# compute units the ops are defined for. Any case is accepted, as `flash-cann plan --soc`
# accepts it (CANN spells compute units in lower case).
parse_socs() {  # OPTION LIST
  local soc
  local -a requested
  IFS=',;' read -r -a requested <<< "${2,,}"
  [[ ${#requested[@]} -gt 0 ]] || die "$1 is empty; supported: ${default_socs//;/,}"
  socs=""
  for soc in "${requested[@]}"; do
    [[ ";$default_socs;" == *";$soc;"* ]] ||
      die "$1: '$soc' is not supported; flash-cann's ops are defined for ${default_socs//;/,}"
    [[ ";$socs;" != *";$soc;"* ]] || die "$1: '$soc' is listed twice"
    socs=${socs:+$socs;}$soc
  done
}

parse_args() {
  local arg name value has_value
  cann_path="" socs=$default_socs vendor=$default_vendor binary=True source=True
  torch_npu_extension=auto jobs=$(nproc) clean=no host_only=no cann_only_options=()
  while [[ $# -gt 0 ]]; do
    arg=$1
    shift
    case $arg in
      --*=*) name=${arg%%=*} value=${arg#*=} has_value=yes ;;
      -j?*) name=-j value=${arg#-j} has_value=yes ;;
      *) name=$arg value="" has_value=no ;;
    esac
    case $name in
      --cann-path|--soc|--compute-unit|--vendor|--torch-npu-extension|--jobs|-j)
        if [[ $has_value == no ]]; then
          [[ $# -gt 0 ]] || die "$name needs a value: $name=VALUE"
          value=$1
          shift
        fi
        [[ -n $value ]] || die "$name needs a value: $name=VALUE" ;;
      *) [[ $has_value == no ]] || die "$name takes no value" ;;
    esac
    case $name in
      --cann-path) cann_path=$value ;;
      --soc|--compute-unit) parse_socs "$name" "$value" ;;
      --vendor)
        [[ $value =~ ^[A-Za-z0-9_]+$ ]] ||
          die "--vendor='$value': use letters, digits and '_' only (it names a directory and an entry of config.ini's comma-separated load_priority)"
        vendor=$value ;;
      --no-binary-package) binary=False ;;
      --no-source-package) source=False ;;
      --torch-npu-extension)
        [[ $value == auto || $value == on || $value == off ]] ||
          die "--torch-npu-extension='$value': expected auto, on or off"
        torch_npu_extension=$value ;;
      --jobs|-j) [[ $value =~ ^[1-9][0-9]*$ ]] || die "$name='$value': expected a positive number"; jobs=$value ;;
      --clean) clean=yes ;;
      --host-only) host_only=yes ;;
      --help|-h) usage; exit 0 ;;
      *) die "unknown option '$arg' (see ./build.sh --help)" ;;
    esac
    case $name in
      --cann-path|--soc|--compute-unit|--vendor|--no-binary-package|--no-source-package|--torch-npu-extension)
        cann_only_options+=("$name") ;;
    esac
  done
  if [[ $host_only == yes && ${#cann_only_options[@]} -gt 0 ]]; then
    die "${cann_only_options[0]} applies to the CANN build, not to --host-only"
  fi
  [[ $binary == True || $source == True ]] ||
    die "--no-binary-package and --no-source-package together leave the package without kernels"
}

build_host_only() {
  command -v cmake > /dev/null || die "cmake (3.16 or later) is needed"
  command -v flock > /dev/null || die "flock (util-linux) is needed"
  if [[ $clean == yes ]]; then rm -rf -- "$host_build"; fi
  mkdir -p -- "$host_build"
  # python/flash_cann/ascend/native.py builds the same directory on first use (tests, CLI): take its lock,
  # and its configuration.
  exec {lock}> "$host_build/.build.lock"
  flock "$lock"
  cmake -S "$repo/op_project" -B "$host_build" -DFLASH_CANN_HOST_ONLY=ON -DCMAKE_BUILD_TYPE=Release
  cmake --build "$host_build" -j "$jobs"
}

# Sets cann to the toolkit directory and checks it has what the build uses; says what is missing
# and how to point at CANN otherwise.
find_cann() {
  local from asc_modules
  if [[ -n $cann_path ]]; then
    cann=$cann_path from=--cann-path
  elif [[ -n ${ASCEND_HOME_PATH:-} ]]; then
    cann=$ASCEND_HOME_PATH from=ASCEND_HOME_PATH
  elif [[ -n ${ASCEND_TOOLKIT_HOME:-} ]]; then
    cann=$ASCEND_TOOLKIT_HOME from=ASCEND_TOOLKIT_HOME
  else
    die "no CANN toolkit: --cann-path is not given and neither ASCEND_HOME_PATH nor ASCEND_TOOLKIT_HOME is set.
  To build the operator package, point at CANN (8.3 or later) in either way:
    source /usr/local/Ascend/ascend-toolkit/set_env.sh && ./build.sh     (sets ASCEND_HOME_PATH)
    ./build.sh --cann-path=/usr/local/Ascend/ascend-toolkit/latest
  Without CANN, build the portable parts (tiling planner, CPU twin): ./build.sh --host-only"
  fi
  [[ -d $cann ]] || die "$from='$cann' is not a directory; point --cann-path at the CANN toolkit (the directory holding compiler/)"
  cann=$(CDPATH='' cd -- "$cann" && pwd)
  asc_modules=$cann/compiler/tikcpp/ascendc_kernel_cmake
  [[ -f $asc_modules/asc-config.cmake ]] ||
    die "$from='$cann' has no $asc_modules/asc-config.cmake: the build needs CANN's packaged operator-project CMake modules (find_package(ASC), CANN 8.3 or later); point --cann-path at such a toolkit"
}

build_package() {
  local cmake_version
  command -v cmake > /dev/null || die "cmake (3.19 or later) is needed"
  cmake_version=$(cmake --version | head -n 1)
  cmake_version=${cmake_version##* }
  printf '%s\n%s\n' 3.19 "$cmake_version" | sort -V -C ||
    die "cmake $cmake_version is too old: CMakePresets.json needs 3.19 or later"
  find_cann
  # CANN's modules (asc-config.cmake) locate themselves through this environment variable.
  export ASCEND_HOME_PATH=$cann
  if [[ -z ${ASCEND_OPP_PATH:-} ]]; then
    printf 'build.sh: note: ASCEND_OPP_PATH is unset, so CANN'\''s set_env.sh seems not sourced; kernel compilation needs the PATH and PYTHONPATH it sets (source <CANN>/set_env.sh if it fails)\n' >&2
  fi
  if [[ $clean == yes ]]; then rm -rf -- "$build_out"; fi
  (cd "$repo/op_project" && cmake --preset=default \
    "-DASCEND_CANN_PACKAGE_PATH=$cann" "-DASCEND_COMPUTE_UNIT=$socs" "-Dvendor_name=$vendor" \
    "-DENABLE_BINARY_PACKAGE=$binary" "-DENABLE_SOURCE_PACKAGE=$source")
  # The documented order: host libraries and op information (all), kernels (binary), then the
  # package, whose stager checks that every file the layout needs is there.
  cmake --build "$build_out" -j "$jobs"
  cmake --build "$build_out" --target binary -j "$jobs"
  cmake --build "$build_out" --target package
  build_torch_npu_extension
}

# The torch_npu extension is a Python wheel built by framework/setup.py against this environment's
# torch and torch_npu; it is not part of the .run.
build_torch_npu_extension() {
  if [[ $torch_npu_extension == auto ]]; then
    if python3 -c 'import torch_npu' 2> /dev/null; then
      torch_npu_extension=on
    else
      printf 'build.sh: torch_npu is not importable by python3: not building the torch_npu extension\n'
      return 0
    fi
  fi
  if [[ $torch_npu_extension == on ]]; then
    python3 -m pip wheel --no-build-isolation --no-deps -w "$build_out" "$repo/framework"
  fi
}

main() {
  command -v python3 > /dev/null || die "python3 is needed"
  default_socs=$(preset_default ASCEND_COMPUTE_UNIT)
  default_vendor=$(preset_default vendor_name)
  parse_args "$@"
  if [[ $host_only == yes ]]; then
    build_host_only
  else
    build_package
  fi
}

main "$@"
