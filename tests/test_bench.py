"""`tileflash bench` / `tileflash plot`: a quick CPU run writes valid JSON, CSV and PNG files."""

import csv
import json
from pathlib import Path

import pytest
import torch

from tileflash import cli
from tileflash.bench import bench, providers

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_cpu_bench_writes_json_csv_png(tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["bench", "--device", "cpu", "--quick", "--modes", "fwd", "bwd", "--seqlens", "64", "96",
                   "--providers", "tileflash", "eager", "sdpa_math", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "CPU version" in printed
    rows = json.loads((out / "results.json").read_text())["results"]
    assert {r["provider"] for r in rows} == {"tileflash", "eager", "sdpa_math"}
    assert {r["mode"] for r in rows} == {"fwd", "bwd"}
    for r in rows:
        assert r["status"] == "ok", r
        assert r["ms"] > 0 and r["tflops"] > 0 and r["p20"] <= r["ms"] <= r["p80"]
        assert r["max_err"] < 1e-4  # fp32 on CPU: every provider must be right
        assert r["torch"] == torch.__version__ and r["date"] and "device_name" in r
    flops = 4 * 1 * 2 * 96 * 96 * 32 * 0.5  # B=1, H=2 (quick CPU), N=96, D=32, causal
    row = next(r for r in rows if r["provider"] == "eager" and r["seqlen_q"] == 96 and r["causal"]
               and r["mode"] == "fwd")
    assert row["tflops"] == pytest.approx(flops / row["ms"] * 1e-9)
    with open(out / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(rows) and {"provider", "tflops", "peak_mib", "max_err", "git"} <= set(csv_rows[0])
    for name in ("tflops.png", "memory.png", "speedup.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        (out / name).unlink()
    assert cli.main(["plot", str(out)]) == 0  # redraw from results.json
    assert (out / "speedup.png").read_bytes()[:8] == PNG_MAGIC


def test_absent_provider_is_skipped_with_a_note(tmp_path, capsys):
    rc = cli.main(["bench", "--device", "cpu", "--quick", "--modes", "fwd", "--seqlens", "32", "--causal", "no",
                   "--providers", "tileflash", "sdpa_cudnn", "--out", str(tmp_path), "--no-plots"])
    assert rc == 0
    assert "skipping sdpa_cudnn: runs on CUDA only" in capsys.readouterr().out
    data = json.loads((tmp_path / "results.json").read_text())
    assert "sdpa_cudnn" in data["skipped"] and {r["provider"] for r in data["results"]} == {"tileflash"}


def test_oom_is_recorded_not_raised(monkeypatch):
    def oom(q, k, v, causal):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setitem(providers.PROVIDERS, "tileflash",
                        providers.Provider("tileflash", oom, lambda d: None))
    monkeypatch.setattr(bench, "PROVIDERS", providers.PROVIDERS)
    shape = dict(batch=1, heads=2, heads_kv=2, seqlen=16, head_dim=8, causal=False)
    row = bench.measure("tileflash", shape, "fwd", torch.float32, "cpu", quick=True)
    assert row["status"] == "OOM" and "ms" not in row


def test_wrong_kernel_shows_in_max_err(monkeypatch):
    """A fast but wrong provider cannot hide: its error column is large."""
    monkeypatch.setitem(providers.PROVIDERS, "eager",
                        providers.Provider("eager", lambda q, k, v, c: torch.zeros_like(q), lambda d: None))
    shape = dict(batch=1, heads=2, heads_kv=1, seqlen=16, head_dim=8, causal=True)
    row = bench.measure("eager", shape, "fwd", torch.float32, "cpu", quick=True)
    assert row["status"] == "ok" and row["max_err"] > 0.1


def test_plot_without_results_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    assert "results.json not found" in capsys.readouterr().err


@pytest.mark.parametrize("sub", ["demo", "bench", "plot", "io"])
def test_subcommand_help(sub, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([sub, "--help"])
    assert e.value.code == 0
    assert "usage: tileflash " + sub in capsys.readouterr().out


def test_decode_bench_cpu(tmp_path, capsys):
    rc = cli.main(["bench", "--decode", "--device", "cpu", "--quick", "--seqlens", "64", "--providers", "tileflash",
                   "eager", "--page-sizes", "16", "--out", str(tmp_path)])
    assert rc == 0
    rows = json.loads((tmp_path / "results.json").read_text())["results"]
    assert {r["provider"] for r in rows} == {"tileflash", "tileflash_paged16", "eager"}
    for r in rows:
        assert r["status"] == "ok" and r["mode"] == "decode" and r["seqlen_q"] == 1
        kv_bytes = 2 * r["batch"] * r["seqlen_k"] * r["heads_kv"] * r["head_dim"] * 4
        assert r["kv_tb_s"] == pytest.approx(kv_bytes / r["ms"] * 1e-9)
        assert r["max_err"] < 1e-5
        assert r["timing"] == "eager" and r["kv_tb_s_eager"] == r["kv_tb_s"]  # no CUDA graph on CPU
    assert "KV TB/s" in capsys.readouterr().out
    assert (tmp_path / "decode.png").stat().st_size > 10_000
    (tmp_path / "decode.png").unlink()
    assert cli.main(["plot", str(tmp_path)]) == 0  # redrawn from results.json
    assert (tmp_path / "decode.png").exists() and not (tmp_path / "tflops.png").exists()


def test_decode_plot_of_the_committed_h200_run(tmp_path):
    """decode.png from the committed H200 decode run (graph and eager timings side by side)."""
    from tileflash.bench.plot import make_decode_plots

    src = Path(__file__).parent.parent / "docs" / "decode-h200" / "session4" / "run3-results.json"
    rows = json.loads(src.read_text())["results"]
    assert {r["timing"] for r in rows} == {"cuda_graph"}
    (path,) = make_decode_plots(rows, tmp_path)
    assert path.stat().st_size > 10_000


def test_grid_report_on_the_committed_h200_grid():
    """scripts/grid_report.py over the committed H200 grid: 40 cells per pass at D 64/128, and the
    medians it prints equal ones computed here from results.json."""
    import json
    import statistics
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    dirs = [root / "docs" / "bench-h200-grid-s5" / d for d in ("run6-fp16", "run7-bf16")]
    out = subprocess.run([sys.executable, str(root / "scripts" / "grid_report.py"), *map(str, dirs)],
                         capture_output=True, text=True, check=True).stdout
    cells = {}
    for d in dirs:
        for r in json.loads((d / "results.json").read_text())["results"]:
            cells.setdefault((r["dtype"], r["mode"], r["head_dim"], r["causal"], r["seqlen_q"]), {})[r["provider"]] = r
    for mode in ("fwd", "bwd"):
        ratios = [c["tileflash"]["tflops"] / c["sdpa_cudnn"]["tflops"] for k, c in cells.items() if k[1] == mode]
        assert len(ratios) == 40
        line = next(ln for ln in out.splitlines() if ln.startswith(f"| {mode}, D in"))
        assert line.split("|")[2].strip() == "40"
        assert line.split("|")[3].strip() == f"{statistics.median(ratios):.2f}"


def test_speedup_plot_uses_the_first_baseline_present(tmp_path):
    """A GPU grid run without eager (tileflash, cuDNN, SDPA-flash) still gets a speedup plot, over
    SDPA-flash, whose values are the baseline's time over each provider's; with no baseline in
    the results there is no speedup.png rather than an empty one."""
    pytest.importorskip("matplotlib")
    from tileflash.bench import plot

    def row(provider, ms, n):
        return dict(provider=provider, mode="fwd", head_dim=64, causal=False, seqlen_q=n, batch=1, ms=ms,
                    tflops=1.0 / ms, peak_mib=1.0, status="ok")

    rows = [row("tileflash", 1.0, 128), row("sdpa_flash", 1.5, 128), row("sdpa_cudnn", 1.2, 128),
            row("tileflash", 2.0, 256), row("sdpa_flash", 5.0, 256), row("sdpa_cudnn", 2.2, 256)]
    assert plot.speedup_baseline(rows) == "sdpa_flash"
    assert plot.speedup_baseline(rows + [row("eager", 9.0, 128)]) == "eager"
    (name, label, metric, _), = [p for p in plot._plots(rows) if p[0] == "speedup.png"]
    assert "sdpa_flash" in label
    assert [metric(r, rows) for r in rows[:3]] == [1.5, 1.0, 1.5 / 1.2]
    assert [p.name for p in plot.make_plots(rows, tmp_path)] == ["tflops.png", "memory.png", "speedup.png"]
    only = [r for r in rows if r["provider"] == "tileflash"]
    assert plot.speedup_baseline(only) is None
    bare = tmp_path / "no-baseline"
    bare.mkdir()
    assert [p.name for p in plot.make_plots(only, bare)] == ["tflops.png", "memory.png"]
    assert not (bare / "speedup.png").exists()
