"""A judge model behind an OpenAI-compatible endpoint, for `--reward_fn judge` (`coati.rewards.judge`), or a
distillation teacher, for `--teacher_url` (`coati.experience.distillation`).

    python -m coati.inference.judge_server --model DIR [--engine hf|vllm] [--port 8001]

Serves `POST /v1/chat/completions` (messages rendered with the model's chat template), `POST /v1/completions` (a
prompt, or a list of them: one batch), `GET /v1/models` and vLLM's `POST /tokenize`, decoding greedily unless a
request asks for a temperature. A completions request with `prompt_logprobs: K` and token-id prompts is scored
instead, as vLLM answers it: each choice's `prompt_logprobs` holds, per position (the first None), the log-prob and
rank of the prompt's token and of the model's K likeliest there, keyed by token id; nothing is generated. Requests
that arrive together are generated (or scored) as one batch (at most `--max_batch` prompts), on the
transformers model (`--engine hf`) or a vLLM engine in this process (`--engine vllm`, run with vLLM's environment's
interpreter). It listens on loopback unless `--host` says otherwise, and every request must carry the token in
`COATI_JUDGE_TOKEN` (`Authorization: Bearer ...`); starting without one is refused unless `--allow_unauthenticated`.
When ready it prints `serving judge DIR on http://HOST:PORT/v1` and writes that URL to `--ready_file`. A trainer that
starts it (`coati.inference.local_judge`) holds a lifeline pipe (`COATI_JUDGE_LIFELINE_FD`) whose end of file stops
it, however the trainer ends.

Imports only the standard library and coati's light utilities at the top, so that it runs in vLLM's environment as
well as in coati's.
"""
import argparse
import os
import queue
import sys
import threading
import time
from concurrent.futures import Future
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from coati.utils.http_json import JsonHandler
from coati.inference.vllm_server import watch_lifeline

TOKEN_ENV = "COATI_JUDGE_TOKEN"
LIFELINE_ENV = "COATI_JUDGE_LIFELINE_FD"
API_PREFIX = "/v1"
INCOMPLETE = "\ufffd"
"""What a character cut off by `max_tokens` (some of its bytes generated) decodes to; left off the end, as vLLM does."""


class HFJudgeEngine:
    """The judge on transformers: greedy (or sampled) generation of a batch of texts, left-padded, tokenized without
    added special tokens (the chat template brings its own)."""

    def __init__(self, model_dir: str, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(device).eval()
        self.device, self.vocab_size = device, self.model.get_output_embeddings().weight.size(0)

    def render(self, messages: List[Dict[str, Any]]) -> str:
        return render_chat(self.tokenizer, messages)

    def generate(self, texts: Sequence[str], max_tokens: int, temperature: float) -> List[str]:
        batch = self.tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        sampling = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False)
        with self.torch.no_grad():
            out = self.model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      max_new_tokens=max_tokens, pad_token_id=self.tokenizer.pad_token_id, **sampling)
        texts = self.tokenizer.batch_decode(out[:, batch["input_ids"].size(1):], skip_special_tokens=True)
        return [text.rstrip(INCOMPLETE) for text in texts]

    def prompt_logprobs(self, prompts: Sequence[List[int]], k: int) -> List[List[Optional[Dict[str, Dict]]]]:
        """Per prompt and position (the first None): the log-prob and rank of its token and of the `k` likeliest,
        from one right-padded forward in float32 log-softmax."""
        torch, width = self.torch, max(len(ids) for ids in prompts)
        ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts], device=self.device)
        mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts], device=self.device)
        with torch.no_grad():
            logps = self.model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)
        return [[None] + [_entry(logps[row, t - 1], prompt[t], k) for t in range(1, len(prompt))]
                for row, prompt in enumerate(prompts)]


class VLLMJudgeEngine:
    """The judge on a vLLM engine in this process; texts are tokenized as the hf engine does (the chat template brings
    its own special tokens)."""

    def __init__(self, model_dir: str, gpu_memory_utilization: float, dtype: str) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM, SamplingParams

        self.sampling = SamplingParams
        self.llm = LLM(model=model_dir, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True, dtype=dtype)
        self.tokenizer = self.llm.get_tokenizer()
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()

    def render(self, messages: List[Dict[str, Any]]) -> str:
        return render_chat(self.tokenizer, messages)

    def generate(self, texts: Sequence[str], max_tokens: int, temperature: float) -> List[str]:
        params = self.sampling(max_tokens=max_tokens, temperature=temperature)
        prompts = [{"prompt_token_ids": self.tokenizer(t, add_special_tokens=False)["input_ids"]} for t in texts]
        return [out.outputs[0].text for out in self.llm.generate(prompts, params, use_tqdm=False)]

    def prompt_logprobs(self, prompts: Sequence[List[int]], k: int) -> List[List[Optional[Dict[str, Dict]]]]:
        params = self.sampling(max_tokens=1, temperature=0.0, prompt_logprobs=k)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        return [[None if position is None else {str(t): {"logprob": v.logprob, "rank": v.rank}
                                                for t, v in position.items()} for position in out.prompt_logprobs]
                for out in outs]


def _entry(logps: Any, token: int, k: int) -> Dict[str, Dict[str, float]]:
    """One position's log-probs (`logps` over the vocabulary) as vLLM answers them: `token`'s and the `k`
    likeliest, each with its rank (1: the likeliest)."""
    top = logps.topk(k) if k else None
    entry = {str(token): {"logprob": logps[token].item(), "rank": int((logps > logps[token]).sum().item()) + 1}}
    if top is not None:
        for rank, (value, index) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            entry[str(index)] = {"logprob": value, "rank": rank}
    return entry


def render_chat(tokenizer: Any, messages: List[Dict[str, Any]]) -> str:
    """`messages` as the judge reads them: its chat template with the assistant's turn opened, or, for a model without
    one, the contents one per line."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(str(m.get("content") or "") for m in messages) + "\n"


Job = Tuple[Tuple[Any, ...], Any, Future]
"""What a batch is made of (`("generate", max_tokens, temperature)` or `("score", k)`), one text or token-id prompt,
and where its answer goes."""


class EngineFailure(RuntimeError):
    """The engine failed a batch (answered with 500, not as a bad request)."""


class Batcher:
    """Generates (or scores) the prompts of requests that arrive together as one batch: a worker takes every waiting
    prompt (at most `max_batch`), and runs those with the same settings in one engine call."""

    def __init__(self, engine: Any, max_batch: int) -> None:
        self.engine, self.max_batch = engine, max_batch
        self.jobs: "queue.Queue[Job]" = queue.Queue()
        threading.Thread(target=self._work, name="judge-batcher", daemon=True).start()

    def generate(self, texts: Sequence[str], max_tokens: int, temperature: float) -> List[str]:
        return self._submit(("generate", max_tokens, temperature), texts)

    def score(self, prompts: Sequence[List[int]], k: int) -> List[List[Optional[Dict[str, Dict]]]]:
        return self._submit(("score", k), prompts)

    def _submit(self, key: Tuple[Any, ...], items: Sequence[Any]) -> List[Any]:
        futures = [Future() for _ in items]
        for item, future in zip(items, futures):
            self.jobs.put((key, item, future))
        return [f.result() for f in futures]

    def _work(self) -> None:
        while True:
            jobs = [self.jobs.get()]
            while len(jobs) < self.max_batch and not self.jobs.empty():
                jobs.append(self.jobs.get_nowait())
            groups: Dict[Tuple[Any, ...], List[Job]] = {}
            for job in jobs:
                groups.setdefault(job[0], []).append(job)
            for key, group in groups.items():
                try:
                    items = [job[1] for job in group]
                    answers = (self.engine.prompt_logprobs(items, key[1]) if key[0] == "score"
                               else self.engine.generate(items, key[1], key[2]))
                    for job, answer in zip(group, answers):
                        job[2].set_result(answer)
                except Exception as error:   # each waiting request answers 500 with it
                    for job in group:
                        job[2].set_exception(EngineFailure(f"{type(error).__name__}: {error}"))


def handler(batcher: Batcher, engine: Any, name: str, token: Optional[str]) -> type:
    """The endpoint's request handler: OpenAI's chat-completions, completions and models routes under `/v1`."""
    vocab = engine.vocab_size

    class Handler(JsonHandler):
        def do_GET(self) -> None:
            if not self.authorized():
                return
            if self.path != f"{API_PREFIX}/models":
                return self.answer(404, {"error": f"GET {API_PREFIX}/models"})
            self.answer(200, {"object": "list", "data": [{"id": name, "object": "model"}]})

        def do_POST(self) -> None:
            if not self.authorized():
                return
            routes = {f"{API_PREFIX}/chat/completions": self._chat, f"{API_PREFIX}/completions": self._completions}
            if self.path == "/tokenize":
                return self._tokenize()
            if self.path not in routes:
                return self.answer(404, {"error": f"POST to {', '.join(routes)} or /tokenize"})
            try:
                body = self.read_json()
                max_tokens, temperature = int(body.get("max_tokens") or 64), float(body.get("temperature") or 0.0)
                answer = routes[self.path](body, max_tokens, temperature)
            except EngineFailure as error:
                return self.answer(500, {"error": str(error)})
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                return self.answer(400, {"error": f"bad request: {error}"})
            self.answer(200, {"object": answer[0], "model": name, "created": int(time.time()), "choices": answer[1]})

        def _tokenize(self) -> None:
            """vLLM's `/tokenize`: a text's token ids by the model's tokenizer (a served teacher's vocabulary check)."""
            try:
                body = self.read_json()
                if not isinstance(body.get("prompt"), str):
                    raise ValueError("'prompt' must be a text")
                ids = engine.tokenizer(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True)),
                                       verbose=False)
            except (ValueError, TypeError, AttributeError) as error:
                return self.answer(400, {"error": f"bad request: {error}"})
            self.answer(200, {"tokens": ids["input_ids"], "count": len(ids["input_ids"])})

        def _chat(self, body: Dict[str, Any], max_tokens: int, temperature: float) -> Tuple[str, List[Dict[str, Any]]]:
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            text = batcher.generate([engine.render(messages)], max_tokens, temperature)[0]
            return "chat.completion", [{"index": 0, "message": {"role": "assistant", "content": text},
                                        "finish_reason": "stop"}]

        def _completions(self, body: Dict[str, Any], max_tokens: int,
                         temperature: float) -> Tuple[str, List[Dict[str, Any]]]:
            prompts = body["prompt"]
            if body.get("prompt_logprobs") is not None:
                return "text_completion", self._scored(prompts, int(body["prompt_logprobs"]))
            prompts = [prompts] if isinstance(prompts, str) else prompts
            if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
                raise ValueError("'prompt' must be a text or a non-empty list of texts")
            texts = batcher.generate(prompts, max_tokens, temperature)
            return "text_completion", [{"index": i, "text": t, "finish_reason": "stop"} for i, t in enumerate(texts)]

        def _scored(self, prompts: Any, k: int) -> List[Dict[str, Any]]:
            """Choices holding the prompt log-probs of token-id `prompts` (one list of ids, or a list of them)."""
            prompts = [prompts] if prompts and all(isinstance(t, int) for t in prompts) else prompts
            if (not isinstance(prompts, list) or not prompts or not all(
                    isinstance(p, list) and p and all(isinstance(t, int) and 0 <= t < vocab for t in p)
                    for p in prompts)):
                raise ValueError(f"with prompt_logprobs, 'prompt' must be token ids below {vocab} (a list, or a "
                                 "list of them)")
            if not 0 <= k <= vocab:
                raise ValueError(f"prompt_logprobs must be within 0..{vocab}")
            scored = batcher.score(prompts, k)
            return [{"index": i, "text": "", "prompt_logprobs": s, "finish_reason": "length"}
                    for i, s in enumerate(scored)]

    Handler.token = token
    return Handler


def parse_args(argv: Any = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the judge: a model directory (from_pretrained)")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                        help="hf: transformers in this process; vllm: a vLLM engine (run with vLLM's interpreter)")
    parser.add_argument("--name", default="judge", help="the model name /v1/models lists")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (the ready line names it)")
    parser.add_argument("--device", default="", help="hf engine: cpu, cuda, cuda:1, ... (default: cuda where there is "
                                                     "one, else cpu)")
    parser.add_argument("--max_batch", type=int, default=32, help="prompts generated together at most")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.3, help="vllm engine: its share of the GPU")
    parser.add_argument("--dtype", default="auto", help="vllm engine: the weights' dtype (auto: the model's own)")
    parser.add_argument("--ready_file", default="", help="write the endpoint's URL here once it serves")
    parser.add_argument("--cleanup", default="", help="a folder to remove when the trainer's lifeline closes")
    parser.add_argument("--allow_unauthenticated", action="store_true",
                        help=f"serve without a token (none in {TOKEN_ENV}): anyone who reaches the port may use it")
    args = parser.parse_args(argv)
    if args.max_batch < 1 or not 0 <= args.port < 65536:
        parser.error("--max_batch must be at least 1 and --port within 0..65535")
    return args


def build_engine(args: argparse.Namespace) -> Any:
    if args.engine == "vllm":
        return VLLMJudgeEngine(args.model, args.gpu_memory_utilization, args.dtype)
    import torch

    return HFJudgeEngine(args.model, args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def required_token(args: argparse.Namespace) -> Optional[str]:
    """`COATI_JUDGE_TOKEN`; starting without one is refused unless `--allow_unauthenticated`."""
    token = os.environ.get(TOKEN_ENV, "").strip() or None
    if token is None and not args.allow_unauthenticated:
        raise ValueError(f"set {TOKEN_ENV} to the token every request must carry, or pass --allow_unauthenticated")
    return token


def write_ready(path: str, url: str) -> None:
    """`url` into `path`, whole or not at all (the trainer polls for it)."""
    partial = Path(f"{path}.partial")
    partial.write_text(url)
    partial.replace(path)


def main(argv: Any = None) -> None:
    args = parse_args(argv)
    lifeline = os.environ.get(LIFELINE_ENV)
    if lifeline:
        watch_lifeline(int(lifeline), args.cleanup)
    try:
        token = required_token(args)
        if not Path(args.model, "config.json").is_file():
            raise ValueError(f"--model {args.model} is not a model directory (no config.json)")
    except ValueError as error:
        sys.exit(f"error: {error}")
    engine = build_engine(args)
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler(Batcher(engine, args.max_batch), engine,
                                                                     args.name, token))
    except OSError as error:
        sys.exit(f"error: --host {args.host} --port {args.port}: cannot listen there ({error.strerror})")
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}{API_PREFIX}"
    print(f"serving judge {args.model} on {url}", flush=True)
    if args.ready_file:
        write_ready(args.ready_file, url)
    server.serve_forever()


if __name__ == "__main__":
    main()
