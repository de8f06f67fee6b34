"""GRPO with verifiable rewards on prepared prompt data (its ground-truth fields reach the reward).

    torchrun --nproc_per_node 2 examples/training_scripts/train_grpo.py --pretrain SFT_MODEL \
        --prompt_dataset data/prompts --eval_dataset data/prompts_eval --reward_fn math_answer \
        --num_generations 8 --plugin ddp --batch_size 4 --num_episodes 20 --output_dir out/grpo

Add `--async_rollout --max_staleness 1` to generate in Ray actors while the trainer trains.
"""
from coati.cli.arguments import add_grpo_args, add_reference_args, training_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0], dataset_flag="--prompt_dataset", on_policy=True)
    add_grpo_args(parser)
    add_reference_args(parser, precompute=False)
    add_colossalchat_flags(parser, "grpo")
    args = parser.parse_args(argv)
    from coati.cli.rl_runner import run_grpo   # the training stack loads once the flags are read

    run_grpo(args)


if __name__ == "__main__":
    main()
