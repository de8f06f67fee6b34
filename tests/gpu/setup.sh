# Sourced by check.sh and bench.sh on a GPU machine whose Python has torch with CUDA: installs the wheels of
# tests/gpu/wheels.sh over that torch (coati's stack in /tmp/site; TRL, where wheels.sh gathered it, in /tmp/site-trl
# beside the image's own transformers), builds colossalai's Adam kernels once, and logs the versions to $OUT/setup.log.
# Needs OUT, WHEELS and T0 set; defines `elapsed`.
elapsed() { echo $(( $(date +%s) - T0 )); }
install() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@" \
  >> "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }; }
install /tmp/site "$WHEELS"/*.whl
[ -d "$WHEELS/trl" ] && install /tmp/site-trl "$WHEELS"/trl/*.whl
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
