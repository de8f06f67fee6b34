"""A reward computed elsewhere: a reward model (or any scorer) served over HTTP, picked with
`--reward_fn http://host:port/path`.

Request (one POST per call, JSON): `query` (each full sequence as text: prompt and completion with the chat
template's special tokens, padding left out, as in OpenRLHF's remote reward model), `prompts` and `completions` (as
the other reward functions get them), `labels` (the rows' `gt_answer`, or nulls), `fields` (every other column of
the prompt rows, by name) and, when known, `input_ids` (each full sequence's token ids, so a server with the same
tokenizer scores exactly what the policy generated, with no re-tokenisation). Response: `{"rewards": [...]}` (or
`"scores"`), one number per completion, and optionally `"diagnostics": {name: [...]}`, logged but not added.

A server that requires a bearer token (examples/reward_server.py `--token`) is sent the one in `COATI_REWARD_TOKEN`
(`Authorization: Bearer ...`), kept out of flags so that it appears in no command line, log or saved config.
"""
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from coati.config import DEFAULT_SERVER_RETRIES as DEFAULT_RETRIES, DEFAULT_SERVER_TIMEOUT_S as DEFAULT_TIMEOUT_S
from coati.utils.errors import CoatiUsageError

from .output import RewardOutput


@dataclass(frozen=True)
class Sequences:
    """The full sequences (prompt and completion) the rewards are for: as text with special tokens, and as ids."""

    texts: List[str]
    token_ids: List[List[int]]


class RemoteRewardError(CoatiUsageError):
    """The reward server could not be reached or answered wrongly, after the retries; the message says which, and
    `status` holds the HTTP status of a refusal (else None)."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


TOKEN_ENV = "COATI_REWARD_TOKEN"
"""The environment variable holding the reward server's bearer token, on both sides."""


def is_url(name: str) -> bool:
    return name.startswith(("http://", "https://"))


def token_from_env(names: Sequence[str]) -> Optional[str]:
    """The bearer token in the first of the environment variables `names` that is set, or None."""
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


@dataclass(frozen=True)
class RemoteReward:
    """Scores from the server at `url` (schema above), with `token` (default: `COATI_REWARD_TOKEN`) as a bearer token
    where set. A request that fails to connect, times out after `timeout_s` or gets a 5xx/429 answer is retried
    `retries` times, waiting `backoff_s`, then twice as long each time; a 4xx answer or a malformed response is not
    retried."""

    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    backoff_s: float = 1.0
    token: Optional[str] = field(default_factory=lambda: os.environ.get(TOKEN_ENV) or None, repr=False)
    takes_sequences = True
    """`WeightedReward` passes it the full `sequences` as well."""

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], sequences: Optional[Sequences] = None,
                 **fields: Sequence[Any]) -> RewardOutput:
        body: Dict[str, Any] = {
            "query": sequences.texts if sequences else [p + c for p, c in zip(prompts, completions)],
            "prompts": list(prompts), "completions": list(completions),
            "labels": list(fields.get("gt_answer", [None] * len(completions))), "fields": fields}
        if sequences:
            body["input_ids"] = sequences.token_ids
        answer = self._post(json.dumps(body, default=str).encode())
        rewards = answer.get("rewards", answer.get("scores")) if isinstance(answer, dict) else None
        if not isinstance(rewards, list):
            raise RemoteRewardError(f"reward server {self.url} answered without a list 'rewards': {str(answer)[:200]}")
        return RewardOutput(rewards, answer.get("diagnostics") or {})

    def _post(self, data: bytes) -> Any:
        return request_json(self.url, data, f"reward server {self.url}", self.token, TOKEN_ENV, self.timeout_s,
                            self.retries, self.backoff_s,
                            "is it running? Start one with examples/reward_server.py, or check the URL")


def request_json(url: str, data: Optional[bytes], who: str, token: Optional[str], token_env: str, timeout_s: float,
                 retries: int, backoff_s: float, hint: str) -> Any:
    """POST `data` (JSON; GET where it is None) to `url` with `token` as a bearer token where set, and return the
    decoded answer. A request that fails to connect, times out after `timeout_s` or gets a 5xx/429 answer is retried
    `retries` times, waiting `backoff_s`, then twice as long each time; a 4xx answer or a non-JSON one is not
    retried. Failures raise `RemoteRewardError` in one line naming `who`; a 401 names `token_env`, and a server that
    never answered, `hint`."""
    problem, started = "", time.monotonic()
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            problem = f"HTTP {error.code}: {error.read()[:200].decode(errors='replace')}"
            if error.code == 401:
                raise RemoteRewardError(f"{who} refused the request ({problem}); it requires its token: set "
                                        f"{token_env} to it") from None
            if error.code < 500 and error.code != 429:
                raise RemoteRewardError(f"{who} refused the request ({problem})", error.code) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            problem = _describe(getattr(error, "reason", error), timeout_s)
        except json.JSONDecodeError as error:
            raise RemoteRewardError(f"{who} answered with something other than JSON: {error}") from None
    tries = f"{retries + 1} attempts" if retries else "1 attempt"
    raise RemoteRewardError(f"{who} did not answer after {tries} in {time.monotonic() - started:.0f} s "
                            f"({problem}); {hint}")


def _describe(reason: object, timeout_s: float) -> str:
    """Why a request failed, in a few words (`Connection refused`, `timed out after 5 s`)."""
    if isinstance(reason, TimeoutError):
        return f"timed out after {timeout_s:g} s"
    return (reason.strerror if isinstance(reason, OSError) and reason.strerror else None) or str(reason)
