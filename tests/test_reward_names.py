"""MindSpeed-RL's and MindRLHF's verifier names: the scores and conditions their rule verifiers give."""
import random
import re
import time

import numpy as np
import pytest

from mindrlhf.configs import ConfigError
from mindrlhf.reward.compat import think_answer_boxed
from mindrlhf.reward.verifiers import VERIFIERS, RewardFn, r1_format

R1 = "<think>\nhalf of one\n</think>\n<answer>\nIt is $\\boxed{\\dfrac12}$.\n</answer>"


def score(name, completion, solution="0.5"):
    return VERIFIERS[name](completion, solution)


def test_every_name_of_both_frameworks_is_registered():
    mindspeed = {"acc", "format", "step", "strict_format", "base_acc", "math_17k_acc", "acc_for_dapo", "acc_for_ppo",
                 "math_verify_reward"}
    mindrlhf = {"accuracy_reward", "format_reward", "qwen_accuracy_reward"}
    assert mindspeed | mindrlhf | {"reasoning_steps"} <= set(VERIFIERS)


@pytest.mark.parametrize("name,why", [("kk_reward", "Knights-and-Knaves")])
def test_names_we_cannot_honour_are_refused_by_name(name, why):
    with pytest.raises(ConfigError, match=f"'{name}' cannot be used here: .*{why}"):
        RewardFn(["accuracy_reward", name], [1.0, 1.0])


def test_retool_reward_is_mindspeeds_strict_box_with_a_tool_call_bonus():
    """MindSpeed-RL's retool_reward (models/rule_verifier.py over math_dapo.compute_score, strict_box_verify):
    the last \\boxed{} of the last 100 characters must hold the label's exact text; a miss scores -1 + 0.1 per
    tool call, capped at 0. The count reaches it through RewardFn.score_rows; other verifiers never see it."""
    from mindrlhf.reward.compat import retool_reward
    assert retool_reward("so \\boxed{42}", "42") == 1.0
    assert retool_reward("so \\boxed{42.0}", "42") == -1.0                  # no normalisation: strict
    assert retool_reward("\\boxed{42}" + "x" * 100, "42") == -1.0          # outside the last 100 characters
    assert retool_reward("\\boxed{41} then \\boxed{42}", "42") == 1.0     # the last box counts
    assert retool_reward("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}") == 1.0   # nested braces
    assert retool_reward("no box", "42", 3) == pytest.approx(-0.7) and retool_reward("no box", "42", 20) == 0.0
    assert retool_reward("\\boxed{42}", "42", 5) == 1.0                     # the bonus only lifts a miss
    fn = RewardFn(["retool_reward", "accuracy_reward"], [1.0, 0.0])
    table = fn.score_rows(["no box", "no box", "#### 42"], ["42", "42", "42"], [0, 4, 2])
    np.testing.assert_allclose(table[:, 1], [-1.0, -0.6, -0.8], atol=1e-6)
    np.testing.assert_allclose(table[:, 2], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(fn.score_rows(["no box"], ["42"])[:, 1], [-1.0])   # single-turn: no calls


def test_acc_rewards_a_box_and_penalises_its_absence():
    assert score("acc", "so \\boxed{\\frac{1}{2}}") == 1.0
    assert score("acc", "so \\boxed{0.4}") == -0.5
    assert score("acc", "so 0.5") == -1.0 and score("acc", "so \\boxed{ }") == -1.0
    assert score("acc", "\\boxed{0.4}<|im_end|>\\boxed{0.5}") == -0.5        # after the end marker: unread


@pytest.mark.parametrize("name", ["math_17k_acc", "acc_for_ppo", "qwen_accuracy_reward"])
def test_boxed_accuracy_reads_only_the_last_box(name):
    assert score(name, "\\boxed{0.4} no, \\boxed{1/2}") == 1.0
    assert score(name, "\\boxed{1/2} no, \\boxed{0.4}") == 0.0
    assert score(name, "<answer>0.5</answer>") == 0.0 and score(name, "#### 0.5") == 0.0


@pytest.mark.parametrize("name", ["base_acc", "math_verify_reward"])
def test_base_acc_needs_the_layout_and_the_right_boxed_answer(name):
    assert score(name, R1) == 1.0
    assert score(name, R1, "0.4") == 0.0
    assert score(name, " " + R1) == 0.0 and score(name, R1 + "\n") == 0.0    # nothing before or after
    assert score(name, R1.replace("\\boxed{\\dfrac12}", "\\dfrac12")) == 0.0     # right, but not boxed
    assert score(name, "<think>x</think><answer>\\boxed{0.5}</answer>") == 1.0
    assert score(name, "<think>x</think>\\boxed{0.5}<answer></answer>") == 0.0  # box outside <answer>


def test_strict_format():
    assert score("strict_format", R1) == 1.0
    assert score("strict_format", R1 + " ") == -0.5                           # must end with </answer>
    assert score("strict_format", R1.replace("$.", "$ or $\\boxed{1}$.")) == -0.5   # two boxes
    assert score("strict_format", R1.replace("\\boxed{\\dfrac12}", "\\boxed{\\dfrac12\n}")) == -0.5  # box spans lines
    assert score("strict_format", "<think>a<think>b</think><answer>\\boxed{1}</answer>") == -0.5   # two <think>
    assert score("strict_format", "<think>a</think>\\boxed{1}<answer>b</answer>") == -0.5       # box outside


def test_step_counts_a_third_per_sign_of_steps():
    for name in ("step", "reasoning_steps"):
        assert score(name, "Step 1: add. Step 2: halve.") == pytest.approx(2 / 3)
        assert score(name, "1. add\n- halve\n* check\nFinally, done") == 1.0
        assert score(name, "we add 1. then 2. then") == 0.0                   # numbered items count at the start only


def test_acc_for_dapo_reads_the_last_answer_line_near_the_end():
    assert score("acc_for_dapo", "work\nAnswer: $\\frac{1}{2}$") == 1.0
    assert score("acc_for_dapo", "answer: 0.4\nANSWER : 1/2.") == 1.0
    assert score("acc_for_dapo", "Answer: 0.4") == -1.0 and score("acc_for_dapo", "\\boxed{0.5}") == -1.0
    assert score("acc_for_dapo", "Answer: 0.5\n" + "x" * 400) == -1.0        # beyond the last 300 characters


def _near_r1(rng):
    """R1-shaped text with pieces dropped, repeated and inserted at random: near the pattern's edges."""
    pieces = ["<think>", "x", "</think>", rng.choice(["", " ", "\n", "\n\n"]), "<answer>", "y", "\\boxed{", "z", "}",
              "</answer>", rng.choice(["", "\n", " ", "\nmore", "x"])]
    extra = ["<think>", "</think>", "<answer>", "</answer>", "\\boxed{", "}", " ", "\n", "w"]
    for _ in range(rng.randrange(4)):
        k = rng.randrange(len(pieces))
        action = rng.randrange(3)
        if action == 0:
            del pieces[k]
        elif action == 1:
            pieces.insert(k, pieces[k])
        else:
            pieces.insert(k, rng.choice(extra))
    return "".join(pieces)


def test_r1_format_is_the_format_of_both_frameworks():
    """Their check is re.match('^<think>.*?</think>\\s*<answer>.*?</answer>$', DOTALL | MULTILINE); ours scans
    instead (linear) and must agree on every text."""
    spec = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.S | re.M)
    rng = random.Random(0)
    texts = [R1, R1 + "\nmore", R1 + " more", " " + R1, "<answer>3</answer>"]
    texts += [_near_r1(rng) for _ in range(4000)]
    assert 500 < sum(bool(spec.match(t)) for t in texts) < 3500
    for t in texts:
        assert r1_format(t) is bool(spec.match(t)), repr(t)
        assert score("format", t) == score("format_reward", t) == float(bool(spec.match(t)))


def test_the_base_acc_layout_matches_its_pattern():
    spec = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.S)
    rng = random.Random(1)
    texts = [R1] + [_near_r1(rng) for _ in range(4000)]
    assert sum(bool(spec.fullmatch(t)) for t in texts) > 500
    for t in texts:
        assert think_answer_boxed(t) is bool(spec.fullmatch(t)), repr(t)


def test_format_checks_are_linear_in_the_completion():
    texts = ["<think>" + "</think> <answer>" * 20000, "<think>" + "</think>" * 40000 + "x",
             "<think>" + "</answer>x" * 20000]
    t0 = time.perf_counter()
    for t in texts:
        assert not r1_format(t) and not think_answer_boxed(t)
        assert score("strict_format", t) == -0.5
    assert time.perf_counter() - t0 < 0.5
