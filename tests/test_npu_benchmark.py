"""benchmarks/npu_attention.py without an NPU: it imports, refuses cleanly (a message naming
what is missing, exit 2, nothing written), and its table and JSON writer work on fake
timings, with the schedule model's prediction on flash-cann's rows only."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "npu_attention.py"


def _module():
    spec = importlib.util.spec_from_file_location("npu_attention", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_an_npu_it_refuses_and_writes_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND", "FAKE_"))}
    env["PYTHONPATH"] = str(ROOT / "python")
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("npu_attention: needs an Ascend NPU")
    assert "torch_npu is not installed" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_shapes_are_the_gpu_benchmarks():
    bench = _module()
    assert bench.shape(1024, 128) == (16, 16) and bench.shape(16384, 64) == (1, 32)


def test_table_and_json_from_fake_timings(tmp_path):
    bench = _module()
    rows = []
    for impl in (bench.OURS, bench.INCUMBENT):
        for mode, ms in (("fwd", 2.0), ("bwd", 5.0)):
            predicted = bench.predicted_ms("Ascend910B2", "float16", 128, 4096, True, mode)
            rows.append(bench.row(impl, "Ascend910B2", "float16", 128, 4096, True, mode, ms,
                                  predicted))
    ours_fwd = rows[0]
    flops = 4 * 4 * 16 * 4096 * 4096 * 128 / 2
    assert abs(ours_fwd["tflops"] - flops / 2.0 / 1e9) < 1e-6
    assert ours_fwd["predicted_ms"] > 0 and rows[2]["predicted_ms"] is None
    assert rows[1]["tflops"] == ours_fwd["tflops"] * 2.5 * 2.0 / 5.0
    text = bench.table(rows).splitlines()
    assert len(text) == 5 and text[1].split()[:6] == ["flash_cann", "float16", "128", "4096",
                                                       "True", "fwd"]
    assert text[3].split()[-1] == f"{rows[2]['tflops']:.1f}", "no model column for the peer"
    written = bench.write(rows, tmp_path, "t", {"soc": "Ascend910B2"})
    data = json.loads((tmp_path / "npu-t.json").read_text())
    assert data == {"environment": {"soc": "Ascend910B2"}, "rows": rows}
    assert written[0] == tmp_path / "npu-t.json"


def _fake_rows(bench, seqlens=(4096, 1024)):
    rows = []
    for impl, speed in ((bench.OURS, 1.0), (bench.INCUMBENT, 2.0)):
        for seqlen in seqlens:
            for mode in bench.MODES:
                rows.append(bench.row(impl, "Ascend910B2", "float16", 128, seqlen, False, mode,
                                      speed * seqlen / 1024, None))
    return rows


def test_without_matplotlib_the_json_is_written_and_the_missing_png_explained(tmp_path,
                                                                              monkeypatch, capsys):
    bench = _module()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    rows = _fake_rows(bench)
    written = bench.write(rows, tmp_path, "", {"soc": "Ascend910B2"})
    assert written == [tmp_path / "npu.json"]
    assert json.loads((tmp_path / "npu.json").read_text())["rows"] == rows
    assert not (tmp_path / "npu.png").exists()
    err = capsys.readouterr().err
    assert "matplotlib is not installed, so no npu.png was drawn" in err
    assert f"{tmp_path / 'npu.json'} has every result" in err and "pip install matplotlib" in err


class _Axes:
    def __init__(self):
        self.lines, self.settings = [], {}

    def plot(self, x, y, style, label):
        self.lines.append((label, list(x), list(y)))

    def set(self, **settings):
        self.settings.update(settings)

    def legend(self):
        pass


class _Figure:
    def __init__(self, saved):
        self.saved = saved

    def tight_layout(self):
        pass

    def savefig(self, path):
        Path(path).write_bytes(b"stub png")
        self.saved.append(Path(path))


def test_the_png_has_a_panel_per_case_and_a_line_per_implementation(tmp_path, monkeypatch):
    """The plot, drawn by a recording stand-in of pyplot (matplotlib is not installed here):
    one panel per (mode, causal, head_dim, dtype), one line per implementation, its points
    the rows' TFLOP/s in increasing seqlen (the rows come in --seqlens' order)."""
    import types

    import numpy as np

    bench = _module()
    axes, saved = [], []

    def subplots(rows, cols, squeeze, figsize):
        grid = np.empty((rows, cols), dtype=object)
        for i in range(rows):
            grid[i, 0] = _Axes()
            axes.append(grid[i, 0])
        return _Figure(saved), grid

    pyplot = types.SimpleNamespace(subplots=subplots)
    matplotlib = types.SimpleNamespace(use=lambda backend: None, pyplot=pyplot)
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", pyplot)
    rows = _fake_rows(bench)
    written = bench.write(rows, tmp_path, "t", {})
    assert written == [tmp_path / "npu-t.json", tmp_path / "npu-t.png"] and saved == written[1:]
    assert [ax.settings["title"] for ax in axes] == ["bwd float16 d128 non-causal",
                                                     "fwd float16 d128 non-causal"]
    for ax, mode in zip(axes, ("bwd", "fwd")):
        want = {impl: [r["tflops"] for r in sorted(rows, key=lambda r: r["seqlen"])
                       if (r["impl"], r["mode"]) == (impl, mode)]
                for impl in (bench.OURS, bench.INCUMBENT)}
        assert {label: y for label, _, y in ax.lines} == want
        assert all(x == [1024, 4096] for _, x, _ in ax.lines)
