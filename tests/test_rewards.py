"""Rule-based verifiers: extraction, numeric equivalence, format, weighted combination."""
import pytest

from mindrlhf.configs import ConfigError
from mindrlhf.reward.verifiers import (RewardFn, accuracy_reward, answers_equal, extract_answer, format_reward,
                                       register_verifier)


@pytest.mark.parametrize("text,answer", [
    ("so the total is 18.\n#### 18", "18"),
    ("The answer is \\boxed{\\frac{7}{2}}.", "\\frac{7}{2}"),
    ("<think>2+2</think><answer>4</answer>", "4"),
    ("<answer>the result is \\boxed{12}</answer>", "12"),
    ("#### 3\nwait, recompute\n#### 5", "5"),
    ("no final answer here", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("pred,ref,ok", [
    ("1,234", "1234", True), ("$12.50", "12.5", True), ("\\frac{7}{2}", "3.5", True), ("7/2", "3.5", True),
    ("50%", "50", True), ("-3", "-3.0", True), ("18", "19", False), ("x+1", "x + 1", True), (None, "3", False),
])
def test_numeric_equivalence(pred, ref, ok):
    assert answers_equal(pred, ref) is ok


def test_accuracy_and_format_rewards():
    assert accuracy_reward("12 + 7 = 19\n#### 19", "19") == 1.0
    assert accuracy_reward("#### 20", "19") == 0.0
    assert format_reward("<think>a</think>\n<answer>3</answer>", "3") == 1.0
    assert format_reward("<answer>3</answer>", "3") == 0.0


def test_weighted_combination_and_user_verifier():
    @register_verifier("length_penalty_test")
    def short(completion, solution):
        return -0.1 * len(completion.split())

    fn = RewardFn(["accuracy_reward", "length_penalty_test"], [1.0, 0.5])
    total, parts = fn(["#### 4", "it is #### 5"], ["4", "4"])
    assert total == pytest.approx([1.0 - 0.05 * 2, 0.0 - 0.05 * 4])
    assert parts["accuracy_reward"] == [1.0, 0.0]
    with pytest.raises(ConfigError, match="unknown verifier 'nope'"):
        RewardFn(["nope"], [1.0])
    with pytest.raises(ConfigError, match="1 weights for 2"):
        RewardFn(["accuracy_reward", "format_reward"], [1.0])
