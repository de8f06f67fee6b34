"""Validate and tokenize raw data into a prepared dataset for the training scripts.

    python examples/data_preparation_scripts/prepare_dataset.py --type preference \
        --data_input_dirs raw/ --tokenizer_dir MODEL --data_output_dirs data/rm --max_length 2048

A bad row (malformed JSON, a missing field, a wrong role order, an empty assistant turn) stops with one
line naming file, line and field, and exit status 2; `--skip_invalid` counts such rows instead.
"""
from coati.dataset.prepare import prepare_dataset
from coati.dataset.tokenization import load_tokenizer
from coati.utils.cli import CoatiArgumentParser, at_least
from coati.utils.errors import CoatiUsageError, exit_cleanly
from coati.utils.preflight import check_writable_dir, resolve_model_dir


@exit_cleanly
def main(argv=None) -> None:
    parser = CoatiArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--type", required=True, choices=("sft", "preference", "prompt", "kto"), help="what the rows are")
    parser.add_argument("--data_input_dirs", nargs="+", required=True,
                        help="JSONL files, folders of them, or local dataset folders that datasets.load_dataset reads")
    parser.add_argument("--tokenizer_dir", required=True, help="tokenizer (with its chat template): a folder or a Hugging Face model id")
    parser.add_argument("--data_output_dirs", required=True, help="where the prepared dataset is saved")
    parser.add_argument("--max_length", type=at_least(1), default=2048, help="tokens per sequence; longer ones are cut from the right")
    parser.add_argument("--conversation_template_config", default=None,
                        help='JSON with "chat_template" (and optional "end_of_turn_token") for a tokenizer without one')
    parser.add_argument("--skip_invalid", action="store_true", help="skip and count invalid rows instead of stopping")
    parser.add_argument("--trust_remote_code", action="store_true", help="allow custom tokenizer code")
    args = parser.parse_args(argv)
    check_writable_dir(args.data_output_dirs, "--data_output_dirs")
    args.tokenizer_dir = resolve_model_dir(args.tokenizer_dir, "--tokenizer_dir")
    tokenizer = load_tokenizer(args.tokenizer_dir, args.trust_remote_code, args.conversation_template_config)
    if not tokenizer.chat_template:
        raise CoatiUsageError(f"the tokenizer in {args.tokenizer_dir} has no chat template; pass --conversation_template_config")
    counts = prepare_dataset(args.data_input_dirs, args.type, tokenizer, args.max_length, args.data_output_dirs,
                             skip_invalid=args.skip_invalid)
    print(f"prepared {args.type} dataset in {args.data_output_dirs}: {counts['kept']} of {counts['rows']} valid rows kept, "
          f"{counts['dropped']} dropped by truncation, {counts['skipped']} invalid rows skipped")


if __name__ == "__main__":
    main()
