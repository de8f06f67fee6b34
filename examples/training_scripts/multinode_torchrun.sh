#!/usr/bin/env bash
# Start a training script on several nodes with torchrun. Run it on every node:
#
#   NNODES=2 NODE_RANK=0 RDZV_ENDPOINT=node0:29400 NPROC_PER_NODE=8 \
#       examples/training_scripts/multinode_torchrun.sh train_sft.py --pretrain MODEL --dataset DATA ...
#
# NODE_RANK=0 must run on the node RDZV_ENDPOINT names: its torchrun hosts the store every rank meets at.
# The rendezvous is torchrun's static one: a fixed number of nodes and no restarts, as `colossalai run`
# starts them. A run that loses a node stops and resumes from its last checkpoint; the launchers never talk
# to the store after the start, so a node cut off from node 0 ends as soon as its ranks do (--dist_timeout).
# RDZV_JOIN_TIMEOUT (default 600 s) is how long node 0 waits for every node to join.
set -euo pipefail
: "${NNODES:?set NNODES}" "${NODE_RANK:?set NODE_RANK}" "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=HOST:PORT of node 0}"
SCRIPT=$1
shift
[ -f "$SCRIPT" ] || SCRIPT="$(dirname "$0")/$SCRIPT"

exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "${NPROC_PER_NODE:-1}" \
    --rdzv_backend static --rdzv_endpoint "$RDZV_ENDPOINT" --rdzv_conf "timeout=${RDZV_JOIN_TIMEOUT:-600}" \
    "$SCRIPT" "$@"
