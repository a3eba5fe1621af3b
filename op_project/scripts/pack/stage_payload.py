#!/usr/bin/env python3
"""Builds the flash-cann package payload (the tree inside the .run) from a list of built files.

This is the one place that knows the package layout; docs/packaging.md describes it and
tests/test_package.py checks that the two agree. The CANN build runs it (op_project/cmake/payload.cmake,
target `package`) on the real libraries and kernels, the tests on stand-in files.

The file list has one `ROLE<TAB>PATH` per line. ROLE names a slot of the layout (ROLES below); roles
per compute unit or framework carry it as a qualifier, e.g. `ops_info@ascend910b`. Python stdlib only,
so that it runs with whatever python3 the build machine has.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

INSTALLER_DIR = Path(__file__).resolve().parent.parent / "installer"

# Names that may appear in the payload: the installer's manifest is one path per line, and CANN
# derives names from op types, SoCs and hashes, which all fit.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@=-]*")
VENDOR_NAME = re.compile(r"[A-Za-z0-9_]+")  # a directory name and an entry of config.ini's list
KERNEL_PACKAGES = ("binary", "source")


@dataclass(frozen=True)
class Role:
    destination: str  # under packages/vendors/<vendor>/; {arch}, {vendor}, {qualifier} filled in
    what: str
    count: str = "one"  # "one", "one or more" or "any"
    qualifier: str = ""  # "soc": one entry per compute unit; "framework": a framework name
    is_dir: bool = False  # PATH is a directory whose content is copied
    kernels: str = ""  # required when this kernel package is built, refused when it is not


ROLES = {
    "op_api_lib": Role("op_api/lib", "aclnn API library (libcust_opapi.so)"),
    "op_api_header": Role("op_api/include", "aclnn API header, one per op (aclnn_<op>.h)",
                          count="one or more"),
    "op_proto_lib": Role("op_proto/lib/linux/{arch}",
                         "op prototype library for graph mode (libcust_opsproto_rt2.0.so)"),
    "op_proto_header": Role("op_proto/inc", "op prototype header (op_proto.h)"),
    "op_tiling_lib": Role("op_impl/ai_core/tbe/op_tiling/lib/linux/{arch}",
                          "tiling library (libcust_opmaster_rt2.0.so)"),
    "ops_info": Role("op_impl/ai_core/tbe/config/{qualifier}",
                     "op information library (aic-<soc>-ops-info.json)", qualifier="soc"),
    "kernel_binaries": Role("op_impl/ai_core/tbe/kernel/{qualifier}",
                            "kernel binaries: <op>/<OpType>_<hash>.o and .json per variant",
                            qualifier="soc", is_dir=True, kernels="binary"),
    "kernel_config": Role("op_impl/ai_core/tbe/kernel/config/{qualifier}",
                          "kernel selection tables (binary_info_config.json, <op>.json)",
                          qualifier="soc", is_dir=True, kernels="binary"),
    "kernel_source": Role("op_impl/ai_core/tbe/{vendor}_impl/dynamic",
                          "kernel sources for online compilation (<op>.cpp, headers, <op>.py)",
                          is_dir=True, kernels="source"),
    "framework": Role("framework/{qualifier}", "framework plugin files", count="any",
                      qualifier="framework"),
}

TILING_COMPAT_LINK = "op_impl/ai_core/tbe/op_tiling/liboptiling.so"  # CANN's older name for the lib
SHIPPED_SCRIPTS = {  # installer file -> payload path (relative to the payload root)
    "install.sh": "install.sh",
    "help.info": "help.info",
    "set_env.bash": "set_env.bash",
    "uninstall.sh": "packages/vendors/{vendor}/scripts/uninstall.sh",
    "install_lib.sh": "packages/vendors/{vendor}/scripts/install_lib.sh",
}
EXECUTABLE = {"install.sh", "uninstall.sh"}


class LayoutError(Exception):
    pass


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-list", required=True, type=Path, help="ROLE<TAB>PATH lines")
    parser.add_argument("--out", required=True, type=Path, help="payload directory to create")
    parser.add_argument("--vendor", required=True)
    parser.add_argument("--version", required=True, help="flash-cann version")
    parser.add_argument("--arch", required=True, help="target CPU architecture, e.g. aarch64")
    parser.add_argument("--compute-units", required=True, help="comma-separated, e.g. ascend910b")
    parser.add_argument("--kernel-packages", required=True, help="binary, source or binary,source")
    parser.add_argument("--compiler-version", required=True,
                        help="CANN compiler version, written to version.info")
    args = parser.parse_args(argv)
    if not VENDOR_NAME.fullmatch(args.vendor):
        parser.error(f"--vendor={args.vendor!r}: use letters, digits and '_' only")
    args.compute_units = [unit for unit in args.compute_units.split(",") if unit]
    if not args.compute_units or not all(SAFE_NAME.fullmatch(unit) for unit in args.compute_units):
        parser.error("--compute-units: expected a comma-separated list of SoC names")
    args.kernel_packages = [kind for kind in args.kernel_packages.split(",") if kind]
    if not args.kernel_packages or not set(args.kernel_packages) <= set(KERNEL_PACKAGES):
        parser.error("--kernel-packages: expected binary, source or binary,source")
    for option in ("version", "arch", "compiler_version"):
        if not re.fullmatch(r"[^\n']+", getattr(args, option)):
            parser.error(f"--{option.replace('_', '-')}: must be one line without quotes")
    if args.out.exists():
        parser.error(f"--out={args.out}: already exists (remove it first)")
    return args


def read_file_list(path: Path, args) -> list[tuple[str, str, Path]]:
    """(role, qualifier, source) per line, with the role and qualifier checked."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        role_text, tab, source = line.partition("\t")
        if not tab or not source:
            raise LayoutError(f"{where}: expected ROLE<TAB>PATH, got {line!r}")
        name, _, qualifier = role_text.partition("@")
        role = ROLES.get(name)
        if role is None:
            raise LayoutError(f"{where}: unknown role {name!r}; roles: {', '.join(ROLES)}")
        if bool(role.qualifier) != bool(qualifier):
            needed = f"needs a {role.qualifier}: {name}@<{role.qualifier}>" if role.qualifier \
                else "takes no @qualifier"
            raise LayoutError(f"{where}: role {role_text!r} {needed}")
        if role.qualifier == "soc" and qualifier not in args.compute_units:
            raise LayoutError(f"{where}: {role_text!r}: {qualifier!r} is not one of the compute "
                              f"units {','.join(args.compute_units)}")
        if qualifier and not SAFE_NAME.fullmatch(qualifier):
            raise LayoutError(f"{where}: {role_text!r}: bad qualifier {qualifier!r}")
        if role.kernels and role.kernels not in args.kernel_packages:
            raise LayoutError(f"{where}: {role_text!r} is given but the {role.kernels} kernel "
                              f"package is not being built")
        source_path = Path(source)
        if not (source_path.is_dir() if role.is_dir else source_path.is_file()):
            kind = "directory" if role.is_dir else "file"
            raise LayoutError(f"{where}: {role_text!r}: {source!r} is not an existing {kind}")
        entries.append((name, qualifier, source_path))
    return entries


def check_counts(entries, args):
    """Every required slot is filled, once per compute unit where the role is per SoC."""
    given = {}
    for name, qualifier, _ in entries:
        given.setdefault((name, qualifier), 0)
        given[(name, qualifier)] += 1
    for name, role in ROLES.items():
        if (role.kernels and role.kernels not in args.kernel_packages) or role.count == "any":
            continue
        for qualifier in args.compute_units if role.qualifier == "soc" else [""]:
            label = f"{name}@{qualifier}" if qualifier else name
            count = given.get((name, qualifier), 0)
            if count == 0:
                raise LayoutError(f"missing {label}: {role.what}")
            if count > 1 and role.count == "one":
                raise LayoutError(f"{label} is given {count} times; the layout has one {role.what}")


def checked_name(name: str, source: Path) -> str:
    if not SAFE_NAME.fullmatch(name):
        raise LayoutError(f"{source}: the name {name!r} is not allowed in the payload "
                          f"(letters, digits and _ . + @ = - only)")
    return name


def place_file(source: Path, destination: Path, staged: dict[Path, Path]):
    if destination in staged:
        raise LayoutError(f"{source} and {staged[destination]} would both become {destination}")
    staged[destination] = source
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)
    executable = destination.suffix == ".so" or destination.name in EXECUTABLE
    destination.chmod(0o755 if executable else 0o644)


def place_tree(source: Path, destination: Path, staged: dict[Path, Path]):
    files = sorted(p for p in source.rglob("*") if not p.is_dir() or p.is_symlink())
    if not files:
        raise LayoutError(f"{source} is empty: the build produced nothing for it")
    for path in files:
        if path.is_symlink() or not path.is_file():
            raise LayoutError(f"{path}: only regular files are packaged")
        relative = path.relative_to(source)
        for part in relative.parts:
            checked_name(part, path)
        place_file(path, destination / relative, staged)


def write_text(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o644)


def stage(args):
    entries = read_file_list(args.file_list, args)
    check_counts(entries, args)
    vendor_tree = args.out / "packages" / "vendors" / args.vendor
    staged: dict[Path, Path] = {}
    for name, qualifier, source in entries:
        role = ROLES[name]
        destination = vendor_tree / role.destination.format(arch=args.arch, vendor=args.vendor,
                                                            qualifier=qualifier)
        if role.is_dir:
            place_tree(source, destination, staged)
        else:
            place_file(source, destination / checked_name(source.name, source), staged)
    for installer_file, payload_path in SHIPPED_SCRIPTS.items():
        place_file(INSTALLER_DIR / installer_file,
                   args.out / payload_path.format(vendor=args.vendor), staged)
    tiling_lib = next(source for name, _, source in entries if name == "op_tiling_lib")
    link = vendor_tree / TILING_COMPAT_LINK
    link.symlink_to(Path("lib", "linux", args.arch, tiling_lib.name))
    write_text(vendor_tree / "version.info", f"custom_opp_compiler_version={args.compiler_version}\n")
    units, kernels = ",".join(args.compute_units), ",".join(args.kernel_packages)
    write_text(vendor_tree / "scripts" / "package.info", "".join(f"{key}={value}\n" for key, value in [
        ("package", f"flash-cann {args.version}, vendor {args.vendor}, for {units} on {args.arch}, "
                    f"{kernels} kernels, CANN compiler {args.compiler_version}"),
        ("vendor", args.vendor),
        ("version", args.version),
        ("arch", args.arch),
        ("compute_units", units),
        ("kernel_packages", kernels),
        ("compiler_version", args.compiler_version),
    ]))
    for directory in [args.out, *(p for p in args.out.rglob("*") if p.is_dir() and not p.is_symlink())]:
        directory.chmod(0o755)


def main(argv=None):
    args = parse_args(argv)
    try:
        stage(args)
    except LayoutError as error:
        shutil.rmtree(args.out, ignore_errors=True)
        sys.exit(f"stage_payload.py: error: {error}")
    print(f"stage_payload.py: payload for vendor {args.vendor} in {args.out}")


if __name__ == "__main__":
    main()
