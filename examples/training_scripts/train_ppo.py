"""PPO with a trained reward model (and/or verifiable reward functions) on prepared prompt data.

    torchrun --nproc_per_node 2 examples/training_scripts/train_ppo.py --pretrain SFT_MODEL \
        --rm_pretrain RM_MODEL --prompt_dataset data/prompts --eval_dataset data/prompts_eval \
        --plugin ddp --batch_size 8 --num_episodes 20 --output_dir out/ppo
"""
from coati.cli.arguments import add_ppo_args, add_reference_args, training_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0], dataset_flag="--prompt_dataset", on_policy=True)
    add_ppo_args(parser)
    add_reference_args(parser, precompute=False)
    add_colossalchat_flags(parser, "ppo")
    args = parser.parse_args(argv)
    from coati.cli.rl_runner import run_ppo   # the training stack loads once the flags are read

    run_ppo(args)


if __name__ == "__main__":
    main()
