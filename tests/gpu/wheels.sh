#!/usr/bin/env bash
# Wheels of the supported stack for a GPU machine that has its own torch (and CUDA) but no package registry, such as
# the lent H100/H200 (Python 3.12, torch 2.11+cu130): colossalai 0.5.0 built here, transformers 4.51.3 and what coati
# imports that such an image lacks. bitsandbytes keeps only its CUDA 13.0 library, so everything fits in 64 MiB.
# Usage: bash tests/gpu/wheels.sh [DIR (default .whl)] [PYTHON_VERSION (default 3.12)]; then tests/gpu/check.sh or
# tests/gpu/bench.sh there.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.whl}; PYV=${2:-3.12}
mkdir -p "$DIR"
platforms=(); for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp "${platforms[@]}" \
  --platform any -d "$DIR" transformers==4.51.3 tokenizers==0.21.4 huggingface_hub==0.36.2 datasets==5.0.1 dill==0.4.1 \
  multiprocess==0.70.19 peft==0.13.2 galore-torch==1.0 bitsandbytes==0.50.2 math-verify==0.9.0 \
  latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 googleapis-common-protos==1.76.0
python3 -m pip wheel -q --no-deps colossalai==0.5.0 -w "$DIR"
# TRL for tests/gpu/bench.sh's peer rows, in a folder of its own: it runs on the image's transformers (TRL 1.16 needs
# >= 4.56), with datasets and the math reward's packages beside it
mkdir -p "$DIR/trl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp --platform any \
  -d "$DIR/trl" trl==1.16.0
for name in datasets dill multiprocess math_verify latex2sympy2_extended antlr4_python3_runtime; do
  cp "$DIR/$name"-*.whl "$DIR/trl/"; done
python3 - "$DIR" <<'PY'
import glob, os, sys, zipfile
src = glob.glob(os.path.join(sys.argv[1], "bitsandbytes-*.whl"))[0]
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(src + ".tmp", "w", zipfile.ZIP_DEFLATED) as zo:
    for item in zi.infolist():
        if not ("libbitsandbytes_cuda" in item.filename and "cuda130" not in item.filename):
            zo.writestr(item, zi.read(item.filename))
os.replace(src + ".tmp", src)
PY
du -sh "$DIR"
