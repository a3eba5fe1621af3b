"""Test helper: the shell commands the docs print, so that tests run them as written and a
changed doc command changes what a test runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_DOCS = (ROOT / "docs" / "npu.md", ROOT / "README.md")


def documented_commands(paths, pattern: re.Pattern) -> dict[str, list[str]]:
    """Each line of the docs' fenced bash blocks matching ``pattern`` (comment stripped),
    with the names of the files that print it."""
    found: dict[str, list[str]] = {}
    for path in paths:
        in_bash = False
        for line in path.read_text().splitlines():
            fence = line.strip()
            if fence.startswith("```"):
                in_bash = not in_bash and fence[3:].strip() in ("bash", "sh", "shell")
                continue
            if in_bash:
                command = line.split(" #", 1)[0].strip()
                if pattern.match(command):
                    found.setdefault(command, []).append(path.name)
    return found
