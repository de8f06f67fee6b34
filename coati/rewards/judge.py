"""An LLM as the reward (`--reward_fn judge`): each prompt, completion and reference goes to a judge model behind an
OpenAI-compatible endpoint, filled into a rubric, and a score or a verdict is parsed from its answer.

- **Endpoint.** `--judge_url` (the API's base, e.g. `http://127.0.0.1:8000/v1`: `vllm serve`, or any
  OpenAI-compatible service; the token in `COATI_JUDGE_TOKEN`, else `OPENAI_API_KEY`, is sent as a bearer token), or
  `--judge_model DIR`: coati serves that model itself on loopback, with a token of its own
  (`coati.inference.judge_server`).
- **Rubric.** A template file whose `{prompt}`, `{completion}` and `{reference}` (the row's `gt_answer`, or
  `(none)`) are filled in (`DEFAULT_RUBRIC` without one).
- **API.** `chat`: one `/chat/completions` request per completion (the judge's chat template applies); `completions`:
  `--judge_batch_size` rubrics per `/completions` request (batched by the server; the rubric is sent as it is).
  At most `--judge_concurrency` requests are in flight at once; each may take `--judge_timeout` seconds and is
  retried `--judge_retries` times (backoff 1 s, doubling) on a refused connection, a timeout, a 429 or a 5xx.
- **Cache.** An identical rubric is asked once per run (the last `--judge_cache` answers are kept; greedy decoding
  makes the answer a function of the request).
- **Parsing.** `score`: the last `Score: N` (or `N/M`, or an answer that is a lone number), divided by
  `--judge_max_score` (by M where given), clipped to [0, 1]. `verdict`: the first word of a `Verdict:` line, else the
  last of correct/incorrect, yes/no, pass/fail, right/wrong: 1 or 0. An answer that does not parse leaves its row
  unscored by the judge (None: left out of the sum) and `rewards/judge/parsed` logs the share that parsed; a call none
  of whose answers parse stops the run with one line quoting one, since a run would then learn from nothing.
- **Sample tables.** The judge's raw answers are the column `judge/answer`.
"""
import json
import re
import string
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from coati.utils.errors import CoatiUsageError

from .output import RewardOutput
from .remote import request_json, token_from_env

JUDGE_TOKEN_ENVS = ("COATI_JUDGE_TOKEN", "OPENAI_API_KEY")
"""Where a `--judge_url` judge's bearer token is read from, first set first; never a flag, so no command line, log or
saved config shows it."""
RUBRIC_FIELDS = ("prompt", "completion", "reference")
NO_REFERENCE = "(none)"
DEFAULT_RUBRIC = """You are grading a response to a task.

Task:
{prompt}

Reference answer (may be "(none)"):
{reference}

Response:
{completion}

Rate how well the response solves the task, from 0 (wrong or no answer) to 10 (correct and complete).
End with one line "Score: N"."""


class JudgeError(CoatiUsageError):
    """The judge's rubric is unusable, or its answers cannot be parsed; the message says which."""


_SCORE = re.compile(r"score\W{0,4}?(?:is|of)?\s*(-?\d+(?:\.\d+)?)(?:\s*(?:/|out of)\s*(\d+(?:\.\d+)?))?", re.I)
_LONE_NUMBER = re.compile(r"^\W{0,3}?(-?\d+(?:\.\d+)?)(?:\s*(?:/|out of)\s*(\d+(?:\.\d+)?))?\W{0,3}$")
_VERDICT_LINE = re.compile(r"verdict\W{0,3}(.*)", re.I)
_VERDICT_WORD = re.compile(r"\b(correct|incorrect|yes|no|pass|fail|right|wrong)\b", re.I)
_POSITIVE = {"correct", "yes", "pass", "right"}


def parse_score(answer: str, max_score: float) -> Optional[float]:
    """The last `Score: N` (`N/M`) of `answer`, or the lone number it is, as N / max_score (N / M), clipped to [0, 1];
    None when there is none."""
    matches = _SCORE.findall(answer) or _LONE_NUMBER.findall(answer.strip())
    if not matches:
        return None
    value, out_of = matches[-1]
    scale = float(out_of) if out_of and float(out_of) > 0 else max_score
    return min(max(float(value) / scale, 0.0), 1.0)


def parse_verdict(answer: str, max_score: float = 1.0) -> Optional[float]:
    """1 or 0: the first verdict word of a `Verdict:` line, else the last one in `answer`; None when there is none."""
    line = _VERDICT_LINE.search(answer)
    words = _VERDICT_WORD.findall(line.group(1)) if line else []
    if words:
        return float(words[0].lower() in _POSITIVE)
    words = _VERDICT_WORD.findall(answer)
    return float(words[-1].lower() in _POSITIVE) if words else None


PARSERS: Dict[str, Callable[[str, float], Optional[float]]] = {"score": parse_score, "verdict": parse_verdict}
"""How a judge's answer becomes a reward in [0, 1], by the name `--judge_parser` takes."""


def check_rubric(template: str, source: str = "the rubric") -> str:
    """`template`, or a `JudgeError` naming `source` when it has a field other than {prompt}, {completion},
    {reference}, lacks {completion}, or is not a valid format string."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise JudgeError(f"{source} is not a valid template ({error}); write literal braces as {{{{ and }}}}") from None
    unknown = sorted(names - set(RUBRIC_FIELDS))
    if unknown:
        raise JudgeError(f"{source} has the unknown field(s) {', '.join('{' + n + '}' for n in unknown)}; it may use "
                         f"{', '.join('{' + n + '}' for n in RUBRIC_FIELDS)}")
    if "completion" not in names:
        raise JudgeError(f"{source} never shows the judge the completion: add {{completion}}")
    return template


def judge_token() -> Optional[str]:
    """The bearer token for a `--judge_url` judge (`JUDGE_TOKEN_ENVS`), or None."""
    return token_from_env(JUDGE_TOKEN_ENVS)


FROM_SETTINGS = {"model": "judge_model_name", "parser": "judge_parser", "max_score": "judge_max_score",
                 "api": "judge_api", "batch_size": "judge_batch_size", "concurrency": "judge_concurrency",
                 "max_tokens": "judge_max_tokens", "timeout_s": "judge_timeout", "retries": "judge_retries",
                 "cache_size": "judge_cache"}
"""`LLMJudge`'s fields -> the `JudgeSettings` setting each comes from."""


@dataclass
class LLMJudge:
    """The judge reward (see the module's notes); `url` is the API's base, `model` the name requests carry."""

    url: str
    model: str = "judge"
    rubric: str = DEFAULT_RUBRIC
    parser: str = "score"
    max_score: float = 10.0
    api: str = "chat"
    batch_size: int = 8
    concurrency: int = 4
    max_tokens: int = 64
    timeout_s: float = 60.0
    retries: int = 3
    backoff_s: float = 1.0
    cache_size: int = 10000
    token: Optional[str] = field(default_factory=judge_token, repr=False)
    _cache: "OrderedDict[str, str]" = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_settings(cls, settings: Any, url: str, rubric: str, token: Optional[str]) -> "LLMJudge":
        """The judge its settings section (`coati.config.JudgeSettings`) describes, asking `url` with `token`."""
        return cls(url, rubric=rubric, token=token, **{name: getattr(settings, setting)
                                                       for name, setting in FROM_SETTINGS.items()})

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        check_rubric(self.rubric)
        if self.parser not in PARSERS:
            raise JudgeError(f"judge parser {self.parser!r}: expected one of {', '.join(PARSERS)}")
        if self.api not in ("chat", "completions"):
            raise JudgeError(f"judge api {self.api!r}: expected chat or completions")

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], gt_answer: Optional[Sequence[Any]] = None,
                 **_: Any) -> RewardOutput:
        references = [NO_REFERENCE if r is None or r == "" else str(r) for r in (gt_answer or [None] * len(completions))]
        rubrics = [self.rubric.format(prompt=p, completion=c, reference=r)
                   for p, c, r in zip(prompts, completions, references)]
        answers, cached = self.answers(rubrics)
        parse = PARSERS[self.parser]
        values = [parse(a, self.max_score) for a in answers]
        if values and all(v is None for v in values):
            raise JudgeError(f"judge {self.url}: none of the {len(values)} answers could be parsed as a "
                             f"{self.parser} (--judge_parser); the first was {answers[0][:200]!r}. Make the rubric "
                             "(--judge_rubric) ask for the format the parser reads")
        diagnostics = {"parsed": [float(v is not None) for v in values], "cached": [float(c) for c in cached]}
        return RewardOutput(values, diagnostics, {"answer": answers})

    def answers(self, rubrics: Sequence[str]) -> Tuple[List[str], List[bool]]:
        """The judge's answer to each rubric (asking each distinct uncached one once), and whether it was cached."""
        with self._lock:
            known = {r: self._cache[r] for r in rubrics if r in self._cache}
        asked = list(dict.fromkeys(r for r in rubrics if r not in known))
        groups = [asked[i:i + self.batch_size] for i in range(0, len(asked), self.batch_size)] \
            if self.api == "completions" else [[r] for r in asked]
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(groups)))) as pool:
            for group, texts in zip(groups, pool.map(self._request, groups)):
                known.update(zip(group, texts))
        with self._lock:
            for rubric in asked:
                self._cache[rubric] = known[rubric]
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return [known[r] for r in rubrics], [r not in asked for r in rubrics]

    def _request(self, rubrics: List[str]) -> List[str]:
        """The answers to `rubrics` from one request (chat: one rubric; completions: a batch), greedy."""
        body: Dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": rubrics[0]}]
        else:
            body["prompt"] = rubrics
        endpoint = f"{self.url}/{'chat/completions' if self.api == 'chat' else 'completions'}"
        answer = request_json(endpoint, json.dumps(body).encode(), f"judge {self.url}", self.token,
                              " or ".join(JUDGE_TOKEN_ENVS), self.timeout_s, self.retries, self.backoff_s,
                              "is the judge running? Check --judge_url, or serve one with --judge_model")
        return _choices(answer, len(rubrics), self.api, self.url)


def _choices(answer: Any, count: int, api: str, url: str) -> List[str]:
    """The `count` texts of an OpenAI-style answer, by `index`; a `JudgeError` when the answer is not one."""
    try:
        choices = sorted(answer["choices"], key=lambda c: c.get("index", 0))
        texts = [(c["message"].get("content") or "") if api == "chat" else c["text"] for c in choices]
    except (KeyError, TypeError, AttributeError):
        raise JudgeError(f"judge {url} answered without OpenAI-style choices: {str(answer)[:200]}") from None
    if len(texts) != count or not all(isinstance(t, str) for t in texts):
        raise JudgeError(f"judge {url} answered {len(texts)} choices for {count} prompts")
    return texts
