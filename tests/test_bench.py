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
                   "--providers", "tileflash", "tileflash_det", "eager", "sdpa_math", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "CPU version" in printed
    rows = json.loads((out / "results.json").read_text())["results"]
    assert {r["provider"] for r in rows} == {"tileflash", "tileflash_det", "eager", "sdpa_math"}
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


def test_sigterm_mid_grid_writes_the_cells_measured(tmp_path, monkeypatch, capsys):
    """`timeout` stopping a grid (SIGTERM) keeps what was measured: the results hold the cells done
    before the signal, the run says it was interrupted and exits non-zero."""
    import os
    import signal

    real = bench.measure
    calls = []

    def measure(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:  # the third measurement is stopped as `timeout` would stop it
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "measure", measure)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "run"
    rc = cli.main(["bench", "--device", "cpu", "--quick", "--modes", "fwd", "--seqlens", "32", "48",
                   "--head-dim", "16", "--causal", "no", "--providers", "tileflash", "eager", "--no-plots",
                   "--out", str(out)])
    assert rc == 130
    assert "interrupted: 2 of 4 measurements done" in capsys.readouterr().out
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(r["provider"], r["seqlen_q"]) for r in rows] == [("tileflash", 32), ("eager", 32)]
    assert all(r["status"] == "ok" for r in rows)
    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


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


def _png_size(path):
    """(width, height) in pixels from a PNG's IHDR chunk."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _decode_rows(graphed):
    """Synthetic decode results shaped like a GPU run's (CUDA-graph and eager timings side by side,
    `graphed`) or a CPU run's (eager only): 2 batch sizes x 3 cache lengths x 3 providers."""
    rows = []
    for b in (1, 16):
        for i, n in enumerate((1024, 4096, 16384)):
            for j, provider in enumerate(("tileflash", "tileflash_paged16", "sdpa_flash")):
                row = dict(provider=provider, mode="decode", batch=b, heads=32, heads_kv=8, head_dim=128,
                           seqlen_q=1, seqlen_k=n, causal=False, dtype="bfloat16", status="ok",
                           kv_tb_s=1.0 + 0.5 * i + 0.1 * j, timing="cuda_graph" if graphed else "eager",
                           device_name="NVIDIA H200", torch="2.11.0", triton="3.6.0", date="2026-12-03", git="x")
                if provider.startswith("tileflash_paged"):
                    row["page_size"] = 16
                if graphed:
                    row["kv_tb_s_eager"] = 0.4 + 0.1 * i
                rows.append(row)
    rows.append(dict(rows[0], status="OOM", batch=64))  # not ok: not plotted, no panel of its own
    return rows


@pytest.mark.parametrize("graphed", [True, False], ids=["graph+eager", "eager"])
def test_decode_plot_columns(tmp_path, graphed):
    """decode.png: one row of panels per batch size; CUDA-graph and eager timings side by side
    (two columns) when the rows have both, one column otherwise (6 x 4 inches per panel, 110 dpi)."""
    pytest.importorskip("matplotlib")
    from tileflash.bench.plot import make_decode_plots

    (path,) = make_decode_plots(_decode_rows(graphed), tmp_path)
    assert path.name == "decode.png" and path.stat().st_size > 10_000
    assert _png_size(path) == ((1320 if graphed else 660), 880)


def _grid_rows(rng):
    """Synthetic `tileflash bench` grid results: 2 dtypes x 2 passes x D 64/128/256 x causal or not
    x 3 lengths, three providers per cell, with random TFLOP/s; plus a cell without cuDNN and a
    failed row (ignored)."""
    rows = []
    for dtype in ("float16", "bfloat16"):
        for mode in ("fwd", "bwd"):
            for d in (64, 128, 256):
                for causal in (False, True):
                    for n in (1024, 4096, 16384):
                        for provider in ("tileflash", "sdpa_cudnn", "sdpa_flash"):
                            rows.append(dict(provider=provider, mode=mode, dtype=dtype, head_dim=d, causal=causal,
                                             seqlen_q=n, seqlen_k=n, status="ok",
                                             tflops=round(rng.uniform(100.0, 700.0), 3)))
    rows.append(dict(rows[0], seqlen_q=512, seqlen_k=512))                      # no cuDNN in this cell
    rows.append(dict(rows[2], seqlen_q=512, seqlen_k=512))
    rows.append(dict(rows[0], status="OOM", tflops=1e-9, seqlen_q=1024))       # a failed row: not counted
    return rows


def test_grid_report_medians_and_worst_cells(tmp_path):
    """tools/grid_report.py over a synthetic grid split across two run folders (as a grid run's
    fp16 and bf16 folders): per pass and baseline, the cell count, the median ratio and the worst
    ratio with its cell equal the ones computed here (a cell counts for each baseline present in
    it; failed rows are left out); with --baseline (an earlier run's CSV, as docs/data/h200-grid.csv),
    the change of tileflash's ratio to cuDNN per cell, here 1.25 everywhere."""
    import csv
    import random
    import statistics
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    rows = _grid_rows(random.Random(5))
    dirs = []
    for dtype in ("float16", "bfloat16"):
        d = tmp_path / dtype
        d.mkdir()
        (d / "results.json").write_text(json.dumps({"results": [r for r in rows if r["dtype"] == dtype]}))
        dirs.append(d)
    before = tmp_path / "before.csv"  # tileflash 0.8x as fast in the earlier run, the baselines the same
    with open(before, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, tflops=r["tflops"] * 0.8) if r["provider"] == "tileflash" else r)
    report = [sys.executable, str(root / "tools" / "grid_report.py"), *map(str, dirs)]
    out = subprocess.run(report, capture_output=True, text=True, check=True, timeout=300).stdout
    cells = {}
    for r in rows:
        if r["status"] == "ok":
            cells.setdefault((r["dtype"], r["mode"], r["head_dim"], r["causal"], r["seqlen_q"]), {})[r["provider"]] = r
    for mode in ("fwd", "bwd"):
        for provider, label in (("sdpa_cudnn", "cuDNN"), ("sdpa_flash", "SDPA-flash")):
            ratios = {key: c["tileflash"]["tflops"] / c[provider]["tflops"] for key, c in cells.items()
                      if key[1] == mode and "tileflash" in c and provider in c}
            assert len(ratios) == 36 + (mode == "fwd" and provider == "sdpa_flash")
            line = next(ln for ln in out.splitlines() if ln.startswith(f"| {mode} | {label} |"))
            cols = [c.strip() for c in line.split("|")[1:-1]]
            worst = min(ratios, key=ratios.get)
            assert cols[2] == str(len(ratios)), line
            assert cols[3] == f"{statistics.median(ratios.values()):.3f}", line
            assert cols[4] == (f"{ratios[worst]:.3f} (D={worst[2]}, {'causal' if worst[3] else 'non-causal'}, "
                               f"N={worst[4]}, {worst[0]})"), line
    out = subprocess.run(report + ["--baseline", str(before)], capture_output=True, text=True, check=True,
                         timeout=300).stdout
    for mode in ("fwd", "bwd"):
        assert f"{mode}: tileflash/cuDNN now against the baseline run, median 1.250, range 1.250-1.250 over 36 cells" \
            in out, out[-1500:]


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


def test_host_bench_cpu(capsys, tmp_path):
    """`tileflash bench --host` on a machine without a GPU: it says it times the tiled CPU path, and
    prints a row per (case, provider) with positive times and the ratio to SDPA; --profile writes
    cProfile statistics of tileflash's calls."""
    from tileflash.bench import host

    prof = tmp_path / "prof.txt"
    rc = cli.main(["bench", "--host", "--device", "cpu", "--calls", "1", "--profile", str(prof)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "tiled CPU path" in printed
    lines = [ln.split() for ln in printed.splitlines() if ln.split() and ln.split()[0] in host.CASES]
    assert "fwd+bwd@2k" in host.CASES and "fwd+bwd@2k" not in host.CPU_CASES  # (GPU only: compute on CPU)
    assert {(ln[0], ln[1]) for ln in lines} == ({(c, p) for c in host.CPU_CASES for p in ("tileflash", "sdpa")}
                                                | {(c, "tf_sdpa") for c in ("fwd", "fwd+bwd")} | {("fwd+bwd", "tf_det")})
    for ln in lines:
        assert float(ln[2]) > 0 and float(ln[3]) > 0, ln
        if ln[1] == "sdpa":
            assert float(ln[4]) == 1.0
    assert "flash_attn_func" in prof.read_text() and "flash_attn_with_kvcache" in prof.read_text()


def test_host_bench_rotates_the_providers_each_round(monkeypatch):
    """``bench.host.measure``: every round times each provider once, starting one provider later than
    the round before (none always follows the same one); ``--rounds`` sets how many, and refuses
    fewer than one."""
    from tileflash.bench import host

    order = []
    monkeypatch.setattr(host, "_providers", lambda device: {n: ("bshd", n) for n in ("a", "b", "c")})
    monkeypatch.setattr(host, "_dense_case", lambda case, layout, fn, device, dtype: (lambda: order.append(fn)))
    rows = host.measure("cpu", torch.float32, 1, 8, cases=("fwd",), repeats=4)
    assert order == list("abc") + list("abc") + list("bca") + list("cab") + list("abc")  # warm-ups, then rounds
    assert [r["provider"] for r in rows] == ["a", "b", "c"] and all(r["status"] == "ok" for r in rows)
    with pytest.raises(SystemExit, match="--rounds must be at least 1"):
        cli.main(["bench", "--host", "--device", "cpu", "--calls", "1", "--rounds", "0"])


def test_ncu_source_summary_ranks_instructions_and_opcodes(tmp_path):
    """tools/ncu_source.py over a synthetic `ncu --page source --csv --print-source sass` table (with
    a line ncu prints before the header, thousands separators and an instruction without samples):
    the instructions come out by samples, with their shares, until --cover of the samples is listed,
    and the per-opcode sums strip predicates and modifiers; the samples grouped by execution count
    (the partitions of a warp-specialized kernel) carry their largest stall reasons. A CSV without
    the sample column is an error that says which column is missing."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    # (address, instruction, samples, not issued, times executed, barrier and long-scoreboard samples)
    rows = [("0x10", "@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x8], R3", "1,200", "1,150", "4,096", 0, 1200),
            ("0x20", "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24", "300", "120", "4,100", 100, 0),
            ("0x30", "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", "2,000", "1,990", "8", 2000, 0),
            ("0x40", "@P1 SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4], RZ", "500", "480", "512", 0, 500),
            ("0x50", "FFMA R1, R2, R3, R4", "0", "0", "4,096", 0, 0)]
    text = ['==PROF== Connected to process 1', '"Address","Source","Warp Stall Sampling (All Samples)",'
            '"Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_barrier","stall_long_sb",'
            '"stall_barrier (Not Issued)"']
    text += [f'"{a}","{s}","{n}","{ni}","{ex}","{b}","{lsb}","0"' for a, s, n, ni, ex, b, lsb in rows]
    path = tmp_path / "src.csv"
    path.write_text("\n".join(text) + "\n")
    tool = [sys.executable, str(root / "tools" / "ncu_source.py")]
    out = subprocess.run(tool + [str(path), "--cover", "0.8"], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert out.splitlines()[0] == "5 instructions, 4000 warp samples"
    listed = [ln for ln in out.splitlines() if ln.startswith("| ") and "`" in ln]
    # 2000 + 1200 = 80% of the samples: the listing stops there
    assert [ln.split("|")[5].strip() for ln in listed] == ["0x30", "0x10"]
    assert listed[0].startswith("| 50.0% | 50.0% | 2000 | 1990 |") and listed[1].startswith("| 30.0% | 80.0% |")
    tables = out.split("\n\n")
    ops_table = next(t for t in tables if t.startswith("| opcode |"))
    ops = {ln.split("|")[1].strip(): ln.split("|")[2].strip() for ln in ops_table.splitlines()[2:]}
    assert ops == {"BAR": "50.0%", "SYNCS": "42.5%", "HGMMA": "7.5%", "FFMA": "0.0%"}
    # by execution count (two significant digits: 4,096 and 4,100 are one group); 512 holds 12.5%
    groups = next(t for t in tables if t.startswith("| executed |")).splitlines()[2:]
    assert [g.split("|")[1:4] for g in groups] == [[" 8 ", " 1 ", " 50.0% "], [" 4.1e+03 ", " 3 ", " 37.5% "],
                                                   [" 5.1e+02 ", " 1 ", " 12.5% "]]
    assert groups[0].split("|")[4].strip() == "barrier 50.0%"
    assert groups[1].split("|")[4].strip() == "long_sb 30.0%, barrier 2.5%"
    bad = tmp_path / "bad.csv"
    bad.write_text('"Address","Source","Instructions Executed"\n"0x10","FFMA R1, R2, R3, R4","3"\n')
    res = subprocess.run(tool + [str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Warp Stall Sampling (All" in res.stderr and "SourceCounters" in res.stderr


def test_fused_ab_rotates_the_arms_order():
    """tools/fused_ab.py times a cell's arms in rounds whose order is rotated by one arm each round,
    and reports each arm's median round: with a bench whose reading depends on the place in the
    order (the bias found on the H100), every arm takes every place once in len(arms) rounds, so
    equal arms come out equal, which one fixed order would not give."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("fused_ab", root / "tools" / "fused_ab.py")
    fused_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fused_ab)
    order = []

    def bench(fn):  # the arm's own time plus a bias by its place within the current round
        order.append(fn)
        place = (len(order) - 1) % 3
        return fn() + (0.0, 0.5, 0.1)[place]

    arms = {"a": lambda: 1.0, "b": lambda: 1.0, "c": lambda: 2.0}
    got = fused_ab.rotated_medians(arms, 3, bench)
    names = {v: k for k, v in arms.items()}
    assert [names[f] for f in order] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    # each arm saw the biases 0, 0.5, 0.1 once: the median adds 0.1 to every arm alike
    assert got == {"a": 1.1, "b": 1.1, "c": 2.1}


def test_log_rows_rebuilds_the_rows_of_a_printed_table(tmp_path):
    """tools/log_rows.py reads back what `tileflash bench` prints (its own format_table and footer,
    with progress-bar noise around them): every ok row's numbers at the table's precision, the
    grid's batch and heads, the footer's provenance, the file name's dtype; failed rows (printed
    without numbers) are left out; a log without a footer is refused."""
    import csv
    import random
    import subprocess
    import sys

    from tileflash.bench.bench import format_table

    root = Path(__file__).resolve().parents[1]
    rng = random.Random(3)
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            for n in (1024, 16384):
                for provider in ("tileflash", "sdpa_cudnn", "fa4"):
                    rows.append(dict(provider=provider, mode="bwd", head_dim=d, causal=causal, seqlen_q=n, status="ok",
                                     ms=rng.uniform(0.1, 20), tflops=rng.uniform(100, 700), peak_mib=rng.uniform(60, 400),
                                     max_err=rng.uniform(1e-5, 1e-2)))
    rows.append(dict(rows[0], provider="sdpa_flash", status="error: OOM"))
    rows.append(dict(rows[1], provider="sdpa_flash", status="error: RuntimeError: bad shape here"))  # 10 words
    foot = ("TFLOP/s = 4·B·H·Sq·Sk·D / time (×0.5 causal, ×2.5 bwd, ×3.5 fwd+bwd); "
            "NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, 2026-12-06T06:58:55+00:00, git e9260c1")
    log = tmp_path / "bwd-bfloat16.log"
    log.write_text("tileflash bwd N=1024 D=64 causal=False:   0%|   | 0/24 [00:00<?, ?it/s]\n"
                   + format_table(rows) + "\n" + foot + "\nwrote /root/out/bwd-bfloat16/results.json\n")
    out = tmp_path / "rows.csv"
    tool = [sys.executable, str(root / "tools" / "log_rows.py")]
    res = subprocess.run(tool + [str(log), "--csv", str(out), "--json", str(tmp_path / "plot")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = list(csv.DictReader(open(out)))
    assert len(got) == len(rows) - 2 and json.loads((tmp_path / "plot" / "results.json").read_text())["results"]
    for r, g in zip(rows, got):
        assert (g["provider"], g["mode"], int(g["head_dim"]), g["causal"], int(g["seqlen_q"])) == \
               (r["provider"], r["mode"], r["head_dim"], str(r["causal"]), r["seqlen_q"])
        assert float(g["ms"]) == pytest.approx(r["ms"], abs=6e-4)
        assert float(g["tflops"]) == pytest.approx(r["tflops"], abs=6e-3)
        assert float(g["peak_mib"]) == pytest.approx(r["peak_mib"], abs=0.06)
        assert float(g["max_err"]) == pytest.approx(r["max_err"], rel=6e-3)
        assert int(g["batch"]) == 16384 // r["seqlen_q"] and int(g["heads"]) == int(g["heads_kv"]) == 2048 // r["head_dim"]
        assert int(g["seqlen_k"]) == r["seqlen_q"] and g["status"] == "ok" and g["date"] == "2026-12-06T06:58:55+00:00"
        assert (g["dtype"], g["device_name"], g["torch"], g["triton"], g["git"]) == \
               ("bfloat16", "NVIDIA H200", "2.11.0+cu130", "3.6.0", "e9260c1")
    (tmp_path / "bwd-float16.log").write_text(format_table(rows))  # no footer
    res = subprocess.run(tool + [str(tmp_path / "bwd-float16.log"), "--csv", str(out)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0 and "footer" in res.stderr


def test_bwd_kernels_plot_reads_the_table_and_draws(tmp_path):
    """tools/bwd_kernels_plot.py takes the rows of bwd_kernels.py's last table (and nothing else of its
    log: the per-kernel lines, the headers) and writes a PNG; a log without that table is refused."""
    pytest.importorskip("matplotlib")
    import importlib.util
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("bwd_kernels_plot", root / "tools" / "bwd_kernels_plot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    log = ("D=64 N=1024 B=16 H=32 fused: wall 1060 us/call (324 TFLOP/s), kernels 1047 us\n"
           "        916.8 us  _attn_bwd_sm90_ws\n\n"
           "| D | N | arm | wall us | main kernel us | other kernels us |\n|---|---|---|---|---|---|\n"
           "| 64 | 1024 | fused | 1060 | 917 | 130 |\n| 64 | 1024 | fa4 | 807 | 664 | 118 |\n"
           "| 128 | 16384 | fused_noDQ | 9540 | 9346 | 134 |\n")
    assert mod.parse(log) == [(64, 1024, "fused", 1060.0, 917.0, 130.0), (64, 1024, "fa4", 807.0, 664.0, 118.0),
                              (128, 16384, "fused_noDQ", 9540.0, 9346.0, 134.0)]
    (tmp_path / "bk.log").write_text(log)
    png = tmp_path / "bk.png"
    res = subprocess.run([sys.executable, str(root / "tools" / "bwd_kernels_plot.py"), str(tmp_path / "bk.log"),
                          str(png)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "none.log").write_text(log.split("\n\n")[0])
    res = subprocess.run([sys.executable, str(root / "tools" / "bwd_kernels_plot.py"), str(tmp_path / "none.log"),
                          str(png)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "rows found" in res.stderr
