"""The HBM traffic model (`tileflash io`): hand-checked figures, growth laws, CLI output."""

import importlib.util
import json

import pytest

from tileflash.bench import io_model
from tileflash.bench.io_model import flash_attention_bytes, io_rows, standard_attention_bytes

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def test_small_case_by_hand():
    n, d, e = 256, 64, 2  # fp16, one head
    # standard: matmul1 2Nd+N², scale 2N², softmax 2N², matmul2 N²+2Nd -> 4Nd + 6N² elements
    #   4*256*64 + 6*256*256 = 65,536 + 393,216 = 458,752 elements = 917,504 bytes
    assert standard_attention_bytes(n, d, elem_bytes=e) == 917_504
    # causal adds one read + write of S: + 2*65,536 elements = +262,144 bytes
    assert standard_attention_bytes(n, d, elem_bytes=e, causal=True) == 917_504 + 262_144

    # flash, block_m=128: 2 Q blocks, each reads all 256 rows of K and of V
    #   Q 256*64 = 16,384 + O 16,384 + K,V 2 blocks * 2 * 256*64 = 65,536 -> 98,304 elements = 196,608 bytes
    #   + LSE 256 rows * 4 bytes = 1,024  ->  197,632 bytes
    assert flash_attention_bytes(n, d, elem_bytes=e, block_m=128) == 197_632
    # causal: block 0 reads keys [0, 128), block 1 keys [0, 256): K,V 2*64*(128+256) = 49,152 elements
    #   (16,384 + 16,384 + 49,152) * 2 + 1,024 = 164,864 bytes
    assert flash_attention_bytes(n, d, elem_bytes=e, block_m=128, causal=True) == 164_864
    # L2 reuse (K+V of one head = 64 KiB fits): K, V once: (4 * 16,384) * 2 + 1,024
    assert flash_attention_bytes(n, d, elem_bytes=e, block_m=128, l2_bytes=1 << 20) == 132_096
    # ... and the plain figure when they do not fit
    assert flash_attention_bytes(n, d, elem_bytes=e, block_m=128, l2_bytes=1 << 10) == 197_632

    # batch_heads and elem_bytes scale linearly
    assert standard_attention_bytes(n, d, batch_heads=8, elem_bytes=4) == 8 * 2 * 917_504
    assert flash_attention_bytes(n, d, batch_heads=3, elem_bytes=2, block_m=128) == 3 * 197_632


def test_default_block_m_is_tileflash_config():
    from tileflash.ops.triton.forward import default_config

    for d in (64, 128, 256):
        bm = default_config(d)["BLOCK_M"]
        assert flash_attention_bytes(4096, d) == flash_attention_bytes(4096, d, block_m=bm)
    assert default_config(64)["BLOCK_M"] == 128


def test_sram_rule():
    # M = 228 KiB / 2 B = 116,736 elements; B_c = ceil(M / (4*64)) = 456, B_r = min(456, 64) = 64
    assert io_model.sram_tile_sizes(64, 228 * 1024, 2) == (456, 64)
    assert io_model.resolve_blocks(64, 2, "sram", None, 228 * 1024) == (456, 64)
    # more SRAM -> bigger Q tiles -> less traffic (the 1/M in Θ(N²d²/M))
    small = flash_attention_bytes(16384, 64, block_m="sram", sram_bytes=64 * 1024)
    large = flash_attention_bytes(16384, 64, block_m="sram", sram_bytes=256 * 1024)
    assert large < small
    with pytest.raises(ValueError):
        flash_attention_bytes(1024, 64, block_m="big")


@pytest.mark.parametrize("causal", [False, True])
def test_monotonic_in_n(causal):
    ns = [2 ** k for k in range(6, 16)] + [1000, 3000, 5000]
    ns.sort()
    for fn in (standard_attention_bytes,
               lambda n, d, causal: flash_attention_bytes(n, d, causal=causal),
               lambda n, d, causal: flash_attention_bytes(n, d, causal=causal, block_m="sram")):
        vals = [fn(n, 64, causal=causal) for n in ns]
        assert all(a < b for a, b in zip(vals, vals[1:])), vals


def test_growth_laws():
    d = 64
    n = 65536
    std_growth = standard_attention_bytes(2 * n, d) / standard_attention_bytes(n, d)
    assert std_growth == pytest.approx(4, rel=0.01)

    for block_m in (128, "sram"):
        fl_growth = flash_attention_bytes(2 * n, d, block_m=block_m) / flash_attention_bytes(n, d, block_m=block_m)
        assert fl_growth == pytest.approx(4, rel=0.02), block_m
    # much smaller constant: with block_m = 128, d = 64 the N² coefficient is 2d/block_m = 1 vs 6 for standard
    assert standard_attention_bytes(n, d) / flash_attention_bytes(n, d, block_m=128) == pytest.approx(6, rel=0.01)
    assert flash_attention_bytes(n, d, block_m="sram") < flash_attention_bytes(n, d, block_m=128)
    # L2 bound: linear in N while K, V fit
    l2 = 64 << 20
    assert flash_attention_bytes(2 * 4096, d, l2_bytes=l2) / flash_attention_bytes(4096, d, l2_bytes=l2) \
        == pytest.approx(2)


def test_causal_single_q_block_saves_nothing():
    # N <= block_m: the one Q block sees every key, causal or not (only the eager path pays extra)
    assert flash_attention_bytes(128, 64, causal=True, block_m=128) == flash_attention_bytes(128, 64, block_m=128)


@pytest.mark.parametrize("n", [1000, 4096, 16384])  # > block_m, also for "sram" (456 / 228)
def test_causal_less_than_noncausal(n):
    for d in (64, 128):
        assert standard_attention_bytes(n, d, causal=True) > standard_attention_bytes(n, d)  # eager: extra mask op
        assert flash_attention_bytes(n, d, causal=True) < flash_attention_bytes(n, d)
        assert flash_attention_bytes(n, d, causal=True, block_m="sram") < flash_attention_bytes(n, d, block_m="sram")
    # the K/V term roughly halves at large N
    big = 65536
    kv = lambda causal: flash_attention_bytes(big, 64, causal=causal) - 2 * 2 * big * 64 - 4 * big  # noqa: E731
    assert kv(True) / kv(False) == pytest.approx(0.5, rel=0.01)


def test_io_rows_keys():
    rows = io_rows([512, 1024], 64, 1, 2, False, None, 228 * 1024, None)
    assert [r["seqlen"] for r in rows] == [512, 1024]
    for r in rows:
        assert r["flash_bytes_l2"] is None
        assert r["ratio"] == pytest.approx(r["standard_bytes"] / r["flash_bytes"])
    rows = io_rows([512], 64, 1, 2, False, None, 228 * 1024, 60 << 20)
    assert rows[0]["flash_bytes_l2"] < rows[0]["flash_bytes"]


def test_cli_json(capsys):
    assert io_model.main(["--json", "--seqlens", "256", "512", "--causal", "--l2-mib", "60"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["seqlen"] for r in rows] == [256, 512]
    for r in rows:
        for key in ("seqlen", "standard_bytes", "flash_bytes", "flash_bytes_l2", "ratio"):
            assert key in r
    assert rows[0]["flash_bytes"] == 164_864  # the hand-computed causal case above


def test_cli_table(capsys):
    assert io_model.main(["--seqlens", "1024", "--dtype", "bfloat16", "--block-m", "sram"]) == 0
    out = capsys.readouterr().out
    assert "standard MiB" in out and "flash MiB" in out and "not measured" in out
    assert any(line.lstrip().startswith("1024 |") for line in out.splitlines())


def test_cli_bad_block_m(capsys):
    with pytest.raises(SystemExit) as exc:
        io_model.main(["--block-m", "huge"])
    assert exc.value.code == 2


@pytest.mark.skipif(not HAS_MPL, reason="--plot needs matplotlib, which is not installed")
def test_cli_plot(tmp_path, capsys):
    out = tmp_path / "io.png"
    assert io_model.main(["--seqlens", "512", "1024", "2048", "--l2-mib", "60", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(io_model, "_import_pyplot", lambda: None)
    out = tmp_path / "io.png"
    assert io_model.main(["--seqlens", "512", "--plot", str(out)]) == 2
    assert "matplotlib" in capsys.readouterr().err
    assert not out.exists()


def test_tileflash_io_help(capsys):
    from tileflash.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["io", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--seqlens", "--head-dim", "--block-m", "--l2-mib", "--json", "--plot"):
        assert opt in out
    assert "HBM" in out


def test_tileflash_io_runs(capsys):
    from tileflash.cli import main

    assert main(["io", "--seqlens", "256", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["standard_bytes"] == 917_504


def test_measured_plot(tmp_path):
    """The model-vs-Nsight plot from io_measure's JSON layout (values from the model itself, so
    the test needs no GPU): a PNG is written."""
    pytest.importorskip("matplotlib")
    rows = []
    for n in (1024, 4096):
        std = standard_attention_bytes(n, 64, batch_heads=16)
        fl = flash_attention_bytes(n, 64, batch_heads=16)
        fl2 = flash_attention_bytes(n, 64, batch_heads=16, l2_bytes=60 << 20)
        rows += [dict(provider="eager", seqlen=n, measured_bytes=std, model_bytes=std, model_l2_bytes=std),
                 dict(provider="tileflash", seqlen=n, measured_bytes=fl2, model_bytes=fl, model_l2_bytes=fl2)]
    path = tmp_path / "m.png"
    io_model.write_measured_plot(dict(gpu="test", batch=1, heads=16, head_dim=64, rows=rows), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_io_measure_parses_ncu_csv():
    """tools/io_measure.py sums DRAM reads and writes over every profiled kernel, in any unit (its
    parser run in a subprocess: tests do not import the tools)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    csv_text = (
        "==PROF== Connected to process 1\n"
        '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","k1","dram__bytes_read.sum","Mbyte","2.50"\n'
        '"0","k1","dram__bytes_write.sum","Kbyte","1,024.00"\n'
        '"1","k2","dram__bytes_read.sum","byte","500"\n'
        '"1","k2","dram__bytes_write.sum","Gbyte","0.001"\n'
        '"1","k2","sm__cycles_elapsed.avg","cycle","123"\n'
    )
    code = ("import json, sys; sys.path.insert(0, 'tools'); from io_measure import dram_bytes; "
            "print(json.dumps(dram_bytes(sys.stdin.read())))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", code], input=csv_text, capture_output=True, text=True, cwd=root,
                         env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rd, wr = json.loads(res.stdout.strip().splitlines()[-1])
    assert rd == pytest.approx(2.5e6 + 500)
    assert wr == pytest.approx(1.024e6 + 1e6)
