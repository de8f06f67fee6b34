"""An agent written against the plain `openai` client, trained as it is with `train_grpo.py --agent`:

    PYTHONPATH=examples/agents torchrun --nproc_per_node 2 examples/training_scripts/train_grpo.py --pretrain MODEL \
        --prompt_dataset data/prompts --reward_fn math_answer --num_generations 4 --agent calculator_agent:solve

It offers the model one function, `calculator`, runs the calls the model makes, sends back the results, and returns
the model's first answer that calls nothing (at most `MAX_TURNS` requests). It reaches the model only through the client
(it borrows coati's exact calculator for its tool): pointed at
any OpenAI-compatible server it runs the same.
"""
import json
from typing import Any, Dict, Optional

from openai import OpenAI

from coati.rollout.tools import calculator

MAX_TURNS = 3
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 12 * 34"}},
                   "required": ["expression"]}}}]


def run_call(name: str, arguments: str) -> str:
    """The answer to one tool call, or the error the model should read."""
    try:
        if name != "calculator":
            return f"error: unknown tool {name!r}"
        return calculator(**json.loads(arguments))
    except Exception as error:
        return f"error: {error}"


def solve(base_url: str, row: Dict[str, Any]) -> Optional[str]:
    """Answer the row's conversation, calling the calculator as the model asks."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = list(row["messages"])
    answer = None
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=64)
        message = reply.choices[0].message
        answer = message.content
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                             "content": run_call(call.function.name, call.function.arguments)})
    return answer
