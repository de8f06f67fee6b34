#!/usr/bin/env bash
# Start a training script on every host of a hostfile with `colossalai run`, from one node:
#
#   HOSTFILE=examples/training_scripts/hostfile NPROC_PER_NODE=8 \
#       examples/training_scripts/multinode_colossalai.sh train_sft.py --pretrain MODEL --dataset DATA ...
#
# colossalai run logs in to each host over SSH (keys, no password), changes to this directory there,
# exports this shell's environment and runs torchrun with --node_rank in hostfile order. The first host
# is the master (MASTER_ADDR overrides it); every host needs the same paths and Python environment.
set -euo pipefail
HOSTFILE=${HOSTFILE:-$(dirname "$0")/hostfile}
MASTER_ADDR=${MASTER_ADDR:-$(grep -m1 . "$HOSTFILE")}
SCRIPT=$1
shift
[ -f "$SCRIPT" ] || SCRIPT="$(dirname "$0")/$SCRIPT"

exec colossalai run --nproc_per_node "${NPROC_PER_NODE:-1}" --hostfile "$HOSTFILE" \
    --master_addr "$MASTER_ADDR" --master_port "${MASTER_PORT:-29500}" "$SCRIPT" "$@"
