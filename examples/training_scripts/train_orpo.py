"""ORPO on prepared preference pairs: SFT on chosen plus an odds-ratio penalty, no reference model.

    torchrun --nproc_per_node 2 examples/training_scripts/train_orpo.py --pretrain MODEL \
        --dataset data/pref --plugin ddp --batch_size 8 --lam 0.1 --save_dir ckpt/orpo --output_dir out/orpo
"""
from coati.cli.arguments import training_parser
from coati.utils.ranges import non_negative
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--lam", type=non_negative(), default=0.1, help="weight of the odds-ratio term")
    add_colossalchat_flags(parser, "orpo")
    args = parser.parse_args(argv)
    from coati.models.loss import ORPOLoss   # the training stack loads once the flags are read
    from coati.trainer.dpo import ORPOTrainer
    from coati.cli.runner import run_supervised

    run_supervised(args, ORPOTrainer, "preference", trainer_kwargs={"loss_fn": ORPOLoss(args.lam)})


if __name__ == "__main__":
    main()
