"""The NPU shim on a machine without an NPU: `import torch` and `import flash_cann` work
with torch_npu absent, broken, or autoloaded by torch; nothing NPU-related is imported
until asked for; and what is missing is named with how to install it. Also where the
op package's library is looked for (flash_cann.backends.npu.opp_paths)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from flash_cann.backends.npu import opp_paths
from flash_cann.backends.npu import launcher as npu

from contract import RAW

ROOT = Path(__file__).resolve().parents[1]

INSTALL_HINT = " ".join(RAW["backends"]["npu"]["install_hint"].split())

PROBE = """
import json, sys
import torch
import flash_cann
from flash_cann.contract import ops
from flash_cann.backends.npu import launcher as npu
state = {"imported": sorted(m for m in ("torch_npu", "torchair", "flash_cann_npu")
                            if m in sys.modules)}
state["reason"] = npu.unavailable_reason()
state["available"] = npu.available()
state["best_device"] = str(ops.best_device())
q = torch.randn(1, 2, 4, 8)
state["cpu_attention"] = list(flash_cann.attention(q, q, q, causal=True).shape)
print(json.dumps(state))
"""


def _start_probe(path=(), **env) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    environ.update(env)
    if path:
        environ["PYTHONPATH"] = os.pathsep.join(map(str, path))
    return subprocess.Popen([sys.executable, "-c", PROBE], env=environ, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _broken_torch_npu(directory: Path, error: str, entry_point: bool) -> Path:
    """A torch_npu that raises on import, as the real one does without CANN."""
    (directory / "torch_npu").mkdir(parents=True)
    (directory / "torch_npu" / "__init__.py").write_text(
        f"raise {error}\ndef _autoload():\n    pass\n")
    if entry_point:  # what torch_npu >= 2.5.1 installs: torch imports it at `import torch`
        dist = directory / "torch_npu-2.13.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\n"
                                       "Version: 2.13.0\n")
        (dist / "entry_points.txt").write_text("[torch.backends]\n"
                                               "torch_npu = torch_npu:_autoload\n")
    return directory


BROKEN = {  # id: (the exception torch_npu raises, installs torch's autoload entry point)
    "ImportError, autoload off": (
        "ImportError('libhccl.so: cannot open shared object file: No such file or directory')",
        True),
    "RuntimeError": ("RuntimeError('no NPU driver')", False),
}


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Each scenario in a fresh interpreter, all at once (they are independent)."""
    started = {}
    if importlib.util.find_spec("torch_npu") is None:
        started["absent"] = _start_probe()
    for name, (error, entry_point) in BROKEN.items():
        path = _broken_torch_npu(tmp_path_factory.mktemp("broken"), error, entry_point)
        # With the autoload entry point, `import torch` itself fails unless autoload is
        # off (torch's behaviour, docs/npu.md); flash_cann adds no entry point of its own.
        started[name] = _start_probe([path], **({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
                                                if entry_point else {}))
    states = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=3600)
        assert process.returncode == 0, stderr
        states[name] = json.loads(stdout.splitlines()[-1])
    return states


def _check_cpu_only(state):
    assert state["imported"] == []  # import flash_cann imported none of them
    assert state["available"] is False
    assert state["best_device"] == "cpu"
    assert state["cpu_attention"] == [1, 2, 4, 8]


def test_import_without_torch_npu(probes):
    if "absent" not in probes:
        pytest.skip("torch_npu is installed here")
    assert probes["absent"]["reason"] == f"torch_npu is not installed: {INSTALL_HINT}"
    _check_cpu_only(probes["absent"])


@pytest.mark.parametrize("scenario", BROKEN)
def test_import_with_a_broken_torch_npu(probes, scenario):
    state = probes[scenario]
    exc_type, _, message = BROKEN[scenario][0].partition("(")
    assert state["reason"] == (f"torch_npu does not import ({exc_type}: {message[1:-2]}): "
                               f"{INSTALL_HINT}")
    _check_cpu_only(state)


@pytest.fixture
def fake_torch_npu(monkeypatch):
    """An imported torch_npu (a stand-in object): the checks after it can run."""
    monkeypatch.setitem(sys.modules, "torch_npu",
                        SimpleNamespace(npu=SimpleNamespace(is_available=lambda: True)))
    return sys.modules["torch_npu"]


def test_no_npu_is_named(fake_torch_npu, monkeypatch):
    monkeypatch.setattr(fake_torch_npu.npu, "is_available", lambda: False)
    assert npu.unavailable_reason() == ("torch_npu sees no NPU "
                                        "(torch_npu.npu.is_available() is False)")
    with pytest.raises(RuntimeError, match="flash_cann: the NPU backend cannot run: "
                                           "torch_npu sees no NPU"):
        npu.forward(None, None, None, None, scale=1.0, causal=False, layout="BNSD")


def test_missing_extension_says_how_to_build_it(fake_torch_npu):
    assert npu.unavailable_reason() == (
        "flash-cann's NPU extension (flash_cann_npu._launcher) is not installed: build it on "
        "the Ascend server with `pip install --no-build-isolation ./framework` from the "
        "flash-cann repository (docs/npu.md)")


def test_missing_op_package_says_what_was_searched(fake_torch_npu, monkeypatch, tmp_path):
    monkeypatch.setattr(npu, "_load_extension", lambda: SimpleNamespace())
    monkeypatch.delenv("ASCEND_CUSTOM_OPP_PATH", raising=False)
    monkeypatch.delenv("ASCEND_OPP_PATH", raising=False)
    assert npu.unavailable_reason() == (
        "the flash-cann CANN package's libcust_opapi.so was not found (neither "
        "ASCEND_CUSTOM_OPP_PATH nor ASCEND_OPP_PATH (with vendors/config.ini load_priority) "
        f"is set): {INSTALL_HINT}")
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(tmp_path / "vendors" / "flash_cann"))
    assert f"(searched {tmp_path / 'vendors' / 'flash_cann' / opp_paths.LIBRARY})" in \
        npu.unavailable_reason()


def _library(root: Path, vendor: str) -> Path:
    path = root / "vendors" / vendor / opp_paths.LIBRARY
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    return path


def test_search_order_is_torch_npus(tmp_path):
    custom = tmp_path / "custom"
    opp = tmp_path / "opp"
    first, second = _library(custom, "mine"), _library(custom, "theirs")
    (opp / "vendors").mkdir(parents=True)
    (opp / "vendors" / "config.ini").write_text(
        "# installed vendors\nload_priority = zeta, customize ,alpha\n")
    zeta, alpha = _library(opp, "zeta"), _library(opp, "alpha")  # no "customize" installed
    environ = {"ASCEND_CUSTOM_OPP_PATH": f"{first.parents[2]}::{second.parents[2]}:"
                                         f"{first.parents[2]}",
               "ASCEND_OPP_PATH": str(opp)}
    assert opp_paths.candidates(environ) == [str(p) for p in (first, second, zeta, alpha)]
    assert opp_paths.search_path(environ)[-2] == opp / "vendors" / "customize" / opp_paths.LIBRARY


def test_no_config_ini_means_no_vendors(tmp_path):
    assert opp_paths.search_path({"ASCEND_OPP_PATH": str(tmp_path)}) == []
    assert opp_paths.describe_search({}) == (
        "neither ASCEND_CUSTOM_OPP_PATH nor ASCEND_OPP_PATH (with vendors/config.ini "
        "load_priority) is set")


FAKE_NPU = Path(__file__).resolve().parent / "npu_standins" / "fake_npu"
LAZY_TORCHAIR = {  # id: environment of tests/npu_standins/fake_npu/lazy_torchair.py
    "torch_npu 2.1-2.8 (proxy at import)": {"FAKE_TORCH_NPU_TORCHAIR": "import"},
    "torch_npu 2.9+ (proxy at Dynamo set-up)": {"FAKE_TORCH_NPU_TORCHAIR": "dynamo"},
    "torchair imported first": {"FAKE_TORCH_NPU_TORCHAIR": "import", "IMPORT_TORCHAIR_FIRST": "1"},
    "torchair fails to load": {"FAKE_TORCH_NPU_TORCHAIR": "import",
                               "FAKE_TORCHAIR_IMPORT_ERROR": "libge_runner.so: cannot open"},
}


@pytest.fixture(scope="module")
def lazy_torchair():
    """A session under torch_npu's lazy torchair proxy, for each case, in fresh processes."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(FAKE_NPU), str(ROOT / "python")])
    started = {name: subprocess.Popen([sys.executable, str(FAKE_NPU / "lazy_torchair.py")],
                                      env={**environ, **env}, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for name, env in LAZY_TORCHAIR.items()}
    states = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=3600)
        assert process.returncode == 0, stderr
        states[name] = json.loads(stdout.splitlines()[-1])
    return states


@pytest.mark.parametrize("case", list(LAZY_TORCHAIR)[:2])
def test_import_flash_cann_under_torch_npus_lazy_torchair(lazy_torchair, case):
    """The proxy is in sys.modules (after import torch_npu, or after a first
    torch.compile), torchair is not loaded: import flash_cann must neither touch the
    proxy's attributes (it raises) nor load torchair; enable_torchair() loads it through
    the proxy and registers with the package the proxy forwards to."""
    state = lazy_torchair[case]
    timing = LAZY_TORCHAIR[case]["FAKE_TORCH_NPU_TORCHAIR"]
    assert state["proxy_after_torch_npu"] == ("_LazyTorchair" if timing == "import"
                                              else "NoneType")
    assert state["proxy_after_compile"] == "_LazyTorchair"
    assert state["import_flash_cann"] == "ok"
    assert not state["torchair_loaded_by_import"] and not state["registered_at_import"]
    assert state["enable_torchair"] == "ok"
    assert state["torchair_loaded"] and state["registered"]
    assert state["registered_with"] == "torch_npu.dynamo.torchair"


def test_import_flash_cann_after_torchair_was_imported_through_the_proxy_registers(lazy_torchair):
    state = lazy_torchair["torchair imported first"]
    assert state["import_torchair"] == "ok" and state["import_flash_cann"] == "ok"
    assert state["registered_at_import"]
    assert state["registered_with"] == "torch_npu.dynamo.torchair"


def test_torchair_failing_to_load_through_the_proxy_is_reported(lazy_torchair):
    state = lazy_torchair["torchair fails to load"]
    assert state["import_flash_cann"] == "ok"
    assert state["enable_torchair"].startswith(
        "ImportError: flash_cann.enable_torchair() needs torchair, which ships with torch_npu "
        "and needs CANN (ImportError: libge_runner.so: cannot open)")
    assert not state["registered"]


def test_blocked_torch_npu_import_is_named_not_crashed_on(monkeypatch):
    """sys.modules["torch_npu"] = None (how imports are blocked) is not an imported module."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    assert npu.unavailable_reason() == f"torch_npu is not installed: {INSTALL_HINT}"
