#!/usr/bin/env python3
"""Run another library's test file against flash_cann with only the ``flash_attn`` alias
installed, and summarise the outcome.

    python scripts/run_upstream_suite.py PATH_TO_test_flash_attn.py [pytest arguments]

The caller supplies the file (e.g. flash-attn 2.8.4's tests/test_flash_attn.py, or FA3's
hopper/test_flash_attn.py); nothing is fetched. The alias is installed before pytest
collects it (``FLASH_CANN_AS_FLASH_ATTN=1`` and flash_cann loaded as a pytest plugin, in
pytest-xdist's workers too), so its ``import flash_attn`` (``flash_attn_interface``,
``flash_attn_npu_v3``, ...) resolves to flash_cann. The file runs with its own directory
as pytest's root and conftest boundary (``--rootdir``, ``--confcutdir``): no conftest or
configuration of flash_cann's checkout takes part. The remaining arguments go to pytest
as they are (``-k``, ``-x``, ``-n 8`` with pytest-xdist, ``--deselect``, ...).

Printed at the end: the counts of passed, failed, errors, skipped, xfailed, xpassed, and
the failures and errors grouped by their reason (the exception's first line, with
numbers replaced by ``N`` so that one cause is one group), largest group first, each with
its count and a few test ids; skips grouped by reason the same way. The exit status is
pytest's.
"""

from __future__ import annotations

import collections
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 3  # test ids shown per group


def reason(report) -> str:
    """One line naming why ``report`` failed or skipped, numbers folded into ``N``."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, "Skipped: why")
        text = str(longrepr[2]).removeprefix("Skipped: ")
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr)
    first = text.strip().splitlines()[0] if text.strip() else "(no message)"
    return re.sub(r"\b\d+(\.\d+)?\b", "N", first)[:200]


class Summary:
    """A pytest plugin collecting each test's outcome and why."""

    def __init__(self):
        self.counts = collections.Counter()
        self.groups = {"failed": collections.defaultdict(list),
                       "skipped": collections.defaultdict(list)}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self._record(report, "error" if report.when != "call" and report.failed else None)

    def pytest_collectreport(self, report):
        if report.failed:
            self._record(report, "error")

    def _record(self, report, forced):
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        else:
            outcome = forced or report.outcome
        self.counts[outcome] += 1
        if outcome in ("failed", "error"):
            self.groups["failed"][f"{outcome}: {reason(report)}"].append(report.nodeid)
        elif outcome == "skipped":
            self.groups["skipped"][reason(report)].append(report.nodeid)

    def text(self) -> str:
        order = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
        lines = ["", "upstream suite through flash_cann's alias: " + ", ".join(
            f"{self.counts[name]} {name}" for name in order)]
        for title, groups in (("failures and errors", self.groups["failed"]),
                              ("skips", self.groups["skipped"])):
            if not groups:
                continue
            lines.append(f"{title} by reason:")
            for why, ids in sorted(groups.items(), key=lambda item: -len(item[1])):
                lines.append(f"  {len(ids):6d}  {why}")
                lines.extend(f"          {nodeid}" for nodeid in ids[:EXAMPLES])
        return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    test_file = Path(argv[0]).resolve()
    if not test_file.is_file():
        print(f"run_upstream_suite: no such file: {test_file}", file=sys.stderr)
        return 2
    # In this process and in any worker pytest-xdist starts: flash_cann from this
    # checkout, imported as a plugin (-p) before collection, with the alias requested.
    sys.path.insert(0, str(ROOT / "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, (str(ROOT / "python"), os.environ.get("PYTHONPATH"))))
    os.environ["FLASH_CANN_AS_FLASH_ATTN"] = "1"
    import pytest

    summary = Summary()
    status = pytest.main([str(test_file), f"--rootdir={test_file.parent}",
                          f"--confcutdir={test_file.parent}", "-p", "no:cacheprovider",
                          "-p", "flash_cann", *argv[1:]], plugins=[summary])
    print(summary.text())
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
