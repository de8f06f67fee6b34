"""Agents you already have, as rollouts: an OpenAI-compatible chat-completions endpoint in front of the rollout
pool, local to the run, that records the exact token ids of every request and answer by episode.

An agent is a plain function `agent(base_url, row) -> final answer text (or None)`, written against any client that
takes a `base_url` (the `openai` package's `OpenAI(base_url=..., api_key=...)`, for one); `row` is the prompt row
(its `messages` and the other fields). For each sample the workflow opens an episode on the endpoint, whose
`base_url` (`http://127.0.0.1:PORT/<episode id>/v1`, loopback only, the unguessable id its capability) the agent
calls; the agent runs in a thread of its own.

Each request is answered token-in, token-out: the first renders its messages with the chat template; a later one that
extends the earlier conversation (the earlier messages, the answer the endpoint gave, then new messages such as tool
results) appends only what the template adds after that answer (`ChatTokens.after_turn`), so the trained sequence is
the engine's sampled ids verbatim, and the loss mask covers only them. A request that does not extend the
conversation (an agent that rewrites or trims its history) starts the episode's sequence anew from its rendering, and
the earlier branch is not trained on (counted as `rollout/agent/restarts`). The tool calls the run's parser
(`--tool_parser`) finds in the model's answer come back as OpenAI `tool_calls`. The episode is scored like any rollout
on the agent's final answer (else the last answer the endpoint gave).
"""
import asyncio
import dataclasses
import functools
import json
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple

from coati.config import SamplingConfig
from coati.experience.scorer import Scorer
from coati.utils.http_json import JsonHandler

from .chat import ChatTokens
from .pool import RolloutPool
from .environment import Message
from .multiturn import Episode, assemble, conversation
from .tool_calls import ParsedTurn, hermes
from .workflow import RolloutWorkflow, Trajectory

Agent = Callable[[str, Dict[str, Any]], Optional[str]]
AGENT_ENDINGS = ("answer", "truncated", "agent_error", "agent_timeout")
"""How an agent's episode ends: it returned, its last answer was cut at `max_new_tokens`, it raised, or it ran past
`agent_timeout`."""


class EndpointError(Exception):
    """A request the endpoint refuses, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class RecordedEpisode:
    """One agent episode's conversation as the endpoint answers it: the first request's prompt ids, then each answer's
    sampled ids and what the template adds between answers, with the engine's log-probs of the sampled ones.

    Requests of an episode are answered one at a time; each works on a copy and publishes it at the end in one
    assignment (`recorded`), so `finish` can take a consistent record while an overdue agent's request is still out."""

    def __init__(self, chat: ChatTokens, pool: RolloutPool, loop: asyncio.AbstractEventLoop,
                 sampling: SamplingConfig, parser: Callable[[str], ParsedTurn] = hermes) -> None:
        self.chat, self.pool, self.loop, self.sampling, self.parser = chat, pool, loop, sampling, parser
        self.id = uuid.uuid4().hex
        self.recorded: Tuple[List[int], Episode] = (   # the prompt, the rest
            [], Episode(counts={"agent/restarts": 0.0}, runs_tools=False))
        self.history: List[Message] = []       # the conversation the next request must extend
        self.asked: List[Message] = []         # the last request's messages, as the agent sent them
        self.last_stop: Optional[int] = None   # the stop token of the last answer (None: it was cut)
        self.version: Optional[int] = None
        self.closed = False
        self.engine_error: Optional[Exception] = None
        self.lock = threading.Lock()

    def answer(self, body: Dict[str, Any]) -> Dict[str, Any]:
        """The chat completion for `body` (an OpenAI chat-completions request), recorded."""
        messages, tools = body.get("messages"), body.get("tools")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise EndpointError(400, "`messages` must be a non-empty list of messages")
        if body.get("n", 1) != 1:
            raise EndpointError(400, "n must be 1: each request is one turn of this episode")
        with self.lock:
            if self.closed:
                raise EndpointError(410, "this episode has ended (its agent returned or ran past its timeout)")
            prompt, episode = self._extend(messages, tools)
            ids = prompt + episode.ids
            future = asyncio.run_coroutine_threadsafe(self.pool.agenerate(ids, self._sampling(body), 1, self.id),
                                                      self.loop)
            try:
                out = future.result()
            except Exception as error:   # the engine's failure is the run's, not the agent's: kept to raise
                self.engine_error = error
                raise
            turn, logprobs, versions = out.rows[0]
            text = self._record(episode, turn, logprobs, versions)
            parsed = self.parser(text)
            episode.counts["tool_calls"] = episode.counts.get("tool_calls", 0.0) + len(parsed.calls)
            self.version = out.version if self.version is None else min(self.version, out.version)
            self.recorded = (prompt, episode)
            return completion_body(text, parsed, self.last_stop is not None, len(ids), len(turn))

    def _extend(self, messages: List[Message], tools: Any) -> Tuple[List[int], Episode]:
        """The prompt and a copy of the episode extended by this request's new messages, or the request rendered
        anew where it does not extend the recorded conversation."""
        prompt, recorded = self.recorded
        episode = dataclasses.replace(recorded, ids=list(recorded.ids), sampled=list(recorded.sampled),
                                      logprobs=None if recorded.logprobs is None else list(recorded.logprobs),
                                      versions=list(recorded.versions), turn_starts=list(recorded.turn_starts),
                                      messages=list(recorded.messages), counts=dict(recorded.counts))
        asked = len(self.asked)
        extends = (self.last_stop is not None and len(messages) > asked + 1 and messages[:asked] == self.asked
                   and messages[asked].get("role") == "assistant")
        if extends:
            new = messages[asked + 1:]
            episode.add(self.chat.after_turn(self.history, self.last_stop, new, tools), False)
            self.history = self.history + [episode.messages[-1]] + new
            episode.messages += new
        else:
            if self.asked:
                episode.counts["agent/restarts"] = episode.counts.get("agent/restarts", 0.0) + 1
            prompt, self.history = self.chat.prompt_ids(messages, tools), list(messages)
            episode = Episode(counts=episode.counts, runs_tools=False)
        self.asked = [dict(m) for m in messages]
        return prompt, episode

    def _sampling(self, body: Dict[str, Any]) -> SamplingConfig:
        """The run's sampling, with the request's `max_tokens` (or `max_completion_tokens`) where it is lower."""
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or self.sampling.max_new_tokens
        return dataclasses.replace(self.sampling, max_new_tokens=max(1, min(int(limit), self.sampling.max_new_tokens)))

    def _record(self, episode: Episode, turn: List[int], logprobs: Optional[List[float]], versions: List[int]) -> str:
        """Add the answer's sampled ids to `episode`; returns its text (the stop token left out)."""
        episode.add(turn, True, logprobs, versions)
        stopped = bool(turn) and turn[-1] in self.chat.stop_ids
        self.last_stop = turn[-1] if stopped else None
        text = self.chat.tokenizer.decode(turn[:-1] if stopped else turn, skip_special_tokens=False)
        episode.messages.append({"role": "assistant", "content": text})
        episode.final_text = self.chat.tokenizer.decode(turn, skip_special_tokens=True)
        episode.ended = "answer" if stopped else "truncated"
        return text

    def finish(self, ended: Optional[str] = None, final: Optional[str] = None) -> Tuple[List[int], Episode]:
        """Close the episode (later requests get 410) and return its record: how it `ended` where the agent did not
        simply return, and the agent's `final` answer where it gave one."""
        self.closed = True
        prompt, episode = self.recorded
        changes = {k: v for k, v in (("ended", ended), ("final_text", final)) if v is not None}
        return prompt, dataclasses.replace(episode, **changes)


def completion_body(text: str, parsed: ParsedTurn, stopped: bool, prompt_tokens: int,
                    completion_tokens: int) -> Dict[str, Any]:
    """An OpenAI `chat.completion` for one answer `text`: its `parsed` tool calls as `tool_calls` (each with an id of
    its own), the rest (the parser's prose, else the whole text) as `content`."""
    calls = parsed.calls
    content = parsed.prose if calls and parsed.prose is not None else text
    message: Dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:16]}", "type": "function",
                                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
    finish = "tool_calls" if calls else ("stop" if stopped else "length")
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": "policy", "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class AgentEndpoint:
    """The OpenAI-compatible server: `POST /<episode>/v1/chat/completions` answers for an open episode, and
    `GET /<episode>/v1/models` names the one model ("policy"). Bound to 127.0.0.1 on a free port."""

    def __init__(self) -> None:
        self.episodes: Dict[str, RecordedEpisode] = {}
        endpoint = self

        class Handler(JsonHandler):
            def do_POST(self) -> None:
                endpoint.handle(self, "POST")

            def do_GET(self) -> None:
                endpoint.handle(self, "GET")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="agent-endpoint", daemon=True).start()

    def base_url(self, episode: RecordedEpisode) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{episode.id}/v1"

    def open(self, episode: RecordedEpisode) -> str:
        self.episodes[episode.id] = episode
        return self.base_url(episode)

    def close(self, episode: RecordedEpisode) -> None:
        self.episodes.pop(episode.id, None)

    def handle(self, request: JsonHandler, method: str) -> None:
        parts = request.path.strip("/").split("/")
        try:
            episode = self.episodes.get(parts[0]) if len(parts) >= 3 and parts[1] == "v1" else None
            route = "/".join(parts[2:])
            if episode is None:
                raise EndpointError(404, f"no open episode at {request.path}")
            if method == "GET" and route == "models":
                body = {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "coati"}]}
            elif method == "POST" and route == "chat/completions":
                length = int(request.headers.get("Content-Length") or 0)
                body = episode.answer(json.loads(request.rfile.read(length) or b"{}"))
            else:
                raise EndpointError(404, f"{method} {route} is not served (chat/completions and models are)")
            status = 200
        except EndpointError as error:
            status, body = error.status, {"error": {"message": str(error), "type": "invalid_request_error"}}
        except json.JSONDecodeError as error:
            status, body = 400, {"error": {"message": f"the request is not JSON: {error}", "type": "invalid_request_error"}}
        except Exception as error:   # the agent gets the line; the run goes on
            status, body = 500, {"error": {"message": f"{type(error).__name__}: {error}", "type": "server_error"}}
        request.answer(status, body)

class AgentWorkflow(RolloutWorkflow):
    """`num_generations` episodes of `agent` per prompt row, each against its own episode on the endpoint (started on
    first use), run at once in threads; an agent that raises or runs past `timeout` seconds ends its episode (counted)
    instead of the run, while an engine that fails a request fails the rollout. Scored by `scorer` on the agent's final
    answer. Agents take no seat in the pool (`RolloutPool.take_seat`): one that works long, or hangs until its timeout,
    between requests would hold every other episode's turn; so their runs are not bit-reproducible."""

    def __init__(self, scorer: Scorer, chat: ChatTokens, agent: Agent, sampling: SamplingConfig, num_generations: int,
                 timeout: float = 300.0, parser: Callable[[str], ParsedTurn] = hermes) -> None:
        self.scorer, self.chat, self.agent, self.parser = scorer, chat, agent, parser
        self.sampling, self.num_generations, self.timeout = sampling, num_generations, timeout
        self._endpoint: Optional[AgentEndpoint] = None

    def endpoint(self) -> AgentEndpoint:
        if self._endpoint is None:
            self._endpoint = AgentEndpoint()
        return self._endpoint

    async def arun_episode(self, pool: RolloutPool, sample: Dict[str, Any]) -> Optional[Trajectory]:
        loop = asyncio.get_running_loop()
        row = {**{k: v for k, v in sample.items() if k != "input_ids"}, "messages": conversation(sample)}
        recorded = [RecordedEpisode(self.chat, pool, loop, self.sampling, self.parser)
                    for _ in range(self.num_generations)]
        finished = await asyncio.gather(*(self._play(loop, episode, row) for episode in recorded))
        failed = next((e.engine_error for e in recorded if e.engine_error is not None), None)
        if failed is not None:   # a dead engine ends the run as it does without agents
            raise failed
        if not all(prompt for prompt, _ in finished):   # an agent that never asked: nothing of its episode to train on
            return None
        version = min(e.version for e in recorded)
        return await assemble(self.scorer, sample, row["messages"], [prompt for prompt, _ in finished],
                              [e for _, e in finished], version, AGENT_ENDINGS)

    async def _play(self, loop: asyncio.AbstractEventLoop, episode: RecordedEpisode,
                    row: Dict[str, Any]) -> Tuple[List[int], Episode]:
        endpoint = self.endpoint()
        base_url = endpoint.open(episode)
        try:
            final = await asyncio.wait_for(in_thread(loop, self.agent, base_url, row), self.timeout)
            return episode.finish(final=final if isinstance(final, str) else None)
        except asyncio.TimeoutError:
            return episode.finish(ended="agent_timeout")
        except Exception:   # the agent's own failure ends its episode, not the run
            return episode.finish(ended="agent_error")
        finally:
            endpoint.close(episode)


def in_thread(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
    """`fn(*args)` in a daemon thread of its own, as a future of `loop`: an agent that never returns can neither block
    the run's exit nor take a pool's place."""
    future = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():   # a timed-out episode's future is cancelled already
            outcome()

    def run() -> None:
        try:
            result = fn(*args)
            outcome = functools.partial(future.set_result, result)
        except BaseException as error:   # the agent's own failure, delivered to its episode
            outcome = functools.partial(future.set_exception, error)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:   # the loop has closed: nobody waits for this episode any more
            pass

    threading.Thread(target=run, name="agent", daemon=True).start()
    return future
