#!/bin/bash
# Build .fa4/fa4-site.tar.xz: flash-attn-4 (FA4, CuTe-DSL Hopper kernels) and every package it needs
# that the H200 machine's image lacks, unpacked into one site folder and packed with xz, for
# tools/gpu_run.sh to unpack on the GPU machine (which reaches no package registry). Run it on
# this machine (which reaches PyPI) from the repository root; .fa4/ is ignored by git and is
# passed to the device tool with carry=[".fa4"].
#
#   bash tools/fa4_site.sh            # ~1 minute of downloads, ~4 minutes of xz on 2 cores
#
# What 2026-12-05 taught (each cost a device call):
# - nvidia-cutlass-dsl 4.8.1 is a meta package: libs-base (the MLIR bindings, 3 MB) needs
#   libs-core (cutlass.cute's Python, 1.6 MB), and the compiler library comes in libs-cu12 or
#   libs-cu13 (~92 MB each; cu13 here, to match torch 2.11+cu130). Without libs-core,
#   `import flash_attn.cute` fails with "No module named 'cutlass.cute'".
# - tvm_ffi loads lib/libtvm_ffi_testing.so at import: keep it.
# - The unpacked site is ~260 MB; the device tool carries at most 64 MiB with the working tree.
#   xz with a 256 MiB dictionary packs it into ~59 MB (xz -9e alone: ~68 MB, too large).
# - A .pth file is not read from PYTHONPATH, so gpu_run.sh also puts
#   nvidia_cutlass_dsl/dsl_packages on it (what nvidia_cutlass_dsl_packages.pth would do).
set -euo pipefail
PY=${FA4_PYTHON:-3.12}  # the GPU machine's python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkgs="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
      nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
      apache-tvm-ffi torch-c-dlpack-ext protobuf"
for p in $pkgs; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/whl" "$p" 2>&1 | grep -v '^WARNING' || true
done
mkdir -p "$work/site"
for w in "$work"/whl/*.whl; do
  unzip -q -o "$w" -d "$work/site"  # a wheel is a zip of its install tree (none of these has a .data folder)
done
python3 - "$work/site" <<'EOF'
import sys, pathlib
site = pathlib.Path(sys.argv[1])
for need in ("flash_attn/cute/interface.py", "nvidia_cutlass_dsl/dsl_packages/cutlass/cute/__init__.py",
             "tvm_ffi/lib/libtvm_ffi_testing.so", "quack/__init__.py"):
    assert (site / need).exists(), f"the site lacks {need}: a wheel is missing"
EOF
# (only files no import reaches: other platforms' stubs and other torch versions' dlpack addons)
rm -rf "$work/site/nvidia_cutlass_dsl/cu13/lib/stubs"
rm -f "$work"/site/torch_c_dlpack_ext/libtorch_c_dlpack_addon_torch2[45678]-*
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .fa4
rm -f .fa4/*.tar.xz
(cd "$work/site" && tar -cf - .) | xz --lzma2=preset=9e,dict=256MiB -T1 > .fa4/fa4-site.tar.xz
size=$(stat -c %s .fa4/fa4-site.tar.xz)
echo "wrote .fa4/fa4-site.tar.xz: $size bytes"
[ "$size" -lt 62000000 ] || echo "warning: over ~62 MB, with the working tree it may pass the device tool's 64 MiB"
