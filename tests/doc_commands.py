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


ALL_DOCS = (ROOT / "README.md", ROOT / "docs" / "npu.md", ROOT / "docs" / "packaging.md")
ANY_COMMAND = re.compile(r"^[^#\s]")  # a line of shell, not a comment or a blank


def every_command(paths=ALL_DOCS) -> dict[str, list[str]]:
    """Every command line of the docs' fenced bash blocks, with the files printing it."""
    return documented_commands(paths, ANY_COMMAND)


def clean_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked, or untracked and not
    ignored), nothing built: what a user runs the docs' commands in."""
    import shutil
    import subprocess
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest
