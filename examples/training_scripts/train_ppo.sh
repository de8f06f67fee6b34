#!/usr/bin/env bash
# PPO with a trained reward model on one node. Defaults start from `make demo`'s SFT and reward models;
# prepare prompt data first:
#   python examples/data_preparation_scripts/prepare_dataset.py --type prompt \
#       --data_input_dirs prompts.jsonl --tokenizer_dir "$MODEL" --data_output_dirs "$DATA"
# The critic starts from the reward model; add --reward_fn math_answer to mix in a verifiable reward,
# and --ptx_dataset SFT_DATA --ptx_coef 0.1 for InstructGPT's PPO-ptx.
set -euo pipefail
MODEL=${MODEL:-output/demo/sft/model}
RM=${RM:-output/demo/rm/model}
DATA=${DATA:-output/demo/data/prompt_train}
OUT=${OUT:-output/ppo_example}
NPROC=${NPROC:-2}
PLUGIN=${PLUGIN:-ddp}

torchrun --standalone --nproc_per_node "$NPROC" "$(dirname "$0")/train_ppo.py" \
    --pretrain "$MODEL" --rm_pretrain "$RM" --prompt_dataset "$DATA" --plugin "$PLUGIN" \
    --max_new_tokens 32 --batch_size 16 --num_episodes 50 --lr 5e-5 --critic_lr 1e-4 --kl_coef 0.05 \
    --save_dir "$OUT/checkpoints" --save_interval 10 --keep_last 2 \
    --log_dir "$OUT/logs" --output_dir "$OUT" "$@"
