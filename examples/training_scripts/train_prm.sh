#!/usr/bin/env bash
# Process reward model training on one node. Defaults start from `make demo`'s SFT model; prepare step-labelled
# solutions first (TRL's stepwise format: prompt, completions = the steps, labels = a bool per step):
#   python examples/data_preparation_scripts/prepare_dataset.py --type prm \
#       --data_input_dirs raw_steps.jsonl --tokenizer_dir "$MODEL" --data_output_dirs "$DATA"
set -euo pipefail
MODEL=${MODEL:-output/demo/sft/model}
DATA=${DATA:-output/prm_example/data}
OUT=${OUT:-output/prm_example}
NPROC=${NPROC:-2}
PLUGIN=${PLUGIN:-ddp}

torchrun --standalone --nproc_per_node "$NPROC" "$(dirname "$0")/train_prm.py" \
    --pretrain "$MODEL" --dataset "$DATA" --plugin "$PLUGIN" \
    --batch_size 16 --max_epochs 1 --lr 1e-3 \
    --save_dir "$OUT/checkpoints" --save_interval 20 --keep_last 2 \
    --log_dir "$OUT/logs" --log_interval 5 --output_dir "$OUT" "$@"
