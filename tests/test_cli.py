"""The command line: `tileflash demo` (run in-process on the CPU) and `python -m tileflash`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tileflash.bench.demo import CPU_NOTICE
from tileflash.cli import main

from helpers import HAS_CUDA

REPO = Path(__file__).resolve().parents[1]


def test_demo_cpu(tmp_path, capsys):
    out = tmp_path / "sub" / "demo.json"
    rc = main(["demo", "--device", "cpu", "--sizes", "64", "128", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed

    assert "CPU version (tiled PyTorch path)" in printed
    if not HAS_CUDA:
        assert printed.splitlines()[0] == CPU_NOTICE
    assert "[4/4] tileflash" in printed  # progress
    table_rows = [line for line in printed.splitlines() if line.lstrip().startswith(("64 |", "128 |"))]
    assert len(table_rows) == 2, printed
    assert str(out) in printed

    data = json.loads(out.read_text())
    for key in ("device", "device_name", "torch", "triton", "python", "date", "git", "config", "memory_method",
                "rows"):
        assert key in data, key
    assert data["device"] == "cpu"
    assert data["torch"] == torch.__version__
    assert data["config"] == {"batch": 1, "nheads": 4, "headdim": 64, "dtype": "float32", "causal": False,
                              "reference_dtype": "float64"}
    assert [r["seqlen"] for r in data["rows"]] == [64, 128]
    for r in data["rows"]:
        assert r["ref_rows"] == r["seqlen"]  # small N: every row is checked
        for p in ("eager", "tileflash"):
            assert r[f"{p}_status"] == "ok", r
            assert r[f"{p}_ms"] > 0
            assert r[f"{p}_tflops"] > 0
            assert isinstance(r[f"{p}_peak_bytes"], int) and r[f"{p}_peak_bytes"] >= 0
        assert r["tileflash_max_abs_err"] < 1e-4
        assert r["eager_max_abs_err"] < 1e-4
        assert r["speedup"] == pytest.approx(r["eager_ms"] / r["tileflash_ms"])
        assert r["mem_ratio"] >= 0


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given when no GPU is present")
def test_demo_cuda_without_gpu(tmp_path, capsys):
    assert main(["demo", "--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err


def test_python_m_tileflash_help():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-m", "tileflash", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "usage: tileflash" in res.stdout
    assert "demo" in res.stdout

    res = subprocess.run([sys.executable, "-m", "tileflash", "demo", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    for opt in ("--sizes", "--device", "--out"):
        assert opt in res.stdout
