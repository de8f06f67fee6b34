"""Direct preference optimisation on prepared preference pairs: DPO, IPO or SimPO (`--loss_type`).

    torchrun --nproc_per_node 2 examples/training_scripts/train_dpo.py --pretrain SFT_MODEL \
        --dataset data/pref --plugin ddp --batch_size 8 --beta 0.1 --save_dir ckpt/dpo --output_dir out/dpo
"""
import argparse
from typing import Any

from coati.cli.arguments import add_reference_args, training_parser
from coati.utils.ranges import in_range, non_negative, positive
from coati.cli.colossalchat import add_colossalchat_flags
from coati.utils.errors import exit_cleanly

DEFAULT_BETA = {"sigmoid": 0.1, "ipo": 0.1, "simpo": 2.0, "dpo_loss": 0.1, "simpo_loss": 0.1}
COLOSSALCHAT_MARGIN = 1.4
"""ColossalChat's default --gamma for its simpo_loss."""


@exit_cleanly
def main(argv=None) -> None:
    parser = training_parser(__doc__.strip().splitlines()[0])
    group = parser.add_argument_group("preference loss")
    group.add_argument("--loss_type", default="sigmoid", choices=tuple(DEFAULT_BETA),
                       help="sigmoid: DPO; ipo: IPO; simpo: SimPO (no reference model); ColossalChat's names: "
                            "dpo_loss is sigmoid, simpo_loss is DPO on length-normalised log-probs with a margin "
                            f"(--gamma, default {COLOSSALCHAT_MARGIN}), the reference kept unless --disable_reference_model")
    group.add_argument("--beta", type=positive(), default=None, help="inverse temperature (default: 0.1; simpo 2.0)")
    group.add_argument("--label_smoothing", type=in_range(0, 0.5, high_open=True), default=0.0, help="cDPO: assumed rate of flipped labels")
    group.add_argument("--gamma", type=non_negative(), default=None,
                       help="target reward margin (default: simpo 0.5; sigmoid 0, ColossalChat's DPO margin)")
    add_reference_args(parser)
    add_colossalchat_flags(parser, "dpo")
    args = parser.parse_args(argv)
    from coati.trainer.dpo import DPOTrainer   # the training stack loads once the flags are read
    from coati.cli.runner import reference_hook, run_supervised

    loss = preference_loss(args)
    run_supervised(args, DPOTrainer, "preference", trainer_kwargs={"loss_fn": loss},
                   setup_hook=reference_hook if loss.needs_reference else None)


def preference_loss(args: argparse.Namespace) -> Any:
    """The loss `--loss_type` names, with `--beta`, `--gamma` and `--label_smoothing` (their defaults per loss)."""
    from coati.models.loss import DPOLoss, SimPOLoss

    beta = DEFAULT_BETA[args.loss_type] if args.beta is None else args.beta
    if args.loss_type == "simpo":
        return SimPOLoss(beta, 0.5 if args.gamma is None else args.gamma, args.label_smoothing)
    colossalchat_simpo = args.loss_type == "simpo_loss"
    margin = COLOSSALCHAT_MARGIN if colossalchat_simpo and args.gamma is None else args.gamma or 0.0
    return DPOLoss(beta, args.label_smoothing, "ipo" if args.loss_type == "ipo" else "sigmoid", margin,
                   reference_free=args.disable_reference_model,
                   length_normalization=args.length_normalization or colossalchat_simpo)


if __name__ == "__main__":
    main()
