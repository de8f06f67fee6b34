"""Validate and tokenize raw data into a prepared dataset for the training scripts.

    python examples/data_preparation_scripts/prepare_dataset.py --type preference \
        --data_input_dirs raw/ --tokenizer_dir MODEL --data_output_dirs data/rm --max_length 2048

A bad row (malformed JSON, a missing field, a wrong role order, an empty assistant turn) stops with one
line naming file, line and field, and exit status 2; `--skip_invalid` counts such rows instead.
"""
from typing import List

from coati.cli.options import CoatiArgumentParser
from coati.utils.ranges import at_least
from coati.utils.errors import CoatiUsageError, exit_cleanly
from coati.utils.file_checks import check_writable_dir, resolve_model_dir


COLOSSALCHAT_BINS = 10
"""ColossalChat's default --num_spliced_dataset_bins."""


def comma_list(value: str) -> List[str]:
    """ColossalChat passes several inputs as one comma-separated value."""
    return [part for part in value.split(",") if part]


@exit_cleanly
def main(argv=None) -> None:
    parser = CoatiArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--type", required=True, choices=("sft", "preference", "prompt", "kto", "prm"),
                        help="what the rows are (prm: steps with a label each, for train_prm.py)")
    parser.add_argument("--data_input_dirs", nargs="+", required=True, type=comma_list,
                        help="JSONL files, folders of them, or local dataset folders that datasets.load_dataset reads "
                             "(several: space- or comma-separated)")
    parser.add_argument("--tokenizer_dir", required=True, help="tokenizer (with its chat template): a folder or a Hugging Face model id")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--data_output_dirs", help="where the prepared dataset is saved: one folder")
    output.add_argument("--data_arrow_output_dir", help="ColossalChat's layout: one dataset folder per part, "
                        "part-00000, part-00001, ... (train on the folder, or on the parts one by one)")
    parser.add_argument("--max_length", type=at_least(1), default=2048, help="tokens per sequence; longer ones are cut from the right")
    parser.add_argument("--conversation_template_config", default=None,
                        help='ColossalChat\'s template JSON: "chat_template" (else the tokenizer\'s own), "system_message" '
                             '(opens each conversation without a system turn) and "end_of_turn_token"')
    parser.add_argument("--skip_invalid", action="store_true", help="skip and count invalid rows instead of stopping")
    parser.add_argument("--trust_remote_code", action="store_true", help="allow custom tokenizer code")
    parser.add_argument("--data_cache_dir", default=None, help="cache of datasets.load_dataset for dataset-folder inputs")
    parser.add_argument("--num_spliced_dataset_bins", type=at_least(1), default=None,
                        help="parts the rows are split into, as ColossalChat splits them (default: 10 with "
                             "--data_arrow_output_dir, 1 with --data_output_dirs, where each part is an arrow file)")
    parser.add_argument("--data_jsonl_output_dir", default=None,
                        help="also write each part as part-NNNNN.jsonl here, with its text decoded (ColossalChat's check)")
    parser.add_argument("--num_samples_per_datafile", type=at_least(-1), default=-1,
                        help="keep at most this many rows of each part, sampled with a fixed seed (-1 or 0: all)")
    args = parser.parse_args(argv)
    out_dir = args.data_output_dirs or args.data_arrow_output_dir
    check_writable_dir(out_dir, "--data_arrow_output_dir" if args.data_arrow_output_dir else "--data_output_dirs")
    if args.data_jsonl_output_dir:
        check_writable_dir(args.data_jsonl_output_dir, "--data_jsonl_output_dir")
    args.tokenizer_dir = resolve_model_dir(args.tokenizer_dir, "--tokenizer_dir")
    from coati.dataset.prepare import OutputLayout, prepare_dataset   # tokenizers, datasets: once flags are checked
    from coati.dataset.tokenization import load_tokenizer, template_system_message

    tokenizer = load_tokenizer(args.tokenizer_dir, args.trust_remote_code, args.conversation_template_config)
    if not tokenizer.chat_template:
        raise CoatiUsageError(f"the tokenizer in {args.tokenizer_dir} has no chat template; pass --conversation_template_config")
    part_folders = args.data_arrow_output_dir is not None
    bins = args.num_spliced_dataset_bins or (COLOSSALCHAT_BINS if part_folders else 1)
    layout = OutputLayout(bins, part_folders, args.data_jsonl_output_dir, max(args.num_samples_per_datafile, 0))
    counts = prepare_dataset([p for group in args.data_input_dirs for p in group], args.type, tokenizer,
                             args.max_length, out_dir, skip_invalid=args.skip_invalid, layout=layout,
                             cache_dir=args.data_cache_dir,
                             system_message=template_system_message(args.conversation_template_config))
    sampled = f", {counts['unsampled']} left out by --num_samples_per_datafile" if counts["unsampled"] else ""
    print(f"prepared {args.type} dataset in {out_dir}: {counts['kept']} of {counts['rows']} valid rows kept, "
          f"{counts['dropped']} dropped by truncation{sampled}, {counts['skipped']} invalid rows skipped")


if __name__ == "__main__":
    main()
