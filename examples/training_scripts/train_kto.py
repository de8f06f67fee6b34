"""KTO on prepared KTO data (prompt, completion, desirable-or-not label) against a frozen reference.

    torchrun --nproc_per_node 2 examples/training_scripts/train_kto.py --pretrain SFT_MODEL \
        --dataset data/kto --plugin ddp --batch_size 8 --beta 0.1 --save_dir ckpt/kto --output_dir out/kto
"""
from coati.cli.arguments import add_reference_args, training_parser
from coati.utils.ranges import positive
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    group = parser.add_argument_group("KTO loss")
    group.add_argument("--beta", type=positive(), default=0.1, help="inverse temperature")
    group.add_argument("--desirable_weight", type=positive(), default=1.0, help="weight of desirable completions")
    group.add_argument("--undesirable_weight", type=positive(), default=1.0, help="weight of undesirable completions")
    add_reference_args(parser, precompute=False)
    add_colossalchat_flags(parser, "kto")
    args = parser.parse_args(argv)
    from coati.models.loss import KTOLoss   # the training stack loads once the flags are read
    from coati.trainer.kto import KTOTrainer, balance_kto_weights
    from coati.cli.runner import reference_hook, run_supervised

    loss = KTOLoss(args.beta, args.desirable_weight, args.undesirable_weight)

    def setup(context):
        if args.auto_weight:
            balance_kto_weights(loss, context.load_data(args.dataset)["desirable"])
        return reference_hook(context)

    run_supervised(args, KTOTrainer, "kto", trainer_kwargs={"loss_fn": loss}, setup_hook=setup)


if __name__ == "__main__":
    main()
