"""Reward-model training on prepared preference pairs.

    torchrun --nproc_per_node 2 examples/training_scripts/train_rm.py --pretrain SFT_MODEL \
        --dataset data/rm --plugin ddp --batch_size 8 --save_dir ckpt/rm --output_dir out/rm --log_dir logs/rm
"""
from coati.models.loss import LogExpLoss, LogSigLoss
from coati.trainer.rm import RewardModelTrainer
from coati.trainer.runner import load_reward_model_from_args, run_supervised
from coati.utils.arguments import training_parser
from coati.utils.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly

LOSSES = {"log_sig": LogSigLoss, "log_exp": LogExpLoss}


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--loss_fn", default="log_sig", choices=tuple(LOSSES), help="pairwise loss")
    add_colossalchat_flags(parser, "rm")
    args = parser.parse_args(argv)
    run_supervised(args, RewardModelTrainer, "preference",
                   model_loader=load_reward_model_from_args,
                   trainer_kwargs={"loss_fn": LOSSES[args.loss_fn](reduction="none")})


if __name__ == "__main__":
    main()
