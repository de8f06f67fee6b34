#!/usr/bin/env bash
# KTO on one node. Defaults start from `make demo`'s SFT model; prepare kto data first:
#   python examples/data_preparation_scripts/prepare_dataset.py --type kto \
#       --data_input_dirs raw.jsonl --tokenizer_dir "$MODEL" --data_output_dirs "$DATA"
set -euo pipefail
MODEL=${MODEL:-output/demo/sft/model}
DATA=${DATA:-output/kto_example/data}
OUT=${OUT:-output/kto_example}
NPROC=${NPROC:-2}
PLUGIN=${PLUGIN:-ddp}

torchrun --standalone --nproc_per_node "$NPROC" "$(dirname "$0")/train_kto.py" \
    --pretrain "$MODEL" --dataset "$DATA" --plugin "$PLUGIN" --beta 0.1 --desirable_weight 1.0 --undesirable_weight 1.0 \
    --batch_size 16 --max_epochs 1 --lr 1e-3 \
    --save_dir "$OUT/checkpoints" --save_interval 20 --keep_last 2 \
    --log_dir "$OUT/logs" --log_interval 5 --output_dir "$OUT" "$@"
