"""Reward-model training on prepared preference pairs.

    torchrun --nproc_per_node 2 examples/training_scripts/train_rm.py --pretrain SFT_MODEL \
        --dataset data/rm --plugin ddp --batch_size 8 --save_dir ckpt/rm --output_dir out/rm --log_dir logs/rm
"""
from coati.cli.arguments import training_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly

LOSSES = ("log_sig", "log_exp")


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--loss_fn", default="log_sig", choices=LOSSES, help="pairwise loss")
    add_colossalchat_flags(parser, "rm")
    args = parser.parse_args(argv)
    from coati.models.loss import LogExpLoss, LogSigLoss   # the training stack loads once the flags are read
    from coati.trainer.rm import RewardModelTrainer
    from coati.cli.runner import load_reward_model_from_args, run_supervised

    loss_fn = {"log_sig": LogSigLoss, "log_exp": LogExpLoss}[args.loss_fn]
    run_supervised(args, RewardModelTrainer, "preference",
                   model_loader=load_reward_model_from_args,
                   trainer_kwargs={"loss_fn": loss_fn(reduction="none")})


if __name__ == "__main__":
    main()
