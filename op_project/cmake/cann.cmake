# The CANN build of flash-cann: op_host libraries, kernels per SoC, the aclnn API, and the package.
# Included by op_project/CMakeLists.txt unless FLASH_CANN_HOST_ONLY; driven by ./build.sh, which
# configures with CMakePresets.json (preset "default") and builds the targets `all`, `binary` and
# `package`. NOT RUN in this repository's CI (no CANN there): see docs/packaging.md, "What ran where".
#
# Compiling follows CANN's documented operator-project CMake modules (find_package(ASC); asc-devkit
# docs "编译与部署/基本流程.md" and "附录/cmake函数参考.md", CANN >= 8.3): npu_op_code_gen runs CANN's
# op_build on op_host/flash_cann_attention{,_grad}.cpp (aclnn_*.cpp/.h, op_proto, ops-info ini), npu_op_library
# builds the aclnn, proto (OP_PROTO_LIB) and tiling (OP_TILING_LIB) libraries, npu_op_kernel_library
# compiles op_kernel/ per SoC. Packing is ours (payload.cmake): ENABLE_CPACK False is CANN's
# documented switch for projects that package their own way.

foreach(setting ASCEND_CANN_PACKAGE_PATH ASCEND_COMPUTE_UNIT vendor_name ENABLE_SOURCE_PACKAGE ENABLE_BINARY_PACKAGE)
  if(NOT DEFINED ${setting})
    # CANN's modules would quietly default these (vendor "customize", SoC ascend910b).
    message(FATAL_ERROR "flash-cann: ${setting} is not set; configure with ./build.sh or `cmake --preset=default` (op_project/CMakePresets.json)")
  endif()
endforeach()
if(NOT ENABLE_SOURCE_PACKAGE AND NOT ENABLE_BINARY_PACKAGE)
  message(FATAL_ERROR "flash-cann: ENABLE_SOURCE_PACKAGE and ENABLE_BINARY_PACKAGE are both off; the package would hold no kernels")
endif()

find_package(ASC REQUIRED HINTS "${ASCEND_CANN_PACKAGE_PATH}/compiler/tikcpp/ascendc_kernel_cmake")
include(${CMAKE_CURRENT_LIST_DIR}/payload.cmake)

npu_op_package(${vendor_name} TYPE RUN CONFIG
  ENABLE_SOURCE_PACKAGE ${ENABLE_SOURCE_PACKAGE}
  ENABLE_BINARY_PACKAGE ${ENABLE_BINARY_PACKAGE}
  ENABLE_CPACK False
  # With ENABLE_CPACK False CANN's own install rules write here; nothing reads this directory.
  INSTALL_PATH "${CMAKE_BINARY_DIR}/cann_install")

# CANN's host libraries use the pre-C++11 libstdc++ ABI (intf_pub, compile_ascendc_all_ops_so.py);
# the planner linked into them, and so everything else that links the planner, must match.
target_compile_definitions(flash_cann_planner PUBLIC _GLIBCXX_USE_CXX11_ABI=0)

# op_build loads the op definitions at configure time from a library that npu_op_code_gen compiles
# directly from sources, so the planner goes in as sources too (it cannot link a target not yet built).
get_target_property(planner_dir flash_cann_planner SOURCE_DIR)
get_target_property(planner_sources flash_cann_planner SOURCES)
list(TRANSFORM planner_sources PREPEND "${planner_dir}/")
get_target_property(planner_includes flash_cann_planner INTERFACE_INCLUDE_DIRECTORIES)
list(TRANSFORM planner_includes PREPEND "-I")
set(op_host_sources "${FLASH_CANN_ROOT}/op_host/flash_cann_attention.cpp"
                    "${FLASH_CANN_ROOT}/op_host/flash_cann_attention_grad.cpp"
                    "${FLASH_CANN_ROOT}/op_host/flash_cann_attention_kvcache.cpp")
npu_op_code_gen(
  SRC ${op_host_sources} ${planner_sources}
  PACKAGE ${vendor_name}
  OUT_DIR ${ASCEND_AUTOGEN_PATH}
  COMPILE_OPTIONS -std=c++17 ${planner_includes})

file(GLOB aclnn_sources "${ASCEND_AUTOGEN_PATH}/aclnn_*.cpp")
file(GLOB aclnn_headers "${ASCEND_AUTOGEN_PATH}/aclnn_*.h")
file(GLOB fallback_sources "${ASCEND_AUTOGEN_PATH}/fallback_*.cpp")
set(proto_sources "${ASCEND_AUTOGEN_PATH}/op_proto.cc")
set_source_files_properties(${aclnn_sources} ${fallback_sources} ${proto_sources} PROPERTIES GENERATED TRUE)
npu_op_library(cust_opapi ACLNN ${aclnn_sources})
npu_op_library(cust_op_proto GRAPH ${op_host_sources} ${proto_sources})
npu_op_library(cust_optiling TILING ${op_host_sources} ${fallback_sources})
foreach(host_library cust_opapi cust_op_proto cust_optiling)
  target_compile_options(${host_library} PRIVATE -fvisibility=hidden)
endforeach()
target_link_libraries(cust_op_proto PRIVATE flash_cann_planner)
target_link_libraries(cust_optiling PRIVATE flash_cann_planner)

# Kernel files follow CANN's OpType -> file name rule (FlashCannAttention -> flash_cann_attention.cpp,
# FlashCannAttentionGrad -> flash_cann_attention_grad.cpp), so the directory is scanned.
npu_op_kernel_sources(ascendc_kernels KERNEL_DIR ./)
npu_op_kernel_library(ascendc_kernels
  SRC_BASE "${FLASH_CANN_ROOT}/op_kernel/"
  TILING_LIBRARY cust_optiling)
npu_op_package_add(${vendor_name} LIBRARY cust_optiling cust_opapi cust_op_proto ascendc_kernels)

# What CANN's modules produced, by payload role. These names are not part of CANN's documented
# interface: npu_op_package_add names the shared libraries <package>_ascendc_<library> (the proto one
# <package>_ascendc_cust_op_proto) and npu_op_kernel_library builds under the path in the global
# property below (asc-devkit cmake/asc/fwk_modules/func.cmake). Checked here so that a CANN release
# that renames them fails at configure time, not with an incomplete package.
set(library_targets ${vendor_name}_ascendc_cust_opapi ${vendor_name}_ascendc_cust_op_proto ${vendor_name}_ascendc_cust_optiling)
foreach(target IN LISTS library_targets)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "flash-cann: CANN's modules did not define the target ${target}; this CANN version names its package libraries differently (see op_project/cmake/cann.cmake)")
  endif()
endforeach()
get_property(kernel_dir GLOBAL PROPERTY _ASC_TGT_KERNEL_ascendc_kernels_BINARY_DIR)
if(NOT kernel_dir)
  message(FATAL_ERROR "flash-cann: CANN's modules did not report the kernel build directory (_ASC_TGT_KERNEL_ascendc_kernels_BINARY_DIR); see op_project/cmake/cann.cmake")
endif()

flash_cann_payload_add(op_api_lib "$<TARGET_FILE:${vendor_name}_ascendc_cust_opapi>")
flash_cann_payload_add(op_api_header ${aclnn_headers})
flash_cann_payload_add(op_proto_lib "$<TARGET_FILE:${vendor_name}_ascendc_cust_op_proto>")
flash_cann_payload_add(op_proto_header "${ASCEND_AUTOGEN_PATH}/op_proto.h")
flash_cann_payload_add(op_tiling_lib "$<TARGET_FILE:${vendor_name}_ascendc_cust_optiling>")
flash_cann_payload_add(framework@tensorflow "${kernel_dir}/tbe/op_info_cfg/ai_core/npu_supported_ops.json")
set(kernel_packages "")
foreach(soc IN LISTS ASCEND_COMPUTE_UNIT)
  flash_cann_payload_add(ops_info@${soc} "${kernel_dir}/tbe/op_info_cfg/ai_core/${soc}/aic-${soc}-ops-info.json")
  if(ENABLE_BINARY_PACKAGE)
    flash_cann_payload_add(kernel_binaries@${soc} "${kernel_dir}/binary/${soc}")
    flash_cann_payload_add(kernel_config@${soc} "${kernel_dir}/binary/config/${soc}")
  endif()
endforeach()
if(ENABLE_BINARY_PACKAGE)
  list(APPEND kernel_packages binary)
endif()
if(ENABLE_SOURCE_PACKAGE)
  list(APPEND kernel_packages source)
  flash_cann_payload_add(kernel_source "${kernel_dir}/binary/dynamic")
endif()

# version.info carries the compiler version the way CANN's own packages do (gen_version_info.sh).
file(STRINGS "${ASCEND_CANN_PACKAGE_PATH}/compiler/version.info" compiler_version_line REGEX "^Version=" LIMIT_COUNT 1)
string(REGEX REPLACE "^Version=" "" compiler_version "${compiler_version_line}")
if(compiler_version STREQUAL "")
  message(FATAL_ERROR "flash-cann: no Version= line in ${ASCEND_CANN_PACKAGE_PATH}/compiler/version.info")
endif()

flash_cann_add_package(
  VENDOR ${vendor_name}
  COMPUTE_UNITS ${ASCEND_COMPUTE_UNIT}
  KERNEL_PACKAGES ${kernel_packages}
  COMPILER_VERSION "${compiler_version}"
  DEPENDS ${library_targets})
