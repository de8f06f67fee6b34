"""Multi-turn, tool-using rollouts: the tools, the tool-call parser, the environment, and token-in token-out
sequences checked against chat templates' renderings of whole conversations (Qwen2.5's, Llama 3.1's, coati's own)."""
import asyncio
import json
import time

import pytest
import torch

from coati.config import SamplingConfig
from coati.rollout.generators import BatchingPool
from coati.models.tiny import train_tokenizer
from coati.rewards import WeightedReward
from coati.experience.scorer import Scorer
from coati.rollout.chat import ChatTokens, check_appending, probe_conversation, turn_by_turn
from coati.rollout.pool import Completions, RolloutPool
from coati.rollout.environment import EnvStep, Environment
from coati.rollout.multiturn import MultiTurnWorkflow
from coati.rollout.tool_calls import hermes
from coati.rollout.tools import (ToolEnvironment, ToolRunner, calculator, configure_python_tool, python, resolve_tools,
                                 tool_from_function, tool_schemas)
from coati.rewards.sandbox import SandboxLimits
from coati.utils.errors import CoatiUsageError
from conftest import AGENTS, HISTORY_REWRITING, REPO

TEMPLATES = REPO / "tests" / "data" / "chat_templates"
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def tokenizer():
    corpus = ["What is 12 * 34? The answer is 408.", '<tool_call> {"name": "calculator", "arguments": '
              '{"expression": "12 * 34"}} </tool_call>', "system user assistant tool ipython Today Date"] * 20
    made = train_tokenizer(corpus, vocab_size=400)
    made.add_special_tokens({"additional_special_tokens": LLAMA_SPECIALS})
    return made


def _chat(tokenizer, template: str, tools=("calculator",)):
    tokenizer.chat_template = template
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|eot_id|>")]
    return ChatTokens(tokenizer, stops, tool_schemas(resolve_tools(list(tools))), "the template")


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text()


# ---- tools ------------------------------------------------------------------------------------------
def test_the_calculator_is_exact_and_evaluates_nothing_but_arithmetic():
    assert calculator("123456789 * 987654321") == "121932631112635269"
    assert calculator("2 ** 100") == str(2 ** 100)
    assert calculator("(7 - 2) * 3 // 4 % 3") == "0"
    assert calculator("7 / 3") == "7/3 (= 2.33333333333)"
    assert calculator("0.1 + 0.2") == "3/10 (= 0.3)"
    for bad, why in [("__import__('os').system('id')", "unsupported expression"), ("1 / 0", "division by zero"),
                     ("9 ** 9 ** 9", "more than 4000 digits"), ("2 ** 0.5", "whole exponents"), ("12 *", "not an arithmetic")]:
        with pytest.raises(ValueError, match=why):
            calculator(bad)


def test_the_python_tool_runs_in_the_sandbox_within_its_limits(monkeypatch):
    from coati.rollout import tools

    monkeypatch.setattr(tools, "_SANDBOX", {})   # these limits for this test only
    configure_python_tool(SandboxLimits(cpu_s=1.0, wall_s=2.0), "auto")
    assert python("print(sum(range(101)))") == "5050"
    assert "stopped by the" in python("while True: pass")
    assert "ZeroDivisionError" in python("1 / 0")


def test_a_tool_schema_comes_from_the_signature_and_docstring():
    def lookup(word: str, limit: int = 3) -> str:
        """Look a word up.

        Args:
            word: the word
            limit: at most this many senses
        """
        return word

    schema = tool_from_function(lookup).schema["function"]
    assert schema["name"] == "lookup" and schema["parameters"]["required"] == ["word"]
    assert schema["parameters"]["properties"]["limit"] == {"type": "integer", "description": "at most this many senses"}
    with pytest.raises(CoatiUsageError, match="tool '_undocumented'"):
        tool_from_function(_undocumented)


def _undocumented(x):
    return x


def _sleeps(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


def test_calls_that_go_wrong_become_the_models_error_messages_and_are_counted():
    runner = ToolRunner(resolve_tools(["calculator", "test_multiturn:_sleeps"]), timeout_s=0.3)
    environment = ToolEnvironment(runner, hermes, malformed_penalty=0.5)
    environment.reset({})
    turn = ('<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>'
            '<tool_call>{"name": "_sleeps", "arguments": {"seconds": 5}}</tool_call>'
            '<tool_call>{"name": calculator}</tool_call>')
    step = environment.step(turn)
    assert [m["content"] for m in step.observation] == [
        "42", "error: unknown tool 'search'; tools: calculator, _sleeps",
        "error: calculator: unexpected argument 'expr'; takes expression", "error: calculator: division by zero",
        "error: _sleeps took longer than 0.3 s",
        "error: malformed tool call (invalid JSON: Expecting value at column 10)"]
    assert not step.done and step.reward == -0.5
    assert {k: v for k, v in step.counts.items() if k.startswith("tool_errors/")} == {
        "tool_errors/malformed": 1, "tool_errors/unknown_tool": 1, "tool_errors/bad_arguments": 1,
        "tool_errors/tool_error": 1, "tool_errors/timeout": 1}
    assert environment.step("The answer is 42.").done
    hung = [runner.run("_sleeps", {"seconds": 5}).error for _ in range(5)]
    assert hung == ["timeout"] * 5 and runner.run("calculator", {"expression": "2 + 2"}).text == "4"   # not held up


def test_a_row_offers_the_tools_its_tools_column_names():
    environment = ToolEnvironment(ToolRunner(resolve_tools(["calculator", "python"])), hermes)
    environment.reset({"tools": json.dumps([{"type": "function", "function": {"name": "python"}}])})
    assert [t["function"]["name"] for t in environment.tools()] == ["python"]
    assert "unknown tool 'calculator'" in environment.step(
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>').observation[0]["content"]
    with pytest.raises(ValueError, match="'search', which --tools does not implement"):
        environment.reset({"tools": [{"type": "function", "function": {"name": "search"}}]})
    for malformed in ("not json", json.dumps({"name": "python"}), json.dumps([{"type": "function"}])):
        with pytest.raises(ValueError, match="its tools column is not a list of OpenAI function schemas"):
            environment.reset({"tools": malformed})


# ---- token-in, token-out ------------------------------------------------------------------------------
@pytest.mark.parametrize("template", ["qwen2_5.jinja", "llama3_1.jinja", "coati"])
def test_a_conversation_built_turn_by_turn_is_the_templates_rendering_token_for_token(tokenizer, template):
    from coati.models.tiny import CHAT_TEMPLATE

    chat = _chat(tokenizer, CHAT_TEMPLATE if template == "coati" else _template(template))
    check_appending(chat)
    conversation = probe_conversation(chat.tools)
    built, mask = turn_by_turn(chat, conversation)
    whole = tokenizer.apply_chat_template(conversation, tools=chat.tools, tokenize=True)
    assert built == whole[:len(built)] and not tokenizer.decode(whole[len(built):]).strip()
    trained = tokenizer.decode([t for t, m in zip(built, mask) if m])
    stop = tokenizer.decode([chat.turn_stop_id()])
    assert trained == conversation[1]["content"] + stop + conversation[3]["content"] + stop   # the model's turns only


def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line(tokenizer):
    chat = _chat(tokenizer, HISTORY_REWRITING)
    with pytest.raises(CoatiUsageError) as refused:
        check_appending(chat)
    message = str(refused.value)
    assert "\n" not in message and "does not render a conversation by appending turns: at token" in message


def test_a_template_without_tools_or_with_a_foreign_end_of_turn_is_refused(tokenizer):
    with pytest.raises(CoatiUsageError, match="does not render tools"):
        check_appending(_chat(tokenizer, "{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"))
    odd = "{{ tools | tojson }}{% for m in messages %}[{{ m.role }}]{{ m.content }}[end]{% endfor %}"
    with pytest.raises(CoatiUsageError, match=r"closes an assistant turn with '\[end\]'"):
        _chat(tokenizer, odd).turn_stop_id()


class _Scripted(RolloutPool):
    """Answers each request with the next scripted turn (token ids and their log-probs), as an engine would."""

    def __init__(self, turns):
        self.turns, self.requests, self.sessions = list(turns), [], set()

    async def agenerate(self, prompt_ids, config, n, session=None, seat=None):
        self.requests.append((list(prompt_ids), config.max_new_tokens, n))
        self.sessions.add(session)
        rows = [self.turns.pop(0) for _ in range(n)]
        return Completions.of([ids for ids, _ in rows], [lps for _, lps in rows], self.version)

    def publish(self, weights, version):
        raise NotImplementedError


def _turn(chat, text, stop=True):
    ids = chat.encode(text) + ([chat.turn_stop_id()] if stop else [])
    return ids, [-0.5 - 0.01 * i for i in range(len(ids))]


def _workflow(tokenizer, turns=8, budget=0, max_new_tokens=64):
    from coati.models.tiny import CHAT_TEMPLATE

    chat = _chat(tokenizer, CHAT_TEMPLATE)
    runner = ToolRunner(resolve_tools(["calculator"]))
    scorer = Scorer(tokenizer, WeightedReward.from_specs(["math_answer"]))
    return chat, MultiTurnWorkflow(scorer, chat, lambda: ToolEnvironment(runner, hermes),
                                   SamplingConfig(max_new_tokens=max_new_tokens), 2, turns, budget)


ROW = {"prompt": json.dumps([{"role": "user", "content": "What is 12 * 34?"}]), "gt_answer": "408", "input_ids": [1]}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'


def test_an_episode_trains_on_the_sampled_tokens_verbatim_and_nothing_else(tokenizer):
    chat, workflow = _workflow(tokenizer)
    first, second, other = _turn(chat, CALL), _turn(chat, "The answer is 408."), _turn(chat, "The answer is 400.")
    engine = _Scripted([first, other, second])
    trajectory = asyncio.run(workflow.arun_episode(engine, ROW))
    prompt = chat.prompt_ids(json.loads(ROW["prompt"]))
    conversation = [*json.loads(ROW["prompt"]), {"role": "assistant", "content": CALL},
                    {"role": "tool", "name": "calculator", "content": "408"},
                    {"role": "assistant", "content": "The answer is 408."}]
    whole = tokenizer.apply_chat_template(conversation, tools=chat.tools, tokenize=True)
    sample = trajectory.samples[0]
    row = sample.attended_ids
    assert row == whole[:len(row)] and sample.prompt_ids == prompt
    assert sample.sampled_ids == first[0] + second[0]                             # the engine's ids, verbatim
    assert sample.turn_starts == (0, len(sample.completion_ids) - len(second[0]))  # the second turn ends it
    logprobs = torch.tensor(sample.logprobs)
    mask = torch.tensor(sample.completion_mask)
    assert logprobs[mask].tolist() == pytest.approx(first[1] + second[1])
    assert logprobs[~mask].abs().sum() == 0
    assert engine.requests[1][0] == row[:len(engine.requests[1][0])]               # turn 2 continues the tokens
    assert len(engine.sessions) == 1 and None not in engine.sessions                # every turn in one session
    assert trajectory.rewards.tolist() == [1.0, 0.0]                               # the final answers, scored
    stats = trajectory.rollout_stats
    assert stats["turns"] == [2.0, 1.0] and stats["tool_calls"] == [1.0, 0.0] and stats["ended/answer"] == [1.0, 1.0]
    assert trajectory.completions[0][1] == {"role": "tool", "name": "calculator", "content": "408"}


def test_episodes_end_at_the_turn_limit_the_token_budget_a_cut_turn_or_the_end_of_sequence(tokenizer):
    chat, workflow = _workflow(tokenizer, turns=1)
    trajectory = asyncio.run(workflow.arun_episode(_Scripted([_turn(chat, CALL), _turn(chat, CALL)]), ROW))
    assert trajectory.rollout_stats["ended/max_turns"] == [1.0, 1.0]
    chat, workflow = _workflow(tokenizer, budget=40)
    engine = _Scripted([_turn(chat, CALL), _turn(chat, "no", stop=False)])
    trajectory = asyncio.run(workflow.arun_episode(engine, ROW))
    assert trajectory.rollout_stats["ended/max_total_tokens"] == [1.0, 0.0]
    assert trajectory.rollout_stats["ended/truncated"] == [0.0, 1.0]
    assert engine.requests[0][1] == 40 and max(len(s.completion_ids) for s in trajectory.samples) <= 40 + 64
    chat, workflow = _workflow(tokenizer)
    sequence_end = (chat.encode(CALL) + [tokenizer.convert_tokens_to_ids("<|eot_id|>")], [0.0] * (len(chat.encode(CALL)) + 1))
    trajectory = asyncio.run(workflow.arun_episode(_Scripted([sequence_end, _turn(chat, "#### 408")]), ROW))
    assert trajectory.rollout_stats["turns"] == [1.0, 1.0] and trajectory.rollout_stats["tool_calls"] == [0.0, 0.0]


class _Ticking(Environment):
    """Answers every model turn with a tool message, after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def step(self, turn):
        time.sleep(self.delay)
        return EnvStep([{"role": "tool", "name": "clock", "content": "tick"}])


def test_a_synchronous_run_samples_the_same_tokens_however_long_its_tools_take(turn_ender):
    """Later turns reach the engine when each episode's tools finish; the local engine still generates each turn of every
    episode in the same batch, in the same row, so the sampled tokens do not depend on the tools' timing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.models.generation import HFEngine
    from coati.rollout import LocalPool, run_episodes

    tokenizer = AutoTokenizer.from_pretrained(turn_ender)
    model = AutoModelForCausalLM.from_pretrained(turn_ender).eval()
    engine = LocalPool(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    chat = ChatTokens(tokenizer, [tokenizer.eos_token_id])
    scorer = Scorer(tokenizer, WeightedReward.from_specs(["math_answer"]))
    rows = [ROW, {**ROW, "prompt": json.dumps([{"role": "user", "content": "What is 3 + 4?"}])}]

    def sampled(delays):
        given = iter(delays)
        workflow = MultiTurnWorkflow(scorer, chat, lambda: _Ticking(next(given)), SamplingConfig(max_new_tokens=8),
                                     2, 4, 0)
        torch.manual_seed(0)
        return run_episodes(workflow, engine, rows)

    quick_first, slow_first = sampled([0.0, 0.04, 0.08, 0.12]), sampled([0.12, 0.08, 0.04, 0.0])
    assert max(max(t.rollout_stats["turns"]) for t in quick_first) >= 3   # tools ran between turns
    for a, b in zip(quick_first, slow_first):
        assert [(s.completion_ids, s.completion_mask) for s in a.samples] == [
            (s.completion_ids, s.completion_mask) for s in b.samples]


def test_tool_use_demonstrations_train_on_the_assistant_turns_only(tokenizer, tmp_path):
    from coati.models.tiny import CHAT_TEMPLATE
    from coati.dataset.prepare import load_prepared, prepare_dataset
    from coati.dataset.tokenization import IGNORE_INDEX

    tokenizer.chat_template = CHAT_TEMPLATE
    schemas = tool_schemas(resolve_tools(["calculator"]))
    conversation = [{"role": "user", "content": "What is 12 * 34?"}, {"role": "assistant", "content": CALL},
                    {"role": "tool", "name": "calculator", "content": "408"},
                    {"role": "assistant", "content": "The answer is 408."}]
    raw = tmp_path / "demos.jsonl"
    raw.write_text(json.dumps({"messages": conversation, "tools": schemas}) + "\n"
                   + json.dumps({"messages": conversation[:1] + conversation[2:]}) + "\n")
    with pytest.raises(Exception, match="wrong role order: turn 2 is tool, expected assistant"):
        prepare_dataset([raw], "sft", tokenizer, 2048, tmp_path / "bad")
    raw.write_text(json.dumps({"messages": conversation, "tools": schemas}) + "\n")
    prepare_dataset([raw], "sft", tokenizer, 2048, tmp_path / "sft")
    row = load_prepared([str(tmp_path / "sft")], "sft")[0]
    assert row["input_ids"] == tokenizer.apply_chat_template(conversation, tools=schemas, tokenize=True)[:len(row["input_ids"])]
    labelled = tokenizer.decode([t for t in row["labels"] if t != IGNORE_INDEX])
    assert labelled == CALL + "<|im_end|>" + "The answer is 408." + "<|im_end|>"        # never the tool's answer
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"messages": conversation[:1], "tools": schemas, "gt_answer": "408"}) + "\n")
    prepare_dataset([prompts], "prompt", tokenizer, 256, tmp_path / "prompts")
    assert json.loads(load_prepared([str(tmp_path / "prompts")], "prompt")[0]["tools"]) == schemas


def test_the_product_task_holds_out_operand_pairs_and_its_demonstrations_call_the_calculator(tokenizer):
    from coati.dataset.demo_data import generate_products, tool_sft_records

    train, held_out = generate_products(200, "train"), generate_products(50, "eval")
    assert all(p.answer == eval(p.question[8:-1]) for p in train + held_out)            # "What is A * B?"
    assert not {p.question for p in train} & {p.question for p in held_out}
    demo = tool_sft_records(held_out[:1], tool_schemas(resolve_tools(["calculator"])))[0]
    call = hermes(demo["messages"][1]["content"]).calls[0]
    assert calculator(**call.arguments) == demo["messages"][2]["content"] == str(held_out[0].answer)


def test_a_saved_model_is_evaluated_in_episodes_that_may_call_its_tools(tiny_assets):
    from coati.rollout.evaluation import evaluate_model

    result = evaluate_model(str(tiny_assets["model"]), [str(tiny_assets["prompt_eval"])], max_new_tokens=8,
                            tools=("calculator",), max_turns=2)
    assert len(result.samples) == 32 and 0.0 <= result.components["math_answer"] <= 1.0
    assert all(s["completion"][0]["role"] == "assistant" for s in result.samples)   # conversations, not text


class _Routed(BatchingPool):
    """A pool of `count` generators that answers each request with the index of the generator that served it."""

    def __init__(self, count):
        self._start_queues(count)

    async def _generate_batch(self, index, requests, config, images=None):
        await asyncio.sleep(0.01)
        return [index] * len(requests)

    def publish(self, weights, version):
        raise NotImplementedError


def test_a_pool_sends_every_turn_of_a_session_to_the_generator_of_its_first():
    """vLLM's prefix cache holds a conversation only on the server that saw its earlier turns."""
    pool, config = _Routed(2), SamplingConfig(max_new_tokens=4)

    async def turns():
        first = await asyncio.gather(pool.agenerate([1], config, 1, "a"), pool.agenerate([2], config, 1, "b"))
        busy = asyncio.ensure_future(pool.agenerate([3], config, 1))           # keeps one generator busy
        await asyncio.sleep(0)
        later = await asyncio.gather(pool.agenerate([1, 5], config, 1, "a"), pool.agenerate([2, 6], config, 1, "b"),
                                     pool.agenerate([7], config, 1))
        return first, await busy, later

    (a, b), busy, (a2, b2, free) = asyncio.run(turns())
    assert {a, b} == {0, 1} and (a2, b2) == (a, b)
    assert free != busy                                                          # no session: the least busy


# ---- agents you already have: the OpenAI-compatible endpoint ------------------------------------------------------
def _calculator_agent():
    import importlib.util

    spec = importlib.util.spec_from_file_location("calculator_agent", AGENTS / "calculator_agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _agent_workflow(tokenizer, agent, timeout=30.0, n=1):
    from coati.models.tiny import CHAT_TEMPLATE
    from coati.rollout.agent import AgentWorkflow

    chat = _chat(tokenizer, CHAT_TEMPLATE)
    scorer = Scorer(tokenizer, WeightedReward.from_specs(["math_answer"]))
    return chat, AgentWorkflow(scorer, chat, agent, SamplingConfig(max_new_tokens=64), n, timeout)


def test_an_openai_client_agent_is_trained_on_the_engines_tokens_verbatim(tokenizer):
    """The example agent, unchanged, through the real `openai` client: its tool call comes back as `tool_calls`, it
    runs the calculator, and the trained sequence is the template's rendering of the whole conversation with the
    engine's ids verbatim, masked to them alone."""
    agent = _calculator_agent()
    chat, workflow = _agent_workflow(tokenizer, agent.solve)
    first, second = _turn(chat, CALL), _turn(chat, "The answer is 408.")
    engine = _Scripted([first, second])
    trajectory = asyncio.run(workflow.arun_episode(engine, ROW))
    conversation = [*json.loads(ROW["prompt"]), {"role": "assistant", "content": CALL},
                    {"role": "tool", "name": "calculator", "content": "408"},
                    {"role": "assistant", "content": "The answer is 408."}]
    whole = tokenizer.apply_chat_template(conversation, tools=agent.TOOLS, tokenize=True)
    sample = trajectory.samples[0]
    assert sample.attended_ids == whole[:len(sample.attended_ids)]
    assert sample.sampled_ids == first[0] + second[0] and len(sample.turn_starts) == 2
    logprobs, mask = torch.tensor(sample.logprobs), torch.tensor(sample.completion_mask)
    assert logprobs[mask].tolist() == pytest.approx(first[1] + second[1])
    assert logprobs[~mask].abs().sum() == 0
    assert len(engine.sessions) == 1 and trajectory.rewards.tolist() == [1.0]
    stats = trajectory.rollout_stats
    assert stats["turns"] == [2.0] and stats["ended/answer"] == [1.0] and stats["agent/restarts"] == [0.0]
    assert stats["tool_calls"] == [1.0] and "tool_seconds" not in stats   # the calls it was given; it ran them itself
    assert trajectory.completions[0][1]["role"] == "tool" and trajectory.completions[0][1]["content"] == "408"


def test_the_endpoint_answers_with_the_tool_calls_the_runs_parser_finds():
    from coati.rollout.agent import completion_body
    from tool_timing import every_turn_a_call

    hermes_answer = completion_body("Let me see. " + CALL, hermes("Let me see. " + CALL), True, 10, 5)["choices"][0]
    assert hermes_answer["finish_reason"] == "tool_calls" and hermes_answer["message"]["content"] == "Let me see."
    assert hermes_answer["message"]["tool_calls"][0]["function"] == {"name": "calculator",
                                                                     "arguments": '{"expression": "12 * 34"}'}
    own = completion_body("what time is it", every_turn_a_call("what time is it"), True, 10, 4)["choices"][0]["message"]
    assert own["content"] == "what time is it" and own["tool_calls"][0]["function"]["name"] == "clock"
    plain = completion_body("408", hermes("408"), False, 10, 1)["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": "408"} and plain["finish_reason"] == "length"


def test_an_agent_that_fails_hangs_or_rewrites_its_history_ends_its_own_episode(tokenizer):
    from openai import OpenAI

    def ask(base_url, messages):
        return OpenAI(base_url=base_url, api_key="x", max_retries=0).chat.completions.create(
            model="policy", messages=messages).choices[0].message.content

    def failing(base_url, row):
        ask(base_url, row["messages"])
        raise RuntimeError("the agent's own bug")

    def hanging(base_url, row):
        ask(base_url, row["messages"])
        time.sleep(5)

    def rewriting(base_url, row):   # asks again without the answer it was given: a new branch
        ask(base_url, row["messages"])
        return ask(base_url, [{"role": "user", "content": "What is 12 * 34 exactly?"}])

    endings = {}
    for agent, timeout in ((failing, 30.0), (hanging, 1.0), (rewriting, 30.0)):
        chat, workflow = _agent_workflow(tokenizer, agent, timeout)
        engine = _Scripted([_turn(chat, "#### 400"), _turn(chat, "#### 408")])
        start = time.monotonic()
        trajectory = asyncio.run(workflow.arun_episode(engine, ROW))
        assert time.monotonic() - start < 4
        endings[agent.__name__] = {k: v[0] for k, v in trajectory.rollout_stats.items() if k.startswith(("ended", "agent"))}
        if agent is rewriting:   # trained on the last branch: its own prompt, the second answer, scored right
            assert trajectory.samples[0].prompt_ids == chat.prompt_ids(
                [{"role": "user", "content": "What is 12 * 34 exactly?"}])
            assert trajectory.rewards.tolist() == [1.0]
    assert endings["failing"]["ended/agent_error"] == 1.0
    assert endings["hanging"]["ended/agent_timeout"] == 1.0
    assert endings["rewriting"]["agent/restarts"] == 1.0 and endings["rewriting"]["ended/answer"] == 1.0


def test_agent_episodes_keep_prompts_of_their_own_and_are_padded_once_when_collated(tokenizer):
    """Agents may open with prompts of their own: each sample keeps its own, unpadded; the learner's collate left-pads
    the prompts and right-pads the completions, with the log-probs where the sampled tokens are."""
    from coati.experience.experience import collate
    from coati.rollout.multiturn import Episode, assemble

    scorer = Scorer(tokenizer, WeightedReward.from_specs(["math_answer"]))
    prompts = [[5, 6, 7, 8], [5, 6, 9]]
    episodes = [Episode(), Episode()]
    episodes[0].add([20, 21], True, [-1.0, -2.0])
    episodes[1].add([30], True, [-3.0])
    trajectory = asyncio.run(assemble(scorer, {"gt_answer": "1"}, [], prompts, episodes, 3))
    assert [s.prompt_ids for s in trajectory.samples] == prompts and trajectory.version == 3
    assert [s.token_versions for s in trajectory.samples] == [[3, 3], [3]]
    batch = collate(trajectory.samples, 0)
    assert batch.prompt_length == 4
    assert batch.sequences.tolist() == [[5, 6, 7, 8, 20, 21], [0, 5, 6, 9, 30, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]]
    assert batch.action_mask.tolist() == [[True, True], [True, False]]
    assert batch.behaviour_log_probs.tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    wide = collate(trajectory.samples, 0, min_width=5)   # at least the completion limit wide: one shape every step
    assert wide.action_mask.shape == (2, 5) and wide.sequences[:, :6].tolist() == batch.sequences.tolist()


def test_the_recorded_tokens_are_what_a_real_engine_produced(tiny_assets):
    """The tiny model on the local engine, two episodes of the example agent at once: each episode's trained tokens
    are the engine's outputs for that episode's requests, in order."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coati.models.generation import HFEngine
    from coati.rollout.agent import AgentWorkflow
    from coati.rollout import LocalPool

    class Recording(LocalPool):
        def __init__(self, *args):
            super().__init__(*args)
            self.outputs = {}

        async def agenerate(self, prompt_ids, config, n, session=None, seat=None):
            out = await super().agenerate(prompt_ids, config, n, session)
            self.outputs.setdefault(session, []).extend(out.rows[0].token_ids)
            return out

    tokenizer = AutoTokenizer.from_pretrained(tiny_assets["model"])
    model = AutoModelForCausalLM.from_pretrained(tiny_assets["model"]).eval()
    engine = Recording(HFEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id]))
    chat = ChatTokens(tokenizer, [tokenizer.eos_token_id])
    scorer = Scorer(tokenizer, WeightedReward.from_specs(["math_answer"]))
    workflow = AgentWorkflow(scorer, chat, _calculator_agent().solve, SamplingConfig(max_new_tokens=12), 2)
    row = {"prompt": json.dumps([{"role": "user", "content": "What is 3 + 4?"}]), "gt_answer": "7", "input_ids": [1]}
    trajectory = asyncio.run(workflow.arun_episode(engine, row))
    trained = [s.sampled_ids for s in trajectory.samples]
    assert sorted(trained) == sorted(engine.outputs.values()) and len(engine.outputs) == 2
    assert all(s.logprobs is None for s in trajectory.samples)   # the local engine reports none


def test_an_engine_that_fails_under_an_agent_fails_the_rollout_not_just_the_agent(tokenizer):
    class Broken(_Scripted):
        async def agenerate(self, prompt_ids, config, n, session=None, seat=None):
            raise RuntimeError("the vLLM server died")

    _, workflow = _agent_workflow(tokenizer, _calculator_agent().solve)
    with pytest.raises(RuntimeError, match="the vLLM server died"):
        asyncio.run(workflow.arun_episode(Broken([]), ROW))
