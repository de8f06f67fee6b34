"""Serve a trained coati reward model (train_rm.py's output) over HTTP, for `--reward_fn http://host:port/score`.

    python examples/reward_server.py --model output/rm/model --port 8000

Speaks the schema of `coati.rewards.remote`: scores each request's `input_ids` when it has them (exactly what the
policy generated), else its `query` texts tokenized as they are; answers `{"rewards": [...]}`. With `--log FILE` it
appends every request's sequences and scores to FILE (JSON lines), for auditing. Prints one line
`serving <model> on http://host:port/path` when it is ready.

It listens on loopback (127.0.0.1) unless `--host` says otherwise. With a token (`--token`, or the environment's
`COATI_REWARD_TOKEN`) every request must carry it (`Authorization: Bearer <token>`; trainers send
`COATI_REWARD_TOKEN`), else it is refused with 401. Listening beyond loopback without a token is refused in one line
unless `--allow_unauthenticated` says so: an open scorer on every interface is OpenRLHF #1317.
"""
import argparse
import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from coati.dataset.collators import pad_sequences
from coati.utils import http_json
from coati.utils.http_json import JsonHandler
from coati.models.reward_model import load_reward_model, sequence_rewards
from coati.models.vision import is_vision_model
from coati.rewards.remote import TOKEN_ENV
from coati.cli.options import CoatiArgumentParser
from coati.utils.ranges import at_least
from coati.utils.errors import CoatiUsageError, exit_cleanly
from transformers import AutoTokenizer


class RewardModelScorer:
    """The reward model and its tokenizer; `score` takes token-id rows or texts, `batch_size` rows per forward."""

    def __init__(self, model_dir: str, batch_size: int) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = load_reward_model(model_dir, self.tokenizer.pad_token_id).eval()
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def token_ids(self, request: Dict[str, Any]) -> List[List[int]]:
        if request.get("input_ids") is not None:
            return [[int(t) for t in row] for row in request["input_ids"]]
        if not isinstance(request.get("query"), list):
            raise ValueError("the request needs 'input_ids' or a list 'query'")
        return [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in request["query"]]

    @torch.no_grad()
    def score(self, rows: List[List[int]]) -> List[float]:
        scores: List[float] = []
        with self._lock:
            for start in range(0, len(rows), self.batch_size):
                batch = rows[start:start + self.batch_size]
                ids = pad_sequences(batch, self.tokenizer.pad_token_id, left=True)
                mask = pad_sequences([[1] * len(row) for row in batch], 0, left=True)
                scores += sequence_rewards(self.model, ids, mask).tolist()
        return scores


def handler(scorer: RewardModelScorer, path: str, log: Optional[str], token: Optional[str] = None) -> type:
    log_lock = threading.Lock()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            if not self.authorized():
                return
            if self.path != path:
                return self.answer(404, {"error": f"POST to {path}"})
            try:
                rows = scorer.token_ids(self.read_json())
            except (ValueError, TypeError, AttributeError) as error:
                return self.answer(400, {"error": f"bad request: {error}"})
            rewards = scorer.score(rows)
            if log:
                with log_lock, open(log, "a") as f:
                    f.writelines(json.dumps({"input_ids": r, "reward": s}) + "\n" for r, s in zip(rows, rewards))
            self.answer(200, {"rewards": rewards})

    Handler.token = token
    return Handler


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = CoatiArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a reward model directory (train_rm.py's output)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=at_least(0), default=8000, help="0: any free port (the ready line names it)")
    parser.add_argument("--path", default="/score", help="the URL path that scores")
    parser.add_argument("--batch_size", type=at_least(1), default=16, help="sequences per forward")
    parser.add_argument("--log", default=None, help="append each scored sequence and its reward to this JSONL file")
    parser.add_argument("--token", default=None,
                        help=f"the bearer token every request must carry (default: ${TOKEN_ENV}, which keeps it out of "
                             "the process list)")
    parser.add_argument("--allow_unauthenticated", action="store_true",
                        help="listen beyond loopback without a token (anyone who reaches the port can use it)")
    return parser.parse_args(argv)


def server_token(args: argparse.Namespace) -> Optional[str]:
    """The token requests must carry (`--token`, else the environment's), or None; refuses to listen beyond loopback
    without one unless `--allow_unauthenticated`."""
    try:
        return http_json.server_token(args.token, TOKEN_ENV, args.host, args.allow_unauthenticated)
    except ValueError as error:
        raise CoatiUsageError(str(error)) from None


@exit_cleanly
def main() -> None:
    args = parse_args()
    if not (Path(args.model) / "config.json").is_file():
        raise CoatiUsageError(f"--model {args.model} is not a model directory (no config.json)")
    if is_vision_model(args.model):
        raise CoatiUsageError(f"--model {args.model} is a vision-language reward model: requests carry token ids, not "
                              "the images it reads; give it to the trainer as --rm_pretrain instead")
    token = server_token(args)
    scorer = RewardModelScorer(args.model, args.batch_size)
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler(scorer, args.path, args.log, token))
    except OSError as error:
        raise CoatiUsageError(f"--host {args.host} --port {args.port}: cannot listen there ({error.strerror})") from None
    host, port = server.server_address[:2]
    print(f"serving {args.model} on http://{host}:{port}{args.path}" + (" (bearer token required)" if token else ""),
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
