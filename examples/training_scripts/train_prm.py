"""Process reward model training on prepared step-labelled solutions (prepare_dataset.py --type prm).

    torchrun --nproc_per_node 2 examples/training_scripts/train_prm.py --pretrain SFT_MODEL \
        --dataset data/prm --plugin ddp --batch_size 8 --save_dir ckpt/prm --output_dir out/prm --log_dir logs/prm
"""
from coati.cli.arguments import training_parser
from coati.cli.colossalchat import add_colossalchat_flags
from coati.dataset.tokenization import DEFAULT_STEP_SEPARATOR
from coati.utils.errors import CoatiUsageError, exit_cleanly


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    parser.add_argument("--step_separator", default=DEFAULT_STEP_SEPARATOR,
                        help="what ends each step, saved with the model for PPO/GRPO to find the steps of a completion "
                             "(prepare_dataset.py --type prm joins steps with \\n)")
    add_colossalchat_flags(parser, "prm")
    parser.set_defaults(disable_loss_mask=False)
    args = parser.parse_args(argv)
    if args.packing:
        raise CoatiUsageError("--packing is not for train_prm.py: a PRM reads its labels at the steps' ends of padded "
                              "rows")
    from coati.trainer.prm import PRMTrainer   # the training stack loads once the flags are read
    from coati.cli.runner import load_prm_from_args, run_supervised

    run_supervised(args, PRMTrainer, "prm", model_loader=load_prm_from_args)


if __name__ == "__main__":
    main()
