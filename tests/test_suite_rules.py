"""Rules of the suite itself: under CI=true missing native tools fail the run instead of
skipping its native tests; the fast tier (-m fast) takes only what conftest lists; no time
limit in tests/ turns a slow run on a loaded machine into a failure."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest
import pytest

HERE = Path(__file__).resolve().parent


def test_ci_without_cmake_or_compiler_fails(tmp_path):
    env = {**os.environ, "CI": "true", "PATH": str(tmp_path)}  # an empty PATH: no tools
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--collect-only", str(HERE / "test_cli.py")],
                         env=env, capture_output=True, text=True, timeout=3600, cwd=HERE.parent)
    assert run.returncode != 0, run.stdout
    assert "CI=true but cmake, g++, gcc not found" in run.stderr + run.stdout


def _item(module: str, **params):
    return SimpleNamespace(path=HERE / module,
                           callspec=SimpleNamespace(params=params) if params else None)


def test_fast_tier_is_what_conftest_lists():
    assert conftest._is_fast(_item("test_api.py"))
    assert not conftest._is_fast(_item("test_a_new_module.py"))  # full tier by default
    assert conftest._is_fast(_item("test_accuracy.py", head_dim=64, seqlens=(128, 128)))
    assert not conftest._is_fast(_item("test_accuracy.py", head_dim=64, seqlens=(1000, 128)))
    assert not conftest._is_fast(_item("test_accuracy.py", head_dim=256, seqlens=(1, 1)))


def test_nothing_cites_files_outside_the_repository():
    """Sources are the repository's files or public ones (repository + path): never the
    team's private notes (shared/..., /work/...), which a reader of the repository cannot
    open."""
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True,
                           cwd=HERE.parent).stdout.split()
    private = re.compile(r"(^|[^A-Za-z0-9_./-])(/work/|shared/)")
    cited = [f"{name}:{number}" for name in files if name != "tests/test_suite_rules.py"
             for number, line in enumerate(_text(HERE.parent / name), 1)
             if private.search(line)]
    assert cited == []


def _text(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        return []  # binary files (results, images) cite nothing


def _pytest_options(text: str) -> list[str]:
    """The options of the `python -m pytest` call in a line of shell."""
    [call] = re.findall(r"python -m pytest([^\n&|;]*)", text)
    return call.split()


def test_ci_runs_the_readme_test_command():
    readme = (HERE.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**Set up and run the tests**"):]
    command = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    ci = (HERE.parent / ".ci" / "run").read_text(encoding="utf-8").splitlines()[-1]
    assert ci == command.strip(), "CI's last line is not the README's command as printed"
    assert _pytest_options(ci) == _pytest_options(command)
    assert "-n" in _pytest_options(ci)  # two workers: CI's two cores


def test_the_ci_command_fails_on_a_failing_test_and_on_no_tests(tmp_path):
    """The CI command's pytest options (workers included) keep pytest's exit status: 1 for
    a failing test, 5 when no test ran, and .ci/run (set -e) ends with it."""
    ci = (HERE.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci and "|| true" not in ci
    options = _pytest_options(ci.splitlines()[-1])
    (tmp_path / "test_one.py").write_text("def test_passes():\n    pass\n\n"
                                          "def test_fails():\n    assert False\n")
    (tmp_path / "empty").mkdir()
    for target, status in ((tmp_path / "test_one.py", 1), (tmp_path / "empty", 5)):
        run = subprocess.run([sys.executable, "-m", "pytest", *options, "-p", "no:cacheprovider",
                              "--rootdir", str(tmp_path), str(target)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=3600)
        assert run.returncode == status, run.stdout + run.stderr


def _run_ci(tmp_path, tools=("cmake", "g++", "gcc"), pytest_status=5):
    """.ci/run in a copy of the repository's .ci, with stand-ins on an otherwise empty PATH:
    the native tools given, and a python3 whose venv's pip and python record what they
    were asked (the working directory and CI) instead of installing and testing. The fake
    pytest exits with ``pytest_status``. Returns (the run, the recorded lines)."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    (repo / ".ci" / "run").write_text((HERE.parent / ".ci" / "run").read_text(encoding="utf-8"))
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    stub = {"dirname": f'#!/bin/sh\nexec {shutil.which("dirname")} "$@"\n',
            "python3": ("#!/bin/sh\n"  # python3 -m venv .venv
                        '[ "$1 $2" = "-m venv" ] || exit 99\n'
                        f'{shutil.which("mkdir")} -p "$3/bin"\n'
                        f"{shutil.which('cat')} > \"$3/bin/activate\" <<'ACTIVATE'\n"
                        f'pip() {{ echo "pip cwd=$PWD $*" >> {log}; }}\n'
                        f'python() {{ echo "python cwd=$PWD CI=${{CI:-unset}} $*" >> {log}; '
                        f"return {pytest_status}; }}\n"
                        "ACTIVATE\n")}
    stub.update({tool: "#!/bin/sh\nexit 0\n" for tool in tools})
    for name, text in stub.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run = subprocess.run([shutil.which("bash"), str(repo / ".ci" / "run")], cwd=tmp_path,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=3600)
    calls = log.read_text().splitlines() if log.exists() else []
    return run, [c.replace(str(repo), "REPO") for c in calls]


def test_ci_run_installs_and_runs_the_suite_from_the_root_with_ci_set(tmp_path):
    """From any directory: the install and the README's pytest command run in the
    repository root, pytest with CI=true (missing native tools fail, not skip), and
    pytest's exit status is the script's (5, "no tests ran", must fail CI too)."""
    run, calls = _run_ci(tmp_path)
    assert run.returncode == 5, run.stderr
    assert calls == ["pip cwd=REPO install torch==2.13.0 -e .[test]",
                     "python cwd=REPO CI=true -m pytest -q -n 2"]


@pytest.mark.parametrize("missing", ["cmake", "g++", "gcc"])
def test_ci_run_stops_before_installing_without_a_native_tool(tmp_path, missing):
    run, calls = _run_ci(tmp_path, tools=[t for t in ("cmake", "g++", "gcc") if t != missing],
                         pytest_status=0)
    assert run.returncode == 1 and calls == []
    assert f".ci/run: {missing} not found: the native tests need cmake (>= 3.16)" in run.stderr


def test_xdist_units_keep_a_module_on_one_worker_unless_spread():
    assert conftest.xdist_unit("tests/test_twin.py::test_a[x]") == \
        conftest.xdist_unit("tests/test_twin.py::test_b") == "tests/test_twin.py"
    assert conftest.xdist_unit("tests/test_npu_capture.py::test_a") == \
        conftest.xdist_unit("tests/test_npu_extension.py::test_b")  # one extension build
    assert conftest.xdist_unit("tests/test_accuracy.py::test_a[x]") == \
        "tests/test_accuracy.py::test_a[x]"


# A time limit in tests/ is a hang guard only: at least this many seconds, so that a slow
# run on a loaded machine is slow, not red. The long work (the Triton interpreter, the
# triton-ascend lowering) has no limit at all.
HANG_GUARD_FLOOR_S = 3600


def short_time_limits(source: str, name: str = "<source>") -> list[str]:
    """Every time limit in Python source below HANG_GUARD_FLOOR_S, or not a number
    literal (which this scan cannot check): `timeout=` keywords, and a number given
    positionally to `.wait(...)`, `.join(...)`, `signal.alarm(...)` or
    `pytest.mark.timeout(...)`."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        limits = [k.value for k in node.keywords if k.arg == "timeout"]
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else \
            getattr(node.func, "id", "")
        if callee in ("wait", "join", "alarm", "timeout") and node.args and \
                isinstance(node.args[0], ast.Constant):  # not str.join(...)
            limits.append(node.args[0])
        for limit in limits:
            value = limit.value if isinstance(limit, ast.Constant) else None
            if not isinstance(value, (int, float)) or value < HANG_GUARD_FLOOR_S:
                found.append(f"{name}:{limit.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_no_time_limit_in_tests_below_the_hang_guard_floor():
    short = [hit for path in sorted(HERE.rglob("*.py"))
             for hit in short_time_limits(path.read_text(encoding="utf-8"),
                                          str(path.relative_to(HERE.parent)))]
    assert short == [], (f"time limits below {HANG_GUARD_FLOOR_S} s (or not a literal) "
                         "turn a slow run into a failure; remove them or raise them:\n"
                         + "\n".join(short))


@pytest.mark.parametrize("planted", [
    "subprocess.run(['x'], capture_output=True, timeout=600)",
    "process.communicate(timeout=120)",
    "process.wait(300)",
    "thread.join(timeout=60.0)",
    "signal.alarm(900)",
    "subprocess.run(['x'], timeout=LIMIT)",
    "@pytest.mark.timeout(600)\ndef test_x():\n    pass",
])
def test_the_time_limit_rule_catches_a_planted_short_limit(planted):
    assert len(short_time_limits(planted)) == 1


def test_the_time_limit_rule_takes_a_hang_guard_and_no_limit():
    assert short_time_limits("subprocess.run(['x'], timeout=3600)\nprocess.wait(timeout=7200)\n"
                             "subprocess.run(['x'], capture_output=True)\nprocess.wait()") == []
