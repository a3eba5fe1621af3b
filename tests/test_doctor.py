"""`flash-cann doctor`: here (no CANN, no NPU) it names every missing part and exits 1; its
NPU branches run on the fake NPU (tests/npu_standins/fake_npu: the fake torch_npu, the NPU
extension built against the real torch-npu wheel, the fake op package) with a stand-in
toolkit, driver and device nodes made in a temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flash_cann.tools import doctor
from npu_extension_build import ROOT, build_extension, scenario_env

ASCEND_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH",
                    "ASCEND_CUSTOM_OPP_PATH", "ASCEND_DRIVER_PATH", "ASCEND_RT_VISIBLE_DEVICES")


def _doctor(env: dict, *args: str):
    done = subprocess.run([sys.executable, "-m", "flash_cann", "doctor", *args], env=env,
                          capture_output=True, text=True)
    return done


def _bare_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ASCEND_VARIABLES}
    env.update(PYTHONPATH=str(ROOT / "python"), ASCEND_DRIVER_PATH=str(tmp_path / "no driver"),
               FLASH_CANN_DOCTOR_DEVICES=str(tmp_path / "davinci[0-9]*"))
    return env


def _by_name(done) -> dict:
    return {c["name"]: c for c in json.loads(done.stdout)["checks"]}


def test_without_an_npu_every_missing_part_is_named_with_a_fix(tmp_path):
    done = _doctor(_bare_env(tmp_path), "--json")
    assert done.returncode == 1, done.stderr
    checks = _by_name(done)
    failed = {name for name, c in checks.items() if c["status"] == "fail"}
    assert failed == {"cann toolkit", "npu driver", "visible npus", "torch_npu", "op package",
                      "npu extension"}
    assert all(checks[name]["fix"] for name in failed)
    assert "pip install --no-build-isolation ./framework" in checks["npu extension"]["fix"]
    assert checks["smoke"]["status"] == "skip"
    text = _doctor(_bare_env(tmp_path))
    assert text.returncode == 1
    for name in failed:
        assert f"[fail] {name}" in text.stdout
    assert text.stdout.count("fix: ") == len(failed)
    assert "6 check(s) failed" in text.stdout


def _server(tmp_path: Path, build: Path) -> dict:
    """The fake NPU's environment plus a stand-in toolkit, driver and device nodes, and a
    copy of the fake op package with its op_proto library."""
    home = tmp_path / "toolkit" / "latest"
    (home / "x86_64-linux").mkdir(parents=True)
    (home / "x86_64-linux" / "ascend_toolkit_install.info").write_text("version=8.3.RC1\n")
    ccec = home / "compiler" / "ccec_compiler" / "bin" / "ccec"
    ccec.parent.mkdir(parents=True)
    ccec.write_text("#!/bin/sh\n")
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "version.info").write_text("Version=24.1.0\n")
    (tmp_path / "dev").mkdir()
    for i in range(2):
        (tmp_path / "dev" / f"davinci{i}").write_text("")
    vendor = tmp_path / "vendors" / "flash_cann"
    shutil.copytree(build / "vendors" / "flash_cann", vendor)
    proto = vendor / "op_proto" / "lib" / "linux" / "x86_64" / "libcust_opsproto_rt2.0.so"
    proto.parent.mkdir(parents=True)
    proto.write_text("stand-in")
    env = scenario_env(build, "doctor_aclnn.log")
    env.update(ASCEND_HOME_PATH=str(home), ASCEND_DRIVER_PATH=str(driver),
               FLASH_CANN_DOCTOR_DEVICES=str(tmp_path / "dev" / "davinci[0-9]*"),
               ASCEND_CUSTOM_OPP_PATH=f"{build / 'vendors' / 'other'}:{vendor}")
    return env


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return build_extension(tmp_path_factory)


def test_on_the_fake_npu_each_part_is_found_and_the_smoke_runs(build, tmp_path):
    done = _doctor(_server(tmp_path, build), "--json")
    checks = _by_name(done)
    for name in ("cann toolkit", "cann compiler", "npu driver", "visible npus", "torch_npu",
                 "torchair", "op package", "op package aclnn symbols", "op package op proto",
                 "npu extension", "soc", "plan"):
        assert checks[name]["status"] == "ok", (name, checks[name], done.stderr)
    assert "8.3.RC1" in checks["cann toolkit"]["detail"]
    assert "24.1.0" in checks["npu driver"]["detail"]
    assert "2 device node(s)" in checks["visible npus"]["detail"]
    assert "aclnnFlashCannAttentionGetWorkspaceSize" in checks["op package aclnn symbols"]["detail"]
    # another vendor's library comes first on ASCEND_CUSTOM_OPP_PATH: ours is the one found
    assert str(tmp_path / "vendors" / "flash_cann") in checks["op package"]["detail"]
    assert "Ascend910B2" in checks["plan"]["detail"]
    assert "the copy torch_npu" in checks["torchair"]["detail"]
    smoke = [c for name, c in checks.items() if name.startswith("smoke ")]
    assert [c["name"] for c in smoke] == [f"smoke {case.name}" for case in doctor._smoke_cases()]
    # the fake kernels do not compute attention: each case is run and judged, none passes
    assert all(c["status"] == "fail" and c["fix"] for c in smoke)
    assert done.returncode == 1


def test_a_torch_npu_of_another_torch_is_reported(build, tmp_path):
    env = _server(tmp_path, build)
    env["FAKE_TORCH_NPU_VERSION"] = "2.1.0"
    check = _by_name(_doctor(env, "--json"))["torch_npu"]
    assert check["status"] == "fail" and "does not match" in check["detail"]
    assert "pip install --no-build-isolation ./framework" in check["fix"]


def test_a_missing_op_proto_and_a_foreign_library_only_are_reported(build, tmp_path):
    env = _server(tmp_path, build)
    shutil.rmtree(tmp_path / "vendors" / "flash_cann" / "op_proto")
    checks = _by_name(_doctor(env, "--json"))
    assert checks["op package op proto"]["status"] == "fail"
    env["ASCEND_CUSTOM_OPP_PATH"] = str(build / "vendors" / "other")
    checks = _by_name(_doctor(env, "--json"))
    assert checks["op package"]["status"] == "fail"
    assert "another vendor's" in checks["op package"]["detail"]


def test_the_smoke_passes_when_the_npu_agrees_with_the_cpu(monkeypatch):
    """smoke() itself, with the CPU as the 'npu': every case within its tolerance; a case
    whose result is off is a failure with its error."""
    checks = doctor.smoke("cpu")
    assert [c.status for c in checks] == ["ok"] * len(doctor._smoke_cases()), checks
    case = doctor._smoke_cases()[0]
    import torch
    calls = []

    def off(device):
        calls.append(device)
        return [t + (0.1 if device == "meta-npu" else 0) for t in case.run("cpu")]

    monkeypatch.setattr(doctor, "_smoke_cases",
                        lambda: [doctor.SmokeCase("off", off, case.tolerance)])
    (check,) = doctor.smoke("meta-npu")
    assert check.status == "fail" and "0.1" in check.detail
    assert calls == ["meta-npu", "cpu"]
    del torch


def _printed(pattern: str) -> list[str]:
    import re

    from doc_commands import ALL_DOCS, documented_commands
    found = documented_commands(ALL_DOCS, re.compile(pattern))
    assert found, f"no line matching {pattern!r} in the docs"
    return list(found)


def _on_path(env: dict) -> dict:
    """PATH starting with this Python's bin directory, as in the activated environment the
    docs' commands run in (`python`, and the `flash-cann` script that `pip install -e .`
    installs)."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "flash-cann").is_file(), (
        f"no flash-cann script in {bin_dir}: install the package (pip install -e .)")
    return dict(env, PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")


def test_the_documented_doctor_command_runs_as_printed(build, tmp_path):
    """README's `flash-cann doctor`, run with bash as printed: without an NPU it names the
    missing parts and exits 1; on the fake NPU every part is found and the smoke runs (and
    fails: the fake kernels compute no attention)."""
    for command in _printed(r"^flash-cann doctor$"):
        bare = subprocess.run(["bash", "-c", command], env=_on_path(_bare_env(tmp_path)),
                              capture_output=True, text=True)
        assert bare.returncode == 1, bare.stderr
        assert "[fail] op package" in bare.stdout and "check(s) failed" in bare.stdout
        server = subprocess.run(["bash", "-c", command],
                                env=_on_path(_server(tmp_path / "server", build)),
                                capture_output=True, text=True)
        assert server.returncode == 1, server.stderr
        failed = server.stdout.splitlines()[-1]
        smoke = len(doctor._smoke_cases())
        assert failed.startswith(f"{smoke} check(s) failed: smoke "), server.stdout
        assert "[  ok] npu extension" in server.stdout


def test_the_documented_readiness_check_runs_as_printed(build, tmp_path):
    """docs/npu.md's one-line check, as printed: here it names the first missing piece
    (torch_npu) with its fix; on the fake NPU it says the backend is ready."""
    for command in _printed(r"^python -c \"from flash_cann.backends.npu import launcher"):
        bare = subprocess.run(["bash", "-c", command], env=_on_path(_bare_env(tmp_path)),
                              capture_output=True, text=True)
        assert bare.returncode == 0, bare.stderr
        assert bare.stdout.startswith("torch_npu is not installed: install torch_npu"), bare.stdout
        ready = subprocess.run(["bash", "-c", command],
                               env=_on_path(_server(tmp_path / "server", build)),
                               capture_output=True, text=True)
        assert (ready.returncode, ready.stdout) == (0, "NPU backend ready\n"), ready.stderr


def test_the_smoke_covers_every_feature_the_spec_gives_the_npu():
    """Item 3 of issue 40: forward and backward of each feature on the NPU. A feature the
    spec adds to the npu backend fails this until a smoke case exercises it."""
    from flash_cann.contract.spec import load

    covered = {feature for case in doctor._smoke_cases() for feature in case.features}
    assert set(load().backends["npu"].features) - covered == set()
    assert len({case.name for case in doctor._smoke_cases()}) == len(doctor._smoke_cases())


def test_torchair_matches_torch_npu_only_as_the_copy_torch_npu_ships(tmp_path):
    from types import SimpleNamespace

    torch_npu = SimpleNamespace(__file__=str(tmp_path / "site/torch_npu/__init__.py"),
                                __version__="2.13.0")
    shipped = [SimpleNamespace(__name__="torch_npu.dynamo.torchair", __version__="0.1",
                               __file__=str(tmp_path / "elsewhere/torchair/__init__.py")),
               SimpleNamespace(__name__="torchair", __version__="0.1", __file__=str(
                   tmp_path / "site/torch_npu/dynamo/torchair/__init__.py"))]
    for torchair in shipped:
        check = doctor.check_torchair_origin(torchair, torch_npu)
        assert check.status == "ok" and "the copy torch_npu 2.13.0 ships" in check.detail
    separate = SimpleNamespace(__name__="torchair", __version__="0.2",
                               __file__=str(tmp_path / "site/torchair/__init__.py"))
    check = doctor.check_torchair_origin(separate, torch_npu)
    assert check.status == "fail" and "cannot be checked" in check.detail
    assert "pip uninstall torchair" in check.fix
