"""The walk of one multi-turn GRPO episode, traced from the code: the coati functions an episode enters, in the order
it first enters them, from `OLTrainer._episode` to the end of the first optimizer step, and the moves between files
that a reader following it makes. `docs/concepts/episode-walk.md` is this module's output; the refactor of issue 48
shrinks its count of moves (`tests/integration/test_episode_walk.py` holds the ceiling).

    PYTHONPATH=tests .venv/bin/python tests/episode_walk.py   # rewrites docs/concepts/episode-walk.md

The traced run is one process (a world of one), the `hf` engine, three turns with a tool every turn, a KL to the
reference and two reward functions. So that the order is the same on every run, the tool answers at once and the
work episodes hand to a thread (`asyncio.to_thread`: tool steps, scoring) runs inline on the event loop.
"""
import asyncio
import importlib.util
import json
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple

from coati.rollout.tool_calls import ParsedTurn, ToolCall

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "concepts" / "episode-walk.md"
TRACED = (str(REPO / "coati"), str(REPO / "examples"))
INLINE = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")
"""Comprehensions run inside the function that holds them: no step of their own."""
WALKED_EPISODE = 1
"""The second episode: the first also builds what is built lazily once."""
LAST_STEP = "apply_gradients"


class Step(NamedTuple):
    file: str
    function: str


def tick() -> str:
    """Answers at once.

    Returns:
        A tick.
    """
    return "tick"


def every_turn_a_tick(text: str) -> ParsedTurn:
    """Reads every turn, whatever its text, as one call of `tick`."""
    return ParsedTurn(calls=[ToolCall("tick", {})])


def grpo_argv(model: Path, prompts: Path, out: Path) -> List[str]:
    return ["--pretrain", str(model), "--prompt_dataset", str(prompts), "--plugin", "ddp", "--batch_size", "2",
            "--max_new_tokens", "8", "--num_episodes", str(WALKED_EPISODE + 1), "--lr", "1e-3", "--seed", "7",
            "--rollout_backend", "hf", "--num_generations", "4", "--kl_coef", "0.05",
            "--reward_fn", "math_answer", "answer_format", "--tools", "episode_walk:tick",
            "--tool_parser", "episode_walk:every_turn_a_tick", "--max_turns", "3", "--output_dir", str(out)]


class Tracer:
    """A profile hook keeping the first entry into each coati function during the walked episode."""

    def __init__(self) -> None:
        self.steps: List[Step] = []
        self.seen: set = set()
        self.walking = self.done = False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if self.done or not code.co_filename.startswith(TRACED):
            return
        if event == "call" and code.co_name == "_episode" and frame.f_locals.get("episode") == WALKED_EPISODE:
            self.walking = True
        if not self.walking:
            return
        if event == "call" and not any(part in code.co_qualname for part in INLINE):
            key = (code.co_filename, code.co_qualname)
            if key not in self.seen:
                self.seen.add(key)
                self.steps.append(Step(os.path.relpath(code.co_filename, REPO), code.co_qualname))
        elif event == "return" and code.co_name == LAST_STEP:
            self.done = True


async def inline(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`asyncio.to_thread` run on the event loop's own thread: the episodes' order no longer hangs on a thread's."""
    return fn(*args, **kwargs)


def trace(model: Path, prompts: Path, out: Path) -> List[Step]:
    """Run `train_grpo.py` in this process as a world of one and return the walked episode's steps."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    spec = importlib.util.spec_from_file_location("train_grpo", REPO / "examples" / "training_scripts" / "train_grpo.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    asyncio.to_thread = inline
    tracer = Tracer()
    sys.setprofile(tracer)
    threading.setprofile(tracer)   # reward functions run in a thread of their own while the episode waits
    try:
        script.main(grpo_argv(model, prompts, out))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert tracer.done, "the walked episode never reached an optimizer step"
    return tracer.steps


def moves(steps: List[Step]) -> Dict[str, int]:
    """Files visited, moves from one file to another, and the moves back into a file already visited."""
    files = [step.file for step in steps]
    visited, back, count = {files[0]}, 0, 0
    for before, after in zip(files, files[1:]):
        if before != after:
            count += 1
            back += after in visited
            visited.add(after)
    return {"functions": len(steps), "files": len(visited), "moves": count, "moves_back": back}


def render(steps: List[Step]) -> str:
    """The docs page: the counts, then the walk as one numbered stop per stay in a file."""
    counts = moves(steps)
    lines = ["# The walk of one GRPO episode", "",
             "<!-- generated by tests/episode_walk.py: PYTHONPATH=tests .venv/bin/python tests/episode_walk.py -->", "",
             "The coati functions one multi-turn GRPO episode enters, in the order it first enters them, from",
             "`OLTrainer._episode` to the end of the first optimizer step (`apply_gradients`), traced from the code",
             "(`tests/episode_walk.py`: one process, the `hf` engine, three turns with a tool every turn, a KL to the",
             "reference, two reward functions; what episodes hand to a thread runs inline, so that the order is the",
             "same on every run). Each stop is a stay in one file; a reader following the episode moves from file to",
             "file as the list does. Comprehensions count as part of their function; a function entered again later is",
             "listed once, where it is first entered. On the code before the run-config refactor (`0a34dbd`, issue 48),",
             "the same trace counted 160 functions in 28 files and 77 moves between files, 50 of them back.", "",
             "| functions | files | moves between files | of them back into a file already visited |",
             "|---|---|---|---|",
             f"| {counts['functions']} | {counts['files']} | {counts['moves']} | {counts['moves_back']} |", ""]
    stop = 0
    for index, step in enumerate(steps):
        if index == 0 or steps[index - 1].file != step.file:
            stop += 1
            lines += ["", f"{stop}. `{step.file}`"]
        lines.append(f"    - `{step.function}`")
    return "\n".join(lines) + "\n"


def walk() -> List[Step]:
    """Build the tiny model, its turn-ending variant and the prompts in a temporary folder, and trace."""
    from conftest import build_tiny_assets, build_turn_ender

    with tempfile.TemporaryDirectory() as tmp:
        assets = build_tiny_assets(Path(tmp) / "assets")
        model = build_turn_ender(assets, Path(tmp) / "turn_ender")
        return trace(model, assets["prompt_train"], Path(tmp) / "out")


if __name__ == "__main__":
    steps = walk()
    if sys.argv[1:] == ["--json"]:
        print("WALK " + json.dumps([list(step) for step in steps]))
    else:
        PAGE.write_text(render(steps))
        print(f"wrote {PAGE.relative_to(REPO)}: {moves(steps)}")
