# The flash-cann package from CMake: a list of built files and a `package` target that turns it into
# custom_opp_<os>_<arch>.run in the build directory, through op_project/scripts/pack (stage_payload.py
# lays the payload out, make_run.py packs it). cann.cmake uses it for the real package; the tests
# (tests/test_package.py) use it with stand-in files, so both go through this same code.
#
#   flash_cann_payload_add(<role> <path>...)      role as in stage_payload.py, e.g. ops_info@ascend910b;
#                                                 paths may be generator expressions ($<TARGET_FILE:..>)
#   flash_cann_add_package(VENDOR <name> COMPUTE_UNITS <soc>... KERNEL_PACKAGES binary|source...
#                          COMPILER_VERSION <text> [DEPENDS <target>...])
#                                                 call once, after every flash_cann_payload_add
include_guard(GLOBAL)

get_filename_component(FLASH_CANN_PACK_DIR "${CMAKE_CURRENT_LIST_DIR}/../scripts/pack" ABSOLUTE)
get_filename_component(FLASH_CANN_PYPROJECT "${CMAKE_CURRENT_LIST_DIR}/../../pyproject.toml" ABSOLUTE)
find_package(Python3 REQUIRED COMPONENTS Interpreter)

function(flash_cann_payload_add role)
  foreach(path IN LISTS ARGN)
    set_property(GLOBAL APPEND PROPERTY FLASH_CANN_PAYLOAD_FILES "${role}\t${path}")
  endforeach()
endfunction()

# <os> of the package name: the ID of /etc/os-release, as CANN's own packages are named.
function(_flash_cann_os_id out)
  file(STRINGS /etc/os-release id_line REGEX "^ID=")
  string(REGEX REPLACE "^ID=\"?([^\"]*)\"?$" "\\1" os_id "${id_line}")
  if(os_id STREQUAL "")
    message(FATAL_ERROR "flash-cann: no ID= line in /etc/os-release; it names the .run (custom_opp_<os>_<arch>.run)")
  endif()
  set(${out} "${os_id}" PARENT_SCOPE)
endfunction()

# The package version is the Python package's (pyproject.toml), written once.
function(_flash_cann_version out)
  file(STRINGS "${FLASH_CANN_PYPROJECT}" version_line REGEX "^version = \"[^\"]+\"$" LIMIT_COUNT 1)
  string(REGEX REPLACE "^version = \"([^\"]+)\"$" "\\1" version "${version_line}")
  if(version STREQUAL "")
    message(FATAL_ERROR "flash-cann: no `version = \"...\"` line in ${FLASH_CANN_PYPROJECT}")
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

function(flash_cann_add_package)
  cmake_parse_arguments(PKG "" "VENDOR;COMPILER_VERSION" "COMPUTE_UNITS;KERNEL_PACKAGES;DEPENDS" ${ARGN})
  foreach(required VENDOR COMPILER_VERSION COMPUTE_UNITS KERNEL_PACKAGES)
    if(NOT PKG_${required})
      message(FATAL_ERROR "flash_cann_add_package: ${required} is required")
    endif()
  endforeach()
  _flash_cann_os_id(os_id)
  _flash_cann_version(version)
  set(run_file "${CMAKE_BINARY_DIR}/custom_opp_${os_id}_${CMAKE_SYSTEM_PROCESSOR}.run")
  set(file_list "${CMAKE_BINARY_DIR}/payload_files.tsv")
  set(payload "${CMAKE_BINARY_DIR}/payload")
  get_property(entries GLOBAL PROPERTY FLASH_CANN_PAYLOAD_FILES)
  string(REPLACE ";" "\n" lines "${entries}")
  file(GENERATE OUTPUT "${file_list}" CONTENT "${lines}\n")
  string(REPLACE ";" "," compute_units "${PKG_COMPUTE_UNITS}")
  string(REPLACE ";" "," kernel_packages "${PKG_KERNEL_PACKAGES}")
  add_custom_target(package
    COMMAND "${CMAKE_COMMAND}" -E remove_directory "${payload}"
    COMMAND "${Python3_EXECUTABLE}" "${FLASH_CANN_PACK_DIR}/stage_payload.py"
            --file-list "${file_list}" --out "${payload}" --vendor "${PKG_VENDOR}"
            --version "${version}" --arch "${CMAKE_SYSTEM_PROCESSOR}"
            --compute-units "${compute_units}" --kernel-packages "${kernel_packages}"
            --compiler-version "${PKG_COMPILER_VERSION}"
    COMMAND "${Python3_EXECUTABLE}" "${FLASH_CANN_PACK_DIR}/make_run.py" "${payload}" "${run_file}"
    COMMENT "flash-cann: packing ${run_file}"
    VERBATIM)
  if(PKG_DEPENDS)
    add_dependencies(package ${PKG_DEPENDS})
  endif()
endfunction()
