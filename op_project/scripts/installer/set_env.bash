# shellcheck shell=bash
# flash-cann: makes the operator package installed beside this file visible to CANN and torch_npu.
# install.sh --install-path=DIR copies it to DIR/vendors/<vendor>/bin/set_env.bash; source it in bash:
#   source DIR/vendors/<vendor>/bin/set_env.bash
# It PREPENDS the vendor directory to ASCEND_CUSTOM_OPP_PATH and its op_api/lib to LD_LIBRARY_PATH,
# keeping every other entry in order. CANN gives the package sourced last the highest priority, so
# sourcing again moves the entries to the front instead of adding a second copy. The directory is
# found from this file's location, so paths with spaces need no quoting here.

_flash_cann_prepend() {  # VARIABLE ENTRY
  local list=":${!1-}:"
  while [[ $list == *":$2:"* ]]; do list=${list//":$2:"/:}; done
  list=${list#:}
  list=${list%:}
  export "$1=$2${list:+:$list}"
}

_flash_cann_vendor_dir=$(CDPATH='' cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
_flash_cann_prepend ASCEND_CUSTOM_OPP_PATH "$_flash_cann_vendor_dir"
_flash_cann_prepend LD_LIBRARY_PATH "$_flash_cann_vendor_dir/op_api/lib"
unset -f _flash_cann_prepend
unset _flash_cann_vendor_dir
