#!/usr/bin/env bash
# coati's trainer measured on one GPU (benchmarks/bench_gpu.py), on a GPU machine whose Python has torch with CUDA:
# the wheels of tests/gpu/wheels.sh installed and colossalai's kernels built (tests/gpu/setup.sh), then GROUP's rows
# (anchors: Qwen3-0.6B's shape on each one-GPU plugin, packed and padded, GRPO, TRL; large: 4B LoRA and 7B SFT;
# large_grpo: 7B GRPO)
# run within DEADLINE seconds. Prints the table; writes it, results.json and the tail of each run's log to $OUT
# (default output/bench_gpu). Models and data stay in /tmp/bench_gpu.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-output/bench_gpu}; WHEELS=${WHEELS:-.whl}; GROUP=${GROUP:-anchors}; mkdir -p "$OUT"
T0=$(date +%s); DEADLINE=${DEADLINE:-460}
source tests/gpu/setup.sh
timeout $(( DEADLINE - $(elapsed) - 10 )) python3 benchmarks/bench_gpu.py --group "$GROUP" --out /tmp/bench_gpu \
  --trl_pythonpath /tmp/site-trl ${BENCH_FLAGS:-} > "$OUT/bench.log" 2>&1
echo "bench exit $? at $(elapsed) s"
cp /tmp/bench_gpu/results.json /tmp/bench_gpu/table.md "$OUT/" 2>/dev/null
for log in /tmp/bench_gpu/runs/*/run.log; do echo "== $log"; tail -15 "$log"; done > "$OUT/runs.log" 2>/dev/null
grep -E "^\S.*: \{" "$OUT/bench.log" | cut -c1-300
cat "$OUT/table.md" 2>/dev/null || tail -30 "$OUT/bench.log"
