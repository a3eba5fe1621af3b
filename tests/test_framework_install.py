"""The documented ``pip install --no-build-isolation ./framework``, run as the docs print it.

The command is read from docs/npu.md and README.md (so a changed doc command changes what
runs) and executed with ``bash -c`` in a clean copy of the repository's files, by a ``pip``
on PATH that installs into a fresh virtual environment seeing this environment's packages
(torch, setuptools): ``--no-build-isolation`` means exactly that environment.

torch_npu is the real torch-npu wheel's ``torch_npu`` directory (its headers, its
``libtorch_npu.so`` and its own ``utils/cpp_extension.py``, whose ``NpuExtension`` the setup
script calls) with one stand-in: ``torch_npu/__init__.py`` is empty, because the real one
needs CANN to import. So the extension is compiled against the wheel's headers and linked
by the wheel's recipe against its real ``libtorch_npu.so``; then every undefined symbol of
the built extension is looked up in the dynamic symbol tables of the libraries it links:
the real ``libtorch_npu.so``, torch's and the C/C++ runtime's. CANN's own libraries are not
linked by the extension (it opens the op package's ``libcust_opapi.so`` at run time), so no
CANN stand-in is needed for the symbol check; the check fails if one ever is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from doc_commands import SERVER_DOCS, clean_copy, documented_commands
from torch_npu_wheel import torch_npu_wheel

ROOT = Path(__file__).resolve().parents[1]
DOCS = SERVER_DOCS
COMMAND = re.compile(r"^pip install --no-build-isolation \./framework\b")


def framework_commands(paths=DOCS) -> dict[str, list[str]]:
    return documented_commands(paths, COMMAND)


def test_the_docs_print_the_framework_install_command():
    found = framework_commands()
    assert found, f"no `pip install --no-build-isolation ./framework` in {[p.name for p in DOCS]}"
    printed_in = {name for names in found.values() for name in names}
    assert printed_in == {p.name for p in DOCS}, f"printed only in {sorted(printed_in)}"


def test_documented_commands_are_found_and_comments_dropped(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\nsource x\npip install --no-build-isolation ./framework   # why\n"
                   "```\n\n```python\npip install --no-build-isolation ./framework -v\n```\n"
                   "pip install --no-build-isolation ./framework --user\n")
    assert framework_commands([doc]) == {
        "pip install --no-build-isolation ./framework": ["doc.md"]}


def _torch_npu_package(wheel: Path, dest: Path) -> Path:
    """A site directory whose torch_npu is the wheel's, but for an empty ``__init__.py``."""
    package = dest / "torch_npu"
    (package / "utils").mkdir(parents=True)
    for part in ("include", "lib"):
        (package / part).symlink_to(wheel / part)
    (package / "__init__.py").write_text('"""TEST stand-in: the real one needs CANN."""\n')
    (package / "utils" / "__init__.py").write_text("")
    (package / "utils" / "cpp_extension.py").write_bytes(
        _wheel_file("torch_npu/utils/cpp_extension.py"))  # the wheel's own NpuExtension
    return dest


def _wheel_file(name: str) -> bytes:
    import zipfile
    from torch_npu_wheel import CACHE
    with zipfile.ZipFile(sorted((CACHE / "download").glob("torch_npu-*.whl"))[0]) as whl:
        return whl.read(name)


def _environment(tmp_path: Path) -> dict:
    """A venv whose ``pip`` installs into itself and sees this environment's packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    import sysconfig
    (site / "outer.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    (venv / "bin" / "pip").write_text(f'#!/bin/sh\nexec "{venv}/bin/python" -m pip "$@"\n')
    (venv / "bin" / "pip").chmod(0o755)
    env = dict(os.environ, VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    env.pop("PYTHONHOME", None)
    return env, site


def _dynamic_symbols(library: Path, defined: bool) -> set[str]:
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, str(library)], capture_output=True, text=True,
                         check=True).stdout
    symbols = set()
    for line in out.splitlines():
        parts = line.split()
        kind, name = parts[-2], parts[-1]
        if not defined and kind in ("w", "v"):
            continue  # weak references need no definition
        symbols.add(name.split("@", 1)[0])
    return symbols


def _needed(library: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                         check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _system_library(name: str) -> Path:
    out = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True,
                         check=True).stdout.strip()
    if out != name and Path(out).exists():
        return Path(out).resolve()
    for line in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines():
        if line.strip().startswith(name + " "):
            return Path(line.rsplit("=>", 1)[1].strip()).resolve()
    pytest.fail(f"{name} (needed by the extension) not found on this system")


def unresolved_symbols(extension: Path, torch_npu_lib: Path) -> tuple[set[str], list[str]]:
    """The extension's undefined dynamic symbols that none of its NEEDED libraries defines,
    and those libraries; libtorch_npu.so is the real wheel's."""
    torch_lib = Path(torch.__file__).parent / "lib"
    libraries = []
    for name in _needed(extension):
        if name == "libtorch_npu.so":
            libraries.append(torch_npu_lib)
        elif (torch_lib / name).is_file():
            libraries.append(torch_lib / name)
        else:
            libraries.append(_system_library(name))
    defined = set().union(*(_dynamic_symbols(lib, True) for lib in libraries))
    return _dynamic_symbols(extension, False) - defined, [str(lib) for lib in libraries]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    wheel = torch_npu_wheel()
    tmp = tmp_path_factory.mktemp("framework_install")
    clone = clean_copy(tmp / "clone")
    env, site = _environment(tmp)
    _torch_npu_package(wheel, site)
    results = {}
    for command in framework_commands():
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env,
                              capture_output=True, text=True)
        results[command] = done
    return {"results": results, "site": site, "wheel": wheel, "clone": clone}


def test_the_documented_command_builds_and_installs_the_extension(installed):
    for command, done in installed["results"].items():
        assert done.returncode == 0, f"`{command}` failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    built = sorted(installed["site"].glob("flash_cann_npu/_launcher*.so"))
    assert built, f"no flash_cann_npu/_launcher*.so in {installed['site']}"


def test_every_symbol_of_the_installed_extension_resolves_in_the_real_libraries(installed):
    extension = sorted(installed["site"].glob("flash_cann_npu/_launcher*.so"))[0]
    real = installed["wheel"] / "lib" / "libtorch_npu.so"
    needed = _needed(extension)
    assert "libtorch_npu.so" in needed, f"the extension does not link libtorch_npu.so: {needed}"
    missing, libraries = unresolved_symbols(extension, real)
    assert not missing, (f"{len(missing)} symbols of {extension.name} are defined by none of "
                         f"{libraries}: {sorted(missing)[:20]}")
    torch_npu_symbols = _dynamic_symbols(extension, False) & _dynamic_symbols(real, True)
    assert torch_npu_symbols, "the extension uses nothing of libtorch_npu.so"


def test_a_symbol_missing_from_libtorch_npu_is_reported(tmp_path):
    """The check itself: an extension needing a symbol libtorch_npu.so lacks is caught."""
    src = tmp_path / "ext.c"
    src.write_text("void flash_cann_not_in_torch_npu(void);\n"
                   "void call(void) { flash_cann_not_in_torch_npu(); }\n")
    lib = tmp_path / "stub" / "libtorch_npu.so"
    lib.parent.mkdir()
    (tmp_path / "stub.c").write_text("void something_else(void) {}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "stub.c"), "-o", str(lib),
                    "-Wl,-soname,libtorch_npu.so"], check=True)
    ext = tmp_path / "ext.so"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(ext), f"-L{lib.parent}",
                    "-ltorch_npu"], check=True)
    missing, _ = unresolved_symbols(ext, lib)
    assert missing == {"flash_cann_not_in_torch_npu"}


WHEEL_INSTALL = re.compile(r"^pip install build_out/flash_cann_npu-\*\.whl$")
WHEEL_BUILD = "pip wheel --no-build-isolation --no-deps -w build_out ./framework"


def test_the_documented_wheel_builds_and_installs(installed, tmp_path):
    """The other route of docs/npu.md: `./build.sh` builds the extension as a wheel in
    build_out/ (its own line, run here through bash with build.sh's variables, in the clean
    copy: the rest of that build needs CANN), then `pip install build_out/flash_cann_npu-*.whl`
    as printed installs it into a fresh environment, where it resolves like the other."""
    source = (ROOT / "build.sh").read_text()
    (line,) = [l.strip() for l in source.splitlines() if l.strip().startswith("python3 -m pip wheel ")]
    # build.sh's line is the printed one, with build.sh's directories and its python3
    assert line.replace("python3 -m ", "", 1).replace('"$build_out"', "build_out") \
        .replace('"$repo/framework"', "./framework") == WHEEL_BUILD, line
    assert f"`{WHEEL_BUILD}`" in (ROOT / "docs" / "packaging.md").read_text()
    help_text = subprocess.run(["bash", str(ROOT / "build.sh"), "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert WHEEL_BUILD in help_text
    clone = installed["clone"]
    build_env, build_site = _environment(tmp_path / "build")
    _torch_npu_package(installed["wheel"], build_site)
    built = subprocess.run(["bash", "-c", f'repo=$1 build_out=$1/build_out; {line}', "_",
                            str(clone)], cwd=clone, env=build_env, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert sorted(p.name for p in (clone / "build_out").glob("flash_cann_npu-*.whl")), \
        sorted(p.name for p in (clone / "build_out").iterdir())
    env, site = _environment(tmp_path / "install")
    _torch_npu_package(installed["wheel"], site)
    commands = documented_commands(DOCS, WHEEL_INSTALL)
    assert commands, f"no `pip install build_out/flash_cann_npu-*.whl` in {[p.name for p in DOCS]}"
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, f"`{command}`:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    (extension,) = site.glob("flash_cann_npu/_launcher*.so")
    missing, libraries = unresolved_symbols(extension, installed["wheel"] / "lib" / "libtorch_npu.so")
    assert not missing, (sorted(missing)[:20], libraries)
