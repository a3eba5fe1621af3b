#!/bin/bash
# flash-cann operator package: a self-extracting installer. make_run.py fills in the @...@ values and
# appends the payload (a gzip'd tar) after the final `exit` line; bash never reads past that line.
# The payload's sha256 is checked before anything is unpacked or installed.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -euo pipefail

readonly payload_sha256='@PAYLOAD_SHA256@'
readonly payload_first_line='@PAYLOAD_FIRST_LINE@'
readonly package='@PACKAGE@'

die() {
  printf 'flash-cann package: error: %s\n' "$*" >&2
  exit 1
}

usage() {
  printf 'This package: %s\n\n' "$package"
  cat <<'END_OF_HELP'
@HELP_TEXT@
END_OF_HELP
}

# Copies the payload out of this file into WORK/payload.tar.gz and checks its sha256, so that what
# is unpacked is exactly what was verified.
verified_payload() {  # WORK
  local actual
  command -v sha256sum > /dev/null || die "sha256sum (coreutils) is needed to verify this package"
  tail -n "+$payload_first_line" -- "$0" > "$1/payload.tar.gz"
  actual=$(sha256sum < "$1/payload.tar.gz")
  actual=${actual%% *}
  [[ $actual == "$payload_sha256" ]] ||
    die "checksum mismatch: '$0' is corrupt or truncated (payload sha256 $actual, expected $payload_sha256); nothing was installed"
}

main() {
  local action=install extract_dir="" arg
  local -a installer_args=()
  for arg in "$@"; do
    case $arg in
      --help|-h) usage; return 0 ;;
      --check) action=check ;;
      --extract=?*) action=extract; extract_dir=${arg#--extract=} ;;
      --extract|--extract=) die "--extract needs a directory: --extract=DIR" ;;
      *) installer_args+=("$arg") ;;  # install.sh checks these
    esac
  done
  if [[ $action == extract ]]; then
    [[ -d $extract_dir && -z $(ls -A -- "$extract_dir") ]] ||
      die "--extract='$extract_dir' must be an existing, empty directory"
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/flash_cann_run.XXXXXX")
  trap 'rm -rf -- "$work"' EXIT
  verified_payload "$work"
  case $action in
    check) printf 'ok: %s, payload sha256 %s\n' "$package" "$payload_sha256" ;;
    extract) tar -xzf "$work/payload.tar.gz" -C "$extract_dir" --no-same-owner ;;
    install)
      mkdir -- "$work/payload"
      tar -xzf "$work/payload.tar.gz" -C "$work/payload" --no-same-owner
      bash "$work/payload/install.sh" ${installer_args[@]+"${installer_args[@]}"} ;;
  esac
}

main "$@"
exit
