#!/usr/bin/env bash
# Every trainer on every CUDA plugin (tests/e2e/test_cuda_plugins.py), on a GPU machine whose Python has torch with CUDA:
# the wheels of tests/gpu/wheels.sh installed and colossalai's kernels built (tests/gpu/setup.sh), then the tests run
# 14 at a time and their (check, plugin) table printed (tests/gpu/table.py). Logs go to $OUT (default output/gpu_check).
# TESTS picks tests; DEADLINE (s) bounds the whole run.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-output/gpu_check}; WHEELS=${WHEELS:-.whl}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=${DEADLINE:-500}
source tests/gpu/setup.sh
timeout $(( DEADLINE - $(elapsed) - 15 )) python3 -m pytest ${TESTS:-tests/e2e/test_cuda_plugins.py} -n 14 -o addopts="" \
  -p no:cacheprovider -q -rA --timeout 280 --durations=50 --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
echo "pytest exit $? at $(elapsed) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -30
python3 tests/gpu/table.py "$OUT/junit.xml" | tee "$OUT/table.md"
