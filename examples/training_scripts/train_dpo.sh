#!/usr/bin/env bash
# DPO (or --loss_type ipo / simpo) on one node. Defaults start from `make demo`'s SFT model; prepare preference data first:
#   python examples/data_preparation_scripts/prepare_dataset.py --type preference \
#       --data_input_dirs raw.jsonl --tokenizer_dir "$MODEL" --data_output_dirs "$DATA"
set -euo pipefail
MODEL=${MODEL:-output/demo/sft/model}
DATA=${DATA:-output/dpo_example/data}
OUT=${OUT:-output/dpo_example}
NPROC=${NPROC:-2}
PLUGIN=${PLUGIN:-ddp}

torchrun --standalone --nproc_per_node "$NPROC" "$(dirname "$0")/train_dpo.py" \
    --pretrain "$MODEL" --dataset "$DATA" --plugin "$PLUGIN" --loss_type sigmoid --beta 0.1 --precompute_ref_logps \
    --batch_size 16 --max_epochs 1 --lr 1e-3 \
    --save_dir "$OUT/checkpoints" --save_interval 20 --keep_last 2 \
    --log_dir "$OUT/logs" --log_interval 5 --output_dir "$OUT" "$@"
