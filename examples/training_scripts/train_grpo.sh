#!/usr/bin/env bash
# GRPO with the verifiable math reward on one node. Defaults start from `make demo`'s SFT model; prepare
# prompt data (with a gt_answer field) first:
#   python examples/data_preparation_scripts/prepare_dataset.py --type prompt \
#       --data_input_dirs prompts.jsonl --tokenizer_dir "$MODEL" --data_output_dirs "$DATA"
set -euo pipefail
MODEL=${MODEL:-output/demo/sft/model}
DATA=${DATA:-output/demo/data/prompt_train}
OUT=${OUT:-output/grpo_example}
NPROC=${NPROC:-2}
PLUGIN=${PLUGIN:-ddp}

torchrun --standalone --nproc_per_node "$NPROC" "$(dirname "$0")/train_grpo.py" \
    --pretrain "$MODEL" --prompt_dataset "$DATA" --plugin "$PLUGIN" --reward_fn math_answer \
    --num_generations 8 --max_new_tokens 32 --batch_size 4 --num_episodes 50 --lr 1e-4 \
    --save_dir "$OUT/checkpoints" --save_interval 10 --keep_last 2 \
    --log_dir "$OUT/logs" --output_dir "$OUT" "$@"
