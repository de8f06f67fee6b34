"""The math reward on tricky answers; the weighted reward's components and its errors that name the function."""
import pytest

from coati.rewards import RewardFunctionError, WeightedReward, answers_match, extract_answer
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
]


@pytest.mark.parametrize("completion,truth,expected", CASES)
def test_math_answer_on_tricky_answers(completion, truth, expected):
    assert answers_match(completion, truth) is expected


def test_answer_extraction_prefers_hashes_then_boxed_then_the_last_number():
    assert extract_answer("3 + 4 = 7 #### 7") == "7"
    assert extract_answer("first 3 then \\boxed{5} then 9") == "5"
    assert extract_answer("no digits") is None


def test_weighted_reward_sums_components_and_keeps_each():
    reward = WeightedReward.from_specs(["math_answer", "answer_format=0.5"])
    total, components = reward(["q1", "q2"], ["#### 3", "3"], gt_answer=["3", "4"])
    assert components == {"math_answer": [1.0, 0.0], "answer_format": [1.0, 0.0]}
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
    assert components == {"test_rewards:named_parts/short": [1.0, 0.0], "test_rewards:named_parts/long": [0.0, 1.0]}
    assert total == [2.0, 2.0]
    with pytest.raises(CoatiUsageError, match="unknown reward function 'nope'"):
        WeightedReward.from_specs(["nope"])
    with pytest.raises(CoatiUsageError, match="cannot be imported"):
        WeightedReward.from_specs(["no_such_module:fn"])
