# shellcheck shell=bash disable=SC2154  # prog (the message prefix) is set by the sourcing script
# Helpers shared by install.sh and uninstall.sh (sourced, never run). One file, so that the two agree
# on the checks, the install record, the manifest and the config.ini edit. The callers set `prog`
# (message prefix) and `quiet` (yes/no). docs/packaging.md describes the behaviour.

say() {
  if [[ ${quiet:-no} != yes ]]; then printf '%s: %s\n' "$prog" "$*"; fi
}

die() {
  printf '%s: error: %s\n' "$prog" "$*" >&2
  exit 1
}

# Fails unless DIR is an existing directory in which this user may create and remove entries.
# `test -w` asks the kernel (access(2)), so a read-only mount fails it even for root.
require_writable_dir() {  # DIR WHAT
  [[ -d $1 ]] || die "$2 '$1' does not exist or is not a directory; nothing was changed"
  [[ -w $1 && -x $1 ]] || die "$2 '$1' is not writable by user $(id -un); nothing was changed"
}

# Fails unless every directory in TREE is writable, so that removing TREE cannot stop half way.
require_removable_tree() {  # TREE
  local blocked
  blocked=$(find "$1" -type d ! -writable -print)
  [[ -z $blocked ]] || die "cannot remove '$1': these directories are not writable by user $(id -un) (nothing was changed):
$blocked"
}

# Prints the sha256 of FILE, or "absent" when there is no such file.
sha256_or_absent() {  # FILE
  local sum
  if [[ ! -e $1 ]]; then
    printf 'absent\n'
    return 0
  fi
  sum=$(sha256sum < "$1")
  printf '%s\n' "${sum%% *}"
}

# Lists everything under DIR, a type letter (f, d, l) and a ./path per line, sorted bytewise. The
# install manifest is this listing taken when the install is complete; comparing a later listing with
# it tells exactly what the install put there.
tree_listing() {  # DIR
  (cd -- "$1" && find . -mindepth 1 -printf '%y %p\n' | LC_ALL=C sort)
}

manifest_of() { printf '%s\n' "$1/scripts/install_manifest"; }
record_of() { printf '%s\n' "$1/scripts/install.record"; }
config_backup_of() { printf '%s\n' "$1/scripts/config.ini.orig"; }

# Fails, changing nothing, unless VENDOR_DIR was installed by this installer and holds nothing that
# its manifest does not list (files someone added would otherwise be deleted with it).
require_own_tree() {  # VENDOR_DIR
  local extra
  [[ -f $(record_of "$1") && -f $(manifest_of "$1") ]] ||
    die "'$1' exists but was not installed by flash-cann's installer (no scripts/install.record); move it away first; nothing was changed"
  extra=$(LC_ALL=C comm -13 "$(manifest_of "$1")" <(tree_listing "$1"))
  [[ -z $extra ]] || die "'$1' holds entries that flash-cann did not install; move them away, then retry (nothing was changed):
$extra"
}

# Prints KEY's value from an install record (empty when absent).
record_get() {  # RECORD KEY
  local line
  while IFS= read -r line; do
    if [[ $line == "$2="* ]]; then
      printf '%s\n' "${line#*=}"
      return 0
    fi
  done < "$1"
}

# The config.ini state to act on: STATE as recorded, unless config.ini is no longer what this
# installer left (RECORDED_SHA), in which case someone else has edited it since and the answer is
# "superseded": only our own entry may then be removed, never the whole file restored.
config_state_now() {  # STATE RECORDED_SHA CONFIG_INI
  if [[ $1 == superseded || $(sha256_or_absent "$3") != "$2" ]]; then
    printf 'superseded\n'
  else
    printf '%s\n' "$1"
  fi
}

# Prints S without leading and trailing blanks (vendor names are compared this way; text is kept).
trimmed() {  # S
  local s=$1
  s=${s#"${s%%[![:space:]]*}"}
  printf '%s' "${s%"${s##*[![:space:]]}"}"
}

# Writes CONFIG_INI (a missing file reads as empty) to OUT with VENDOR put first in (add), or taken out
# of (remove), the list on the first `load_priority=` line (blanks around the key allowed, as CANN's
# installer and python/flash_cann/backends/npu/opp_paths.py read it). Everything else is copied unchanged: the
# other vendors and their order, other lines, CRLF line ends, a missing final newline. A line already
# starting with VENDOR is left byte for byte (so a reinstall changes nothing). `add` also fills an
# empty `load_priority=` and appends the line when there is none: the cases in which CANN's own
# installer leaves the file without its vendor (docs/packaging.md).
edit_load_priority() {  # add|remove CONFIG_INI VENDOR OUT
  local action=$1 config=$2 vendor=$3 out=$4
  local -a lines=() entries=() others=()
  local i line key cr entry final_newline=yes found=no IFS
  if [[ -f $config ]]; then
    mapfile -t lines < "$config"
    if [[ -s $config && -n $(tail -c 1 "$config") ]]; then final_newline=no; fi
  fi
  for i in "${!lines[@]}"; do
    line=${lines[i]}
    key=${line%%=*}
    [[ $found == no && $line == *=* && $(trimmed "$key") == load_priority ]] || continue
    found=yes
    cr=""
    if [[ $line == *$'\r' ]]; then cr=$'\r'; line=${line%$'\r'}; fi
    IFS=, read -r -a entries <<< "${line#*=}"
    others=()
    for entry in ${entries[@]+"${entries[@]}"}; do
      [[ $(trimmed "$entry") == "$vendor" ]] || others+=("$entry")
    done
    IFS=,
    if [[ $action == add ]]; then
      if [[ ${#entries[@]} -eq 0 || $(trimmed "${entries[0]}") != "$vendor" ]]; then
        lines[i]="$key=$vendor${others[*]+,${others[*]}}$cr"
      fi
    elif [[ ${#others[@]} -ne ${#entries[@]} ]]; then
      lines[i]="$key=${others[*]+${others[*]}}$cr"
    fi
    unset IFS
  done
  if [[ $found == no && $action == add ]]; then
    lines+=("load_priority=$vendor")
    final_newline=yes
  fi
  : > "$out"
  if [[ ${#lines[@]} -gt 0 ]]; then
    if [[ ${#lines[@]} -gt 1 ]]; then printf '%s\n' "${lines[@]:0:${#lines[@]}-1}" >> "$out"; fi
    printf '%s' "${lines[${#lines[@]}-1]}" >> "$out"
    if [[ $final_newline == yes ]]; then printf '\n' >> "$out"; fi
  fi
}

# Replaces DEST's content with SRC's by writing into DEST itself, so that DEST keeps its inode, owner
# and permissions (config.ini usually belongs to the CANN install user).
write_in_place() {  # SRC DEST
  cat -- "$1" > "$2"
}

# Gives CONFIG the content of NEW, or deletes it when NEW is "", after copying what was there to
# SAVED, from which restore_config puts it back if a later step fails.
replace_config() {  # CONFIG NEW SAVED
  if [[ -e $1 ]]; then cp -- "$1" "$3"; fi
  if [[ -n $2 ]]; then write_in_place "$2" "$1"; else rm -f -- "$1"; fi
}

restore_config() {  # CONFIG SAVED
  if [[ -e $2 ]]; then write_in_place "$2" "$1"; else rm -f -- "$1"; fi
}
