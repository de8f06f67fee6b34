"""The math reward on tricky answers (numbers exactly, expressions through math-verify in worker processes with a
timeout); the weighted reward's components and diagnostics, and its errors that name the function."""
import re
import sys
import threading
import time

import psutil
import pytest

from coati.rewards import RewardFunctionError, WeightedReward, answers_match, extract_answer, extract_code, math_answer
from coati.rewards.verifier import MathVerifier
from coati.utils.errors import CoatiUsageError

CASES = [
    ("12 - 2 = 10. #### 10", "10", True),
    ("so the answer is #### -7", "-7", True),
    ("#### 7", "-7", False),
    ("The total is 1,234 apples.", "1234", True),
    ("#### 1,234.50", "1234.5", True),
    ("$\\boxed{42}$", "42", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{-\\frac{3}{4}}", "-3/4", True),
    ("I think it's 5, no wait, 6.", "6", True),
    ("I don't know.", "3", False),
    ("", "0", False),
    ("#### 10 apples", "10", True),
    ("#### 50%", "50", True),
    ("#### $18", "18", True),
    ("Answer: 3.0", "3", True),
    ("#### 3", "She has 5 pens left. #### 3", True),      # a GSM8K-style ground truth
    # expressions, which math-verify compares symbolically
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", True),
    ("\\boxed{\\dfrac{3}{6}}", "0.5", True),
    ("so $\\boxed{x=3}$", "3", True),
    ("\\boxed{x = -2}", "-2", True),
    ("\\boxed{\\sqrt{4}}", "2", True),
    ("\\boxed{\\sqrt{2}}", "\\frac{2}{\\sqrt{2}}", True),
    ("\\boxed{2\\pi}", "\\pi + \\pi", True),
    ("\\boxed{\\pi}", "3", False),
    ("\\boxed{[1,2]}", "[1,2]", True),
    ("\\boxed{[1,3]}", "[1,2]", False),
    ("\\boxed{(0, \\infty)}", "(0,\\infty)", True),
    ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", True),
    ("\\boxed{\\{1,3\\}}", "\\{1,2\\}", False),
    ("\\boxed{5\\text{ cm}}", "5", True),
    ("\\boxed{12\\%}", "12", True),
    ("\\boxed{-\\frac{1}{3}}", "\\frac{-1}{3}", True),
    ("\\boxed{\\frac{1}{3}}", "-\\frac{1}{3}", False),
    ("\\boxed{2^{10}}", "1024", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x^2+1}", "(x+1)^2", False),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sin(\\pi/3)", True),
]


@pytest.fixture(scope="module")
def patient_verifier():
    """A verifier whose checks may take a minute: these cases test verdicts, and under CI load a first symbolic check
    once overran the 5 s default (the timeout has its own test below)."""
    verifier = MathVerifier(timeout_s=60)
    yield verifier
    verifier.close()


@pytest.mark.parametrize("completion,truth,expected", CASES)
def test_math_answer_on_tricky_answers(completion, truth, expected, patient_verifier, monkeypatch):
    monkeypatch.setattr("coati.rewards.math.shared_verifier", lambda: patient_verifier)
    assert answers_match(completion, truth) is expected


def test_answer_extraction_prefers_hashes_then_boxed_then_the_last_number():
    assert extract_answer("3 + 4 = 7 #### 7") == "7"
    assert extract_answer("first 3 then \\boxed{5} then 9") == "5"
    assert extract_answer("\\boxed{\\frac{a^{2^{b}}}{c}} done") == "\\frac{a^{2^{b}}}{c}"   # braces matched at any depth
    assert extract_answer("no digits") is None


def _verifier_workers():
    """This process's math-verify workers (children left by other tests, zombies among them, are skipped)."""
    workers = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "verifier.py" in " ".join(child.cmdline()):
                workers.append(child)
        except psutil.Error:
            continue
    return workers


def test_a_verifier_that_hangs_scores_zero_from_a_thread_and_is_counted():
    """2^2^2^2^2^10 makes sympy compute for ever while holding the GIL: only killing its worker process stops it."""
    math_answer([], ["\\boxed{x=1}"], ["1"])                 # the shared verifier's workers are up
    before = {p.pid for p in _verifier_workers()}
    outcome = {}

    def score():
        start = time.monotonic()
        outcome["result"] = math_answer(["p"] * 2, ["\\boxed{2^{2^{2^{2^{2^{10}}}}}}", "\\boxed{\\frac{14}{2}}"], ["7", "7"])
        outcome["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    result = outcome["result"]
    assert result.values == [0.0, 1.0] and result.diagnostics == {"timeouts": [1.0, 0.0], "errors": [0.0, 0.0]}
    assert outcome["seconds"] < 30
    after = {p.pid for p in _verifier_workers()}
    assert len(after) == len(before) and after != before    # the overrunning worker was killed and replaced
    assert math_answer([], ["\\boxed{x=7}"], ["7"]).values == [1.0]   # and checking goes on


def test_diagnostics_are_logged_beside_the_reward_but_not_added_to_it():
    total, components = WeightedReward.from_specs(["math_answer"])(["q", "q"], ["\\boxed{2^{3}}", "#### 9"],
                                                                   gt_answer=["8", "8"])
    assert total == [1.0, 0.0]
    assert components == {"math_answer": [1.0, 0.0], "math_answer/timeouts": [0.0, 0.0], "math_answer/errors": [0.0, 0.0]}


def test_a_closed_verifier_leaves_no_worker_behind():
    before = {p.pid for p in _verifier_workers()}
    verifier = MathVerifier(workers=2, timeout_s=5)
    assert verifier.check([("\\frac{1}{2}", "0.5"), ("3", "x=4")]) == ["match", "mismatch"]
    own = {p.pid for p in _verifier_workers()} - before
    assert len(own) == 2
    verifier.close()
    assert not own & {p.pid for p in _verifier_workers()} and not any(psutil.pid_exists(pid) for pid in own)


def test_weighted_reward_sums_components_and_keeps_each():
    reward = WeightedReward.from_specs(["math_answer", "answer_format=0.5"])
    total, components = reward(["q1", "q2"], ["#### 3", "3"], gt_answer=["3", "4"])
    assert components == {"math_answer": [1.0, 0.0], "math_answer/timeouts": [0.0, 0.0],
                          "math_answer/errors": [0.0, 0.0], "answer_format": [1.0, 0.0]}
    assert total == [1.5, 0.0]


def bad_length(prompts, completions, **_):
    return [1.0]


def raises(prompts, completions, **_):
    raise KeyError("gt_answer")


def named_parts(prompts, completions, **_):
    return {"short": [float(len(c) < 3) for c in completions], "long": [float(len(c) >= 3) for c in completions]}


def test_user_reward_functions_by_module_path_with_clear_errors():
    with pytest.raises(RewardFunctionError, match=r"reward function test_rewards:bad_length returned 1 values for 2 completions"):
        WeightedReward.from_specs(["test_rewards:bad_length"])(["a", "b"], ["x", "y"])
    with pytest.raises(RewardFunctionError, match=r"reward function test_rewards:raises raised KeyError: 'gt_answer'"):
        WeightedReward.from_specs(["test_rewards:raises"])(["a"], ["x"])
    total, components = WeightedReward.from_specs(["test_rewards:named_parts=2"])(["a", "b"], ["xy", "xyz"])
    assert components == {"named_parts/short": [1.0, 0.0], "named_parts/long": [0.0, 1.0]}   # by name, as TRL logs
    assert total == [2.0, 2.0]
    with pytest.raises(CoatiUsageError, match="unknown reward function 'nope'"):
        WeightedReward.from_specs(["nope"])
    with pytest.raises(CoatiUsageError, match="cannot be imported"):
        WeightedReward.from_specs(["no_such_module:fn"])


USER_REWARDS = """
def one(completions, **kwargs):
    return [1.0 for _ in completions]


def text(completions, **kwargs):
    return ["1.0" for _ in completions]


def raises(completions, **kwargs):
    return [lookup(c) for c in completions]


def lookup(completion):
    return {}["answer"]
"""


def test_a_reward_in_the_working_directory_imports_in_trls_and_openrlhfs_forms(tmp_path, monkeypatch):
    """TRL's `module.function` and coati's `module:function` from the working directory (whatever sys.path the
    launcher gave), OpenRLHF-style `path/to/file.py:function`; each logged under the function's name."""
    (tmp_path / "cwd_rewards_a.py").write_text(USER_REWARDS)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file_rewards.py").write_text(USER_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    for spec in ("cwd_rewards_a.one", "cwd_rewards_a:one", "sub/file_rewards.py:one"):
        total, components = WeightedReward.from_specs([spec])(["a", "b"], ["x", "y"])
        assert total == [1.0, 1.0] and list(components) == ["one"], spec
    with pytest.raises(CoatiUsageError, match=rf"reward function 'sub/missing.py:one' cannot be imported: no file "
                                              rf".*\(the working directory {tmp_path} is searched too\)"):
        WeightedReward.from_specs(["sub/missing.py:one"])


@pytest.mark.parametrize("module, source, message", [
    ("unclosed", "def one(completions, **kwargs):\n    return [1.0 for _ in completions\n",
     r"unclosed\.py:2: '\[' was never closed"),
    ("raising", "import json\nSCALE = json.loads('{')\n", r"raising\.py:2 raised JSONDecodeError: Expecting property name"),
])
def test_a_reward_file_that_fails_to_import_is_one_line_naming_its_file_and_line(tmp_path, monkeypatch, module, source,
                                                                                 message):
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for spec in (f"{module}.one", f"{module}.py:one"):
        with pytest.raises(CoatiUsageError, match=rf"reward function '{re.escape(spec)}' cannot be imported: .*{message}"):
            WeightedReward.from_specs([spec])


def test_a_reward_that_raises_shows_its_own_frames_then_one_line_and_text_is_not_a_reward(tmp_path, monkeypatch,
                                                                                          capsys):
    from coati.utils.errors import exit_cleanly

    (tmp_path / "cwd_rewards_b.py").write_text(USER_REWARDS)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RewardFunctionError, match=r"reward function cwd_rewards_b.text must return numbers \(or None\), "
                                                  r"got \['1.0'\]"):
        WeightedReward.from_specs(["cwd_rewards_b.text"])(["a"], ["x"])
    run = exit_cleanly(lambda: WeightedReward.from_specs(["cwd_rewards_b.raises"])(["a"], ["x"]))
    with pytest.raises(SystemExit) as stop:
        run()
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "Traceback (the reward function's frames):"
    assert f'File "{tmp_path / "cwd_rewards_b.py"}", line 11, in raises' in lines[1]
    assert f'File "{tmp_path / "cwd_rewards_b.py"}", line 15, in lookup' in "\n".join(lines)
    assert not any("coati" in line for line in lines[:-1] if line.lstrip().startswith("File"))
    assert lines[-2:] == ["KeyError: 'answer'", "error: reward function cwd_rewards_b.raises raised KeyError: 'answer'"]


@pytest.mark.timeout(60)
def test_answer_extraction_is_linear_in_the_completion():
    """20,000 unclosed boxes took over 180 s when each box was matched to the text's end; one pass takes far less
    than the hang guard (pytest's timeout), at 100,000 as at 10."""
    for opened in (10, 100_000):
        text = "\\boxed{" * opened + "\\boxed{7} and " + "\\boxed{" * opened
        assert extract_answer(text) == "7"
        assert math_answer(["p"], [text], ["7"]).values == [1.0]
    unclosed = "```python\n" + "x = 1\n" * 100_000
    assert extract_code(unclosed) is None and extract_code(unclosed + "```") == unclosed[10:]


def test_the_columns_your_reward_functions_require_are_checked_against_the_datas(tmp_path, monkeypatch):
    (tmp_path / "column_rewards.py").write_text(
        "def needs(completions, solution, trainer_state, **kwargs):\n    return [0.0] * len(completions)\n"
        "def optional(completions, solution=None, **kwargs):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    rewards = WeightedReward.from_specs(["column_rewards.needs", "column_rewards.optional", "math_answer"])
    rewards.check_columns(["prompt", "solution", "gt_answer"], "the data")
    with pytest.raises(CoatiUsageError, match=r"reward function column_rewards.needs takes 'solution', which the data "
                                              r"has no column for \(its columns: prompt, gt_answer\)"):
        rewards.check_columns(["prompt", "gt_answer"], "the data")
    with pytest.raises(CoatiUsageError, match=r"reward function math_answer takes 'gt_answer', which the data has no "
                                              r"column for \(its columns: prompt, solution\); give the data a column "
                                              r"'gt_answer'$"):     # a built-in's too
        rewards.check_columns(["prompt", "solution"], "the data")
