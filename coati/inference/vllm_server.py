"""A vLLM engine as a generation server for coati's trainer, in an environment of its own.

    VLLM_PYTHON -m coati.inference.vllm_server --model DIR --address ADDRESS

The trainer (`coati.inference.vllm.VLLMServer`) starts it with the interpreter of vLLM's environment and
`PYTHONPATH` at coati's source, so this module imports only the standard library, vLLM and what vLLM brings;
nothing of coati's training stack. Transport: `multiprocessing.connection` on ADDRESS (an abstract Unix socket
`@name`, or `host:port` over TCP), authenticated with the key in `COATI_VLLM_AUTHKEY`. A request is a dict
with an `op`; the answer is a dict, with `error` (one line) when the op failed:

- `info`: `{version, pid, model}`.
- `generate` `{prompts: [[token ids]], n: [int], sampling: {...}}`: token ids in, and per prompt `n`
  completions out as (token ids, each token's log-prob), never text: `{completions, version, seconds}`. Each
  completion samples from a seed of its own (`Seeds`), so the same requests at the same version draw the same.
  Log-probs are vLLM's raw ones (before temperature, top-k, top-p), as the trainer computes its own.
- `score` `{prompts: [[token ids]]}`: each prompt's tokens' log-probs after the first (vLLM's prompt log-probs), as
  the sync probe compares them with the trainer's: `{logprobs, version}`.
- `attach_weights` `{size}`, followed on the connection by a file descriptor (`multiprocessing.reduction.send_handle`):
  the trainer's weight memory (`coati.inference.shared_weights`), mapped here: `{size}`.
- `load_weights` `{layout, base, version}`: the HF-named tensors of `layout` (name, dtype, shape, offset), read from
  the attached memory at byte `base`, loaded in place (any adapter loaded before is dropped); the prefix cache is
  reset, and from then on the server reports `version`: `{version, seconds}`.
- `load_adapter` `{path, version}` (a server started with `--max_lora_rank`): the LoRA adapter in peft's format at
  `path` becomes the one every later request runs with, in place of the one before, over the unchanged base weights;
  the prefix cache is reset, and the server reports `version`: `{version, seconds}`.
- `shutdown`.

The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the server has no children to
orphan. It exits when the trainer does: the trainer holds the write end of a pipe whose read end
(`COATI_VLLM_LIFELINE_FD`) this server watches, and end of file means the trainer is gone, killed or not.
"""
import argparse
import collections
import hashlib
import os
import shutil
import sys
import threading
import time
import traceback
from multiprocessing.connection import Listener
from multiprocessing.reduction import recv_handle
from typing import Any, Dict, List, Tuple

AUTHKEY_ENV = "COATI_VLLM_AUTHKEY"
LIFELINE_ENV = "COATI_VLLM_LIFELINE_FD"


def parse_address(address: str) -> Any:
    """`@name` as an abstract Unix socket, `host:port` as a TCP address, anything else as a socket path."""
    if address.startswith("@"):
        return "\0" + address[1:]
    host, sep, port = address.rpartition(":")
    return (host, int(port)) if sep and port.isdigit() else address


def watch_lifeline(fd: int, cleanup: str) -> None:
    """Exit at once (removing the `cleanup` folder, the trainer's weight files) when the trainer's end of the
    lifeline pipe closes."""
    def wait() -> None:
        while os.read(fd, 1):
            pass
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
        os._exit(0)

    threading.Thread(target=wait, name="lifeline", daemon=True).start()


def build_llm(args: argparse.Namespace) -> Any:
    """The vLLM engine on `args.model`, in this process, taking token ids (no tokenizer is loaded)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    options = dict(model=args.model, dtype=args.dtype, seed=args.seed, skip_tokenizer_init=True,
                   enable_prefix_caching=True, gpu_memory_utilization=args.gpu_memory_utilization,
                   enforce_eager=args.enforce_eager)
    if args.max_model_len:
        options["max_model_len"] = args.max_model_len
    if args.max_lora_rank:
        options.update(enable_lora=True, max_lora_rank=served_lora_rank(args.max_lora_rank), max_loras=1)
    return LLM(**options)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The largest adapter ranks a vLLM engine may be started for (`max_lora_rank`)."""


def served_lora_rank(rank: int) -> int:
    """The smallest rank vLLM can be started for that serves adapters of rank `rank`."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"vLLM serves LoRA adapters of rank {VLLM_LORA_RANKS[-1]} at most, not {rank}")
    return fitting[0]


def sampling_params(spec: Dict[str, Any], seed: int) -> Any:
    """vLLM's sampling parameters for one completion from coati's `SamplingConfig` fields, its random draws from `seed`.
    A completion ends at one of `stop_token_ids` (kept, as the trainer's own engine keeps it) or after
    `max_new_tokens`; the model's end-of-sequence token counts only when it is listed, as in the trainer's engine."""
    from vllm import SamplingParams

    greedy = not spec["do_sample"] or spec["temperature"] <= 0
    cuts = GREEDY if greedy else {name: spec[name] for name in GREEDY}
    return SamplingParams(n=1, **cuts, repetition_penalty=spec["repetition_penalty"], max_tokens=spec["max_new_tokens"],
                          stop_token_ids=list(spec["stop_token_ids"]), ignore_eos=True, logprobs=0, detokenize=False,
                          seed=seed)


GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
"""vLLM's sampling settings for greedy decoding; sampled, the run's `SamplingConfig` gives them."""


class Seeds:
    """Each completion's sampling seed, from the server's seed, the weights' version, the prompt's tokens and the
    completion's place among that version's completions of the same prompt: a run's samples do not depend on how its
    requests were batched or on the engine's state, so a resumed run draws what an uninterrupted one drew."""

    def __init__(self, base: int) -> None:
        self.base, self.version, self.seen = base, 0, collections.Counter()

    def at(self, version: int) -> None:
        """New weights: completions are counted afresh."""
        self.version, self.seen = version, collections.Counter()

    def take(self, prompt: List[int], n: int) -> List[int]:
        """Seeds of the next `n` completions of `prompt`."""
        key = hashlib.blake2b(repr((self.base, self.version, list(prompt))).encode(), digest_size=8).digest()
        first = self.seen[key]
        self.seen[key] += n
        return [int.from_bytes(hashlib.blake2b(key + (first + k).to_bytes(8, "little"), digest_size=8).digest(),
                               "little") >> 1 for k in range(n)]


def generate(llm: Any, prompts: List[List[int]], counts: List[int], spec: Dict[str, Any],
             seeds: Seeds, adapter: Any = None) -> List[List[Tuple[List[int], List[float]]]]:
    """`counts[i]` completions of each prompt, each as (token ids, their log-probs); all in one engine call, so
    vLLM batches them (the copies of a prompt share its cached prefix); with `adapter` (a `LoRARequest`) on."""
    from vllm.inputs import TokensPrompt

    requests, params = [], []
    for prompt, n in zip(prompts, counts):
        requests += [TokensPrompt(prompt_token_ids=list(prompt)) for _ in range(n)]
        params += [sampling_params(spec, seed) for seed in seeds.take(prompt, n)]
    outputs = iter(llm.generate(requests, params, use_tqdm=False, lora_request=adapter))
    results = []
    for n in counts:
        group = []
        for _ in range(n):
            completion = next(outputs).outputs[0]
            logps = [entry[token].logprob for entry, token in zip(completion.logprobs, completion.token_ids)]
            group.append((list(completion.token_ids), logps))
        results.append(group)
    return results


_ATTACHED: Dict[str, Any] = {}
"""The trainer's weight memory, mapped by `attach_weights` (the engine's worker runs in this process and reads it)."""


def attach_weights(fd: int, size: int) -> None:
    """Map the trainer's weight memory (`size` bytes of the file `fd`), in place of any earlier one."""
    import mmap

    _ATTACHED.clear()   # an earlier mapping is unmapped once nothing refers to it
    _ATTACHED["memory"] = mmap.mmap(fd, size)
    os.close(fd)


def score(llm: Any, prompts: List[List[int]], adapter: Any = None) -> List[List[float]]:
    """Each prompt's log-probs of its tokens after the first, under the served weights (and `adapter`, a
    `LoRARequest`). An engine started with LoRA scores one prompt per call: with several, vLLM 0.32's CPU LoRA logits
    step fails on prompt log-probs (`einsum(): subscript b has size 2 ... does not broadcast`), its adapter indices
    being per request where the prompt's positions are per token."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    if llm.llm_engine.vllm_config.lora_config is None:
        outputs = llm.generate(requests, params, use_tqdm=False, lora_request=adapter)
    else:
        outputs = [llm.generate([r], params, use_tqdm=False, lora_request=adapter)[0] for r in requests]
    return [[entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], prompt[1:])]
            for out, prompt in zip(outputs, prompts)]


def _reload_attached(worker: Any, layout: List[Any], base: int) -> None:
    """In each vLLM worker: reload its model in place from the attached memory's tensors at byte `base` (checkpoint
    format; vLLM copies them into its parameters, repacking for its kernels as at start-up)."""
    import math

    import torch

    memory = torch.frombuffer(_ATTACHED["memory"], dtype=torch.uint8)

    def tensors():
        for name, dtype, shape, offset in layout:
            kind = getattr(torch, dtype)
            start = base + offset
            yield name, memory[start:start + math.prod(shape) * kind.itemsize].view(kind).view(shape)

    worker.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)


def load_weights(llm: Any, layout: List[Any], base: int) -> None:
    """Load the tensors of `layout` at byte `base` of the attached memory (HF parameter names) into the running model,
    then drop the prefix cache, whose keys and values the old weights computed."""
    llm.collective_rpc(_reload_attached, args=(layout, base))
    llm.reset_prefix_cache()


def load_adapter(llm: Any, path: str, version: int) -> Any:
    """Load the peft-format adapter at `path` as version `version`'s, drop the prefix cache, and return its
    `LoRARequest`. Each version has its own adapter id, so nothing cached for another version's adapter is reused."""
    from vllm.lora.request import LoRARequest

    adapter = LoRARequest(f"policy-v{version}", version + 1, path)
    if not llm.llm_engine.add_lora(adapter):
        raise RuntimeError(f"vLLM did not load the adapter at {path}")
    llm.reset_prefix_cache()
    return adapter


class Server:
    """Answers one trainer connection at a time; a connection that closes lets the next one in."""

    def __init__(self, llm: Any, model: str, seed: int) -> None:
        self.llm, self.model, self.version, self.seeds = llm, model, 0, Seeds(seed)
        self.adapter: Any = None   # the `LoRARequest` every request runs with, once one is loaded

    def handle(self, request: Dict[str, Any]) -> Dict[str, Any]:
        op = request.get("op")
        start = time.perf_counter()
        if op == "info":
            return {"version": self.version, "pid": os.getpid(), "model": self.model}
        if op == "generate":
            completions = generate(self.llm, request["prompts"], request["n"], request["sampling"], self.seeds,
                                   self.adapter)
            return {"completions": completions, "version": self.version, "seconds": time.perf_counter() - start}
        if op == "score":
            return {"logprobs": score(self.llm, request["prompts"], self.adapter), "version": self.version}
        if op == "attach_weights":
            attach_weights(request["fd"], int(request["size"]))
            return {"size": int(request["size"])}
        if op == "load_weights":   # the whole policy: an adapter loaded before no longer applies
            load_weights(self.llm, request["layout"], int(request["base"]))
            self._drop_adapter()
            return self._serving(int(request["version"]), "weights", start)
        if op == "load_adapter":   # in place of the adapter before
            self._drop_adapter()
            self.adapter = load_adapter(self.llm, request["path"], int(request["version"]))
            return self._serving(int(request["version"]), "adapter", start)
        return {"error": f"unknown op {op!r}"}

    def _drop_adapter(self) -> None:
        if self.adapter is not None:
            self.llm.llm_engine.remove_lora(self.adapter.lora_int_id)
            self.adapter = None

    def _serving(self, version: int, what: str, start: float) -> Dict[str, Any]:
        """From now on the server reports `version`, whose sampling seeds start afresh."""
        self.version = version
        self.seeds.at(version)
        print(f"serving {what} version {version} (loaded in {time.perf_counter() - start:.2f} s)", flush=True)
        return {"version": version, "seconds": time.perf_counter() - start}

    def serve(self, listener: Listener) -> None:
        while True:
            with listener.accept() as conn:
                while True:
                    try:
                        request = conn.recv()
                    except EOFError:
                        break
                    if request.get("op") == "shutdown":
                        conn.send({})
                        return
                    if request.get("op") == "attach_weights":   # the descriptor follows the request
                        request["fd"] = recv_handle(conn)
                    conn.send(self._answer(request))

    def _answer(self, request: Dict[str, Any]) -> Dict[str, Any]:
        try:
            return self.handle(request)
        except Exception as error:   # the trainer gets the line; the traceback stays in this server's log
            traceback.print_exc()
            first = (str(error).strip().splitlines() or [""])[0]
            return {"error": f"{type(error).__name__}: {first}"}


def parse_args(argv: Any = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model directory")
    parser.add_argument("--address", required=True, help="@name (an abstract Unix socket), a socket path, or host:port")
    parser.add_argument("--dtype", default="float32", help="the model's dtype in the engine (match the trainer's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_model_len", type=int, default=0, help="0: the model's own")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.4,
                        help="fraction of the GPU's memory for the engine (on CPU: of the machine's)")
    parser.add_argument("--enforce_eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--max_lora_rank", type=int, default=0,
                        help="serve LoRA adapters (`load_adapter`) of up to this rank (0: none)")
    parser.add_argument("--cleanup", default="", help="folder to remove when the trainer dies (its weight files)")
    return parser.parse_args(argv)


def main(argv: Any = None) -> None:
    args = parse_args(argv)
    lifeline = os.environ.get(LIFELINE_ENV)
    if lifeline:
        watch_lifeline(int(lifeline), args.cleanup)
    authkey = os.environ.pop(AUTHKEY_ENV, "").encode()
    if not authkey:
        sys.exit(f"error: set {AUTHKEY_ENV} to the key clients authenticate with")
    start = time.perf_counter()
    llm = build_llm(args)
    with Listener(parse_address(args.address), authkey=authkey) as listener:
        print(f"ready: {args.model} loaded in {time.perf_counter() - start:.1f} s, pid {os.getpid()}", flush=True)
        Server(llm, args.model, args.seed).serve(listener)


if __name__ == "__main__":
    main()
