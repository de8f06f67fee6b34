#!/usr/bin/env bash
# SFT on one node. Defaults point at `make demo`'s outputs; set the variables for your own model and data.
set -euo pipefail
MODEL=${MODEL:-output/demo/model_init}
DATA=${DATA:-output/demo/data/sft_train}
EVAL_DATA=${EVAL_DATA:-output/demo/data/sft_eval}
OUT=${OUT:-output/sft_example}
NPROC=${NPROC:-2}
PLUGIN=${PLUGIN:-ddp}

torchrun --standalone --nproc_per_node "$NPROC" "$(dirname "$0")/train_sft.py" \
    --pretrain "$MODEL" --dataset "$DATA" --eval_dataset "$EVAL_DATA" --plugin "$PLUGIN" \
    --batch_size 16 --accumulation_steps 1 --max_epochs 1 --lr 3e-3 --warmup_steps 5 \
    --save_dir "$OUT/checkpoints" --save_interval 20 --keep_last 2 \
    --log_dir "$OUT/logs" --log_interval 5 --output_dir "$OUT" "$@"
