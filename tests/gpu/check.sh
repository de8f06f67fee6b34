#!/usr/bin/env bash
# Every trainer on every CUDA plugin (tests/e2e/test_cuda_plugins.py), on a GPU machine whose Python has torch with CUDA:
# installs the wheels of tests/gpu/wheels.sh over that torch, builds colossalai's Adam kernels once, then runs the tests
# 14 at a time and prints their (check, plugin) table (tests/gpu/table.py). Logs go to $OUT (default output/gpu_check).
# TESTS picks tests; DEADLINE (s) bounds the whole run.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-output/gpu_check}; WHEELS=${WHEELS:-.whl}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=${DEADLINE:-500}
elapsed() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
  > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=16 PYTHONUNBUFFERED=1
[ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ] && export CUDA_HOME=/usr/local/cuda
{ nvidia-smi -L; nvcc --version | tail -1
  python3 -c "import torch, transformers, colossalai, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'colossalai', colossalai.__version__, 'peft', peft.__version__)"
} >> "$OUT/setup.log" 2>&1
echo "set up in $(elapsed) s"; grep -E "^GPU|^torch|release" "$OUT/setup.log"
build() { timeout 240 python3 -W ignore -c "
import time; t = time.time()
from colossalai.kernel.kernel_loader import $1
$1().load(); print('$1 built in', round(time.time() - t), 's')"; }
# one after the other: colossalai builds both in one folder, and two builds at once spoil each other's files
build CPUAdamLoader > "$OUT/kernels.log" 2>&1; build FusedOptimizerLoader >> "$OUT/kernels.log" 2>&1
echo "kernels at $(elapsed) s"; grep -E "built in|Error" "$OUT/kernels.log"
timeout $(( DEADLINE - $(elapsed) - 15 )) python3 -m pytest ${TESTS:-tests/e2e/test_cuda_plugins.py} -n 14 -o addopts="" \
  -p no:cacheprovider -q -rA --timeout 280 --durations=50 --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
echo "pytest exit $? at $(elapsed) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -30
python3 tests/gpu/table.py "$OUT/junit.xml" | tee "$OUT/table.md"
