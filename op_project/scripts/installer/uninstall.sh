#!/bin/bash
# Uninstalls the flash-cann operator package this script was installed with (it lives in
# <vendors>/<vendor>/scripts/). It removes exactly what install.sh put there (scripts/install_manifest)
# and undoes its config.ini edit: the original bytes come back when nobody has edited config.ini since,
# otherwise only this vendor's entry is taken out. Every check runs before the first change.
set -euo pipefail

prog="flash-cann uninstall"
vendor_dir=$(CDPATH='' cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=install_lib.sh
source "$vendor_dir/scripts/install_lib.sh"

quiet=no
vendor=${vendor_dir##*/}
vendors_dir=${vendor_dir%/*}
config=$vendors_dir/config.ini

parse_args() {
  local arg
  for arg in "$@"; do
    case $arg in
      --quiet) quiet=yes ;;
      --help|-h)
        printf 'Usage: bash %s [--quiet]\nRemoves the flash-cann package installed in %s.\n' "$0" "$vendor_dir"
        exit 0 ;;
      *) die "unknown option '$arg' (usage: bash $0 [--quiet])" ;;
    esac
  done
}

# Decides what happens to config.ini and prepares it in work/config.ini; sets config_action to
# none, delete or replace.
plan_config() {
  local record state
  record=$(record_of "$vendor_dir")
  config_action=none
  [[ $(record_get "$record" mode) == default ]] || return 0
  state=$(config_state_now "$(record_get "$record" config_ini)" \
    "$(record_get "$record" config_ini_sha256)" "$config")
  case $state in
    unchanged) ;;
    created) config_action=delete ;;
    modified) config_action=replace; cp -- "$(config_backup_of "$vendor_dir")" "$work/config.ini" ;;
    superseded)
      [[ -e $config ]] || return 0
      edit_load_priority remove "$config" "$vendor" "$work/config.ini"
      if ! cmp -s -- "$config" "$work/config.ini"; then config_action=replace; fi
      say "config.ini was edited after the install; only '$vendor' is taken out of load_priority" ;;
    *) die "unreadable install record '$record' (config_ini=$state); nothing was changed" ;;
  esac
  if [[ $config_action == replace && -e $config && ! -w $config ]]; then
    die "'$config' is not writable by user $(id -un); nothing was changed"
  fi
}

finish() {
  if [[ $started == yes && $committed != yes ]]; then
    printf '%s: error: stopped before the end; putting everything back as it was\n' "$prog" >&2
    if [[ -n $moved_tree ]]; then mv -- "$moved_tree" "$vendor_dir"; fi
    if [[ $config_touched == yes ]]; then restore_config "$config" "$work/config.before"; fi
  fi
  rm -rf -- "$work"
}

main() {
  parse_args "$@"
  require_writable_dir "$vendors_dir" "the vendors directory"
  require_own_tree "$vendor_dir"
  require_removable_tree "$vendor_dir"
  started=no committed=no moved_tree="" config_touched=no
  work=$(mktemp -d "${TMPDIR:-/tmp}/flash_cann_uninstall.XXXXXX")
  trap finish EXIT
  plan_config
  local vendors_created
  vendors_created=$(record_get "$(record_of "$vendor_dir")" vendors_dir_created)
  # Moving the tree aside first makes the removal all-or-nothing for the loader: the vendor is either
  # fully there or gone, and a config.ini failure can still put it back.
  started=yes
  moved_tree=$(mktemp -u "$vendors_dir/.$vendor.removed.XXXXXX")
  mv -- "$vendor_dir" "$moved_tree"
  case $config_action in
    delete) config_touched=yes; replace_config "$config" "" "$work/config.before" ;;
    replace) config_touched=yes; replace_config "$config" "$work/config.ini" "$work/config.before" ;;
  esac
  committed=yes
  rm -rf -- "$moved_tree"
  if [[ $vendors_created == yes ]] && [[ -z $(ls -A -- "$vendors_dir") ]]; then rmdir -- "$vendors_dir"; fi
  say "removed $vendor_dir"
}

main "$@"
