"""The README's quick start runs as printed (a newcomer's first five lines)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_quick_start_runs_verbatim(tmp_path):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quick start"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "quick_start.py"
    script.write_text(code + "\nassert out.shape == q.shape and bool(out.isfinite().all())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stderr
