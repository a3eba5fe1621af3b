#!/bin/bash
# Installs the flash-cann operator package this script belongs to (the payload directory it sits in)
# into a CANN opp tree. The .run package runs it after verifying its own checksum. What it does, and
# why, is in docs/packaging.md ("Installing"); the rules in short:
#   * every check runs before the first change: a missing or read-only target changes nothing;
#   * the vendor tree is built beside its destination and moved into place; a failure rolls back;
#   * it records what it installed (scripts/install_manifest, scripts/install.record) so that
#     scripts/uninstall.sh removes exactly that and can restore config.ini byte for byte.
set -euo pipefail

prog="flash-cann install"
payload_dir=$(CDPATH='' cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)

# The payload holds exactly one vendor tree: packages/vendors/<vendor>/.
find_vendor_tree() {
  local -a trees=("$payload_dir"/packages/vendors/*/)
  if [[ ${#trees[@]} -ne 1 || ! -d ${trees[0]} ]]; then
    printf '%s: error: malformed payload: expected one directory under %s/packages/vendors\n' \
      "$prog" "$payload_dir" >&2
    exit 1
  fi
  src_tree=${trees[0]%/}
}

find_vendor_tree
# shellcheck source=install_lib.sh
source "$src_tree/scripts/install_lib.sh"

quiet=no
install_path=""
vendor=${src_tree##*/}
info=$src_tree/scripts/package.info

parse_args() {
  local arg
  for arg in "$@"; do
    case $arg in
      --install-path=?*) install_path=${arg#--install-path=} ;;
      --install-path|--install-path=) die "--install-path needs a directory: --install-path=DIR" ;;
      --quiet) quiet=yes ;;
      --help|-h) cat "$payload_dir/help.info"; exit 0 ;;
      *) die "unknown option '$arg' (see --help)" ;;
    esac
  done
}

# Sets mode, base (the directory that holds vendors/), vendors_dir and vendor_dir.
choose_target() {
  if [[ -n $install_path ]]; then
    mode=install-path
    [[ $install_path == /* ]] || install_path=$PWD/$install_path
    # set_env.bash puts the path into ASCEND_CUSTOM_OPP_PATH, a ':'-separated list.
    [[ $install_path != *:* ]] ||
      die "--install-path='$install_path' contains ':', which ASCEND_CUSTOM_OPP_PATH (a ':'-separated list) cannot hold; nothing was changed"
    base=${install_path%/}
    [[ -d $base ]] || die "--install-path='$install_path' does not exist or is not a directory (create it first); nothing was changed"
  else
    mode=default
    [[ -n ${ASCEND_OPP_PATH:-} ]] ||
      die "ASCEND_OPP_PATH is not set: source CANN's set_env.sh (it sets ASCEND_OPP_PATH to <CANN>/opp), or install elsewhere with --install-path=DIR"
    base=${ASCEND_OPP_PATH%/}
    [[ -d $base ]] || die "ASCEND_OPP_PATH='$ASCEND_OPP_PATH' does not exist or is not a directory; nothing was changed"
  fi
  vendors_dir=$base/vendors
  vendor_dir=$vendors_dir/$vendor
  config=$vendors_dir/config.ini
}

preflight() {
  local built_for installed_mode
  built_for=$(record_get "$info" arch)
  [[ $built_for == "$(uname -m)" ]] ||
    die "this package was built for $built_for, this machine is $(uname -m); nothing was changed"
  if [[ -d $vendors_dir ]]; then
    require_writable_dir "$vendors_dir" "the vendors directory"
  else
    require_writable_dir "$base" "the install target"
  fi
  if [[ $mode == default && -e $config ]]; then
    [[ -f $config && -w $config ]] || die "'$config' is not a writable file; nothing was changed"
  fi
  if [[ -e $vendor_dir ]]; then
    require_own_tree "$vendor_dir"
    require_removable_tree "$vendor_dir"
    installed_mode=$(record_get "$(record_of "$vendor_dir")" mode)
    [[ $installed_mode == "$mode" ]] ||
      die "'$vendor_dir' was installed in $installed_mode mode; uninstall it first (bash '$vendor_dir/scripts/uninstall.sh'); nothing was changed"
  fi
}

# Writes the install record into the staged tree and, in default mode, the config.ini to commit
# (work/config.ini). A reinstall carries over what the first install found (whether it created
# vendors/, the original config.ini), unless config.ini has been edited by someone else since.
stage_record() {
  local record vendors_created=$made_vendors_dir config_state=none config_sha=none
  local previous old_backup
  record=$(record_of "$staging")
  if [[ -e $vendor_dir ]]; then
    previous=$(record_of "$vendor_dir")
    old_backup=$(config_backup_of "$vendor_dir")
    vendors_created=$(record_get "$previous" vendors_dir_created)
  fi
  if [[ $mode == default ]]; then
    edit_load_priority add "$config" "$vendor" "$work/config.ini"
    if [[ -n ${previous:-} ]]; then
      config_state=$(config_state_now "$(record_get "$previous" config_ini)" \
        "$(record_get "$previous" config_ini_sha256)" "$config")
      if [[ $config_state == modified ]]; then cp -p -- "$old_backup" "$(config_backup_of "$staging")"; fi
    elif [[ ! -e $config ]]; then
      config_state=created
    elif cmp -s -- "$config" "$work/config.ini"; then
      config_state=unchanged
    else
      config_state=modified
      cp -p -- "$config" "$(config_backup_of "$staging")"
    fi
    config_sha=$(sha256_or_absent "$work/config.ini")
  fi
  {
    printf '# flash-cann install record, read by scripts/uninstall.sh; see docs/packaging.md\n'
    printf 'mode=%s\n' "$mode"
    printf 'vendors_dir_created=%s\n' "$vendors_created"
    printf 'config_ini=%s\n' "$config_state"
    printf 'config_ini_sha256=%s\n' "$config_sha"
  } > "$record"
}

stage_tree() {
  # mkdir, not mktemp -d: the tree gets the permissions of any new directory (umask), not 0700.
  mkdir -- "$vendors_dir/.$vendor.new.$$"
  staging=$vendors_dir/.$vendor.new.$$
  cp -RP -- "$src_tree/." "$staging/"
  if [[ $mode == install-path ]]; then
    mkdir -- "$staging/bin"
    cp -- "$payload_dir/set_env.bash" "$staging/bin/set_env.bash"
  fi
  stage_record
  # The manifest lists itself: create it, then fill it with the listing that includes it.
  : > "$(manifest_of "$staging")"
  tree_listing "$staging" > "$work/manifest"
  cat -- "$work/manifest" > "$(manifest_of "$staging")"
}

# Runs on exit: until the install is committed, undoes whatever it had done.
finish() {
  if [[ $started == yes && $committed != yes ]]; then
    printf '%s: error: stopped before the end; putting everything back as it was\n' "$prog" >&2
    if [[ -n $staging ]]; then rm -rf -- "$staging"; fi
    if [[ $placed == yes ]]; then rm -rf -- "$vendor_dir"; fi
    if [[ -n $old_tree ]]; then mv -- "$old_tree" "$vendor_dir"; fi
    if [[ $config_touched == yes ]]; then restore_config "$config" "$work/config.before"; fi
    if [[ $made_vendors_dir == yes ]]; then rmdir -- "$vendors_dir"; fi
  fi
  rm -rf -- "$work"
}

commit() {
  if [[ -e $vendor_dir ]]; then
    old_tree=$(mktemp -u "$vendors_dir/.$vendor.old.XXXXXX")
    mv -- "$vendor_dir" "$old_tree"
  fi
  mv -- "$staging" "$vendor_dir"
  staging="" placed=yes
  if [[ $mode == default ]] && ! cmp -s -- "$config" "$work/config.ini"; then
    config_touched=yes
    replace_config "$config" "$work/config.ini" "$work/config.before"
  fi
  committed=yes
  if [[ -n $old_tree ]]; then rm -rf -- "$old_tree"; fi
}

main() {
  parse_args "$@"
  choose_target
  preflight
  started=no committed=no staging="" placed=no old_tree="" config_touched=no made_vendors_dir=no
  work=$(mktemp -d "${TMPDIR:-/tmp}/flash_cann_install.XXXXXX")
  trap finish EXIT
  started=yes
  if [[ ! -d $vendors_dir ]]; then
    mkdir -- "$vendors_dir"
    made_vendors_dir=yes
  fi
  stage_tree
  commit
  say "installed $(record_get "$info" package) into $vendor_dir"
  if [[ $mode == default ]]; then
    say "$config lists '$vendor' first in load_priority"
  else
    say "before using the ops, run: source '$vendor_dir/bin/set_env.bash'"
  fi
  say "to uninstall: bash '$vendor_dir/scripts/uninstall.sh'"
}

main "$@"
