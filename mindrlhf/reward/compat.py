"""Verifier names of MindSpeed-RL (mindspeed_rl/models/rule_verifier.py) and MindRLHF (mindrlhf/reward/), so a
`verifier_function` list written for either works here with the same scores and conditions.

One difference throughout: whether an answer is right is decided by math_equal (math-verify, as our
accuracy_reward), where those use Qwen2.5-Math's grader, mathruler's or Minerva's string normalisation.
Names whose meaning needs something we do not have are in UNAVAILABLE, and RewardFn refuses them by name.
"""
from __future__ import annotations

import re
from typing import Optional

from mindrlhf.reward.verifiers import (UNAVAILABLE, _boxed, format_reward, judges_latex, math_equal,
                                       register_verifier)

# Text after an end-of-text marker was never meant to be read (MindSpeed-RL cuts it before scoring).
_END_MARKERS = ("</s>", "<|im_end|>", "<|endoftext|>")


def _before_end_marker(text: str) -> str:
    cut = min((i for i in (text.find(m) for m in _END_MARKERS) if i >= 0), default=len(text))
    return text[:cut]


def _boxed_answer(text: str) -> Optional[str]:
    """The last \\boxed{} answer, None when there is none or it is empty."""
    answer = _boxed(text)
    return answer.strip() if answer is not None and answer.strip() else None


register_verifier("format")(format_reward)        # MindSpeed-RL's 'format' is MindRLHF's format_reward


@register_verifier("acc")
@judges_latex
def boxed_accuracy_with_penalties(completion: str, solution: str) -> float:
    """MindSpeed-RL's 'acc': 1 for a right \\boxed{} answer, -0.5 for a wrong one, -1 for none, so that
    answering in a box pays even when wrong. Text after an end-of-text marker does not count."""
    answer = _boxed_answer(_before_end_marker(completion))
    if answer is None:
        return -1.0
    return 1.0 if math_equal(answer, solution) else -0.5


@judges_latex
def boxed_accuracy(completion: str, solution: str) -> float:
    """1 if the last \\boxed{} answer is right, else 0: unlike accuracy_reward, no other answer form
    (<answer>, ####) counts."""
    answer = _boxed_answer(completion)
    return 1.0 if answer is not None and math_equal(answer, solution) else 0.0


for _name in ("math_17k_acc", "acc_for_ppo", "qwen_accuracy_reward"):
    register_verifier(_name)(boxed_accuracy)


def think_answer_boxed(text: str) -> bool:
    """The whole text is '<think>', ..., '</think>', ..., '<answer>', ..., '\\boxed{', ..., '}', ...,
    '</answer>' in that order: nothing before <think> or after </answer>. Each piece is taken at its first
    place after the previous one, which finds such an order whenever one exists."""
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return False
    at = len("<think>")
    for piece in ("</think>", "<answer>", "\\boxed{", "}"):
        at = text.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return at <= len(text) - len("</answer>")


@register_verifier("base_acc")
@judges_latex
def formatted_boxed_accuracy(completion: str, solution: str) -> float:
    """MindSpeed-RL's 'base_acc' and 'math_verify_reward': 1 if the completion has the R1 layout with the
    answer boxed inside <answer> (think_answer_boxed) and that boxed answer is right, else 0."""
    if not think_answer_boxed(completion):
        return 0.0
    answer = _boxed_answer(completion)
    return 1.0 if answer is not None and math_equal(answer, solution) else 0.0


register_verifier("math_verify_reward")(formatted_boxed_accuracy)

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_ONE_LINE_BOX_RE = re.compile(r"\\boxed\{[^\n]*?\}")


@register_verifier("strict_format")
def strict_format(completion: str, solution: str) -> float:
    """MindSpeed-RL's 'strict_format': 1 if the completion starts with <think> and ends with </answer>, holds
    each of the four tags once and one \\boxed{...} (closed on its line), in the order <think> </think>
    <answer> \\boxed </answer>; else -0.5."""
    if any(completion.count(tag) != 1 for tag in _TAGS):
        return -0.5
    boxes = [m.start() for m in _ONE_LINE_BOX_RE.finditer(completion)]
    think, think_end, answer, answer_end = (completion.find(tag) for tag in _TAGS)
    ordered = len(boxes) == 1 and think < think_end < answer < boxes[0] < answer_end
    return 1.0 if ordered and completion.startswith("<think>") and completion.endswith("</answer>") else -0.5


# 'Step 2:', a numbered item at the very start, a '-' or '*' bullet, or a transition word: as MindSpeed-RL's
# 'step' (open-r1's reasoning_steps) counts them.
_STEP_RE = re.compile(r"Step \d+:|\A\d+\.|\n[-*]|(?:First|Second|Next|Finally),")


@register_verifier("step")
def reasoning_steps(completion: str, solution: str) -> float:
    """MindSpeed-RL's 'step': a third for each sign of step-by-step reasoning (_STEP_RE), at most 1."""
    return min(1.0, len(_STEP_RE.findall(completion)) / 3)


register_verifier("reasoning_steps")(reasoning_steps)

_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
DAPO_TAIL_CHARS = 300      # DAPO reads only the end of a completion (MATH-500's longest answer: 159 characters)


@register_verifier("acc_for_dapo")
@judges_latex
def dapo_accuracy(completion: str, solution: str) -> float:
    """MindSpeed-RL's 'acc_for_dapo' (DAPO's reward): 1 if the last 'Answer: ...' line in the completion's
    last DAPO_TAIL_CHARS characters is right, else -1 (no such line included)."""
    lines = _ANSWER_LINE_RE.findall(completion[-DAPO_TAIL_CHARS:])
    if not lines:
        return -1.0
    line = lines[-1].strip()
    answer = _boxed_answer(line) or line.rstrip(".").strip().strip("$").strip()
    return 1.0 if math_equal(answer, solution) else -1.0


RETOOL_TAIL_CHARS = 100     # retool_reward's strict box: only the completion's last 100 characters are read


@register_verifier("retool_reward")
def retool_reward(completion: str, solution: str, tool_calls: int = 0) -> float:
    """MindSpeed-RL's multi-turn 'retool_reward': 1 if the last \\boxed{...} in the completion's last
    RETOOL_TAIL_CHARS characters holds exactly the solution's text (no normalisation: its strict box check),
    else -1 raised by 0.1 for each tool call of the episode, to at most 0 (trying the tool pays, never as much
    as a right answer)."""
    answer = _boxed(completion[-RETOOL_TAIL_CHARS:])
    if answer is not None and answer == solution:
        return 1.0
    return min(0.0, -1.0 + 0.1 * tool_calls)


UNAVAILABLE.update({
    "kk_reward": "MindRLHF's Knights-and-Knaves puzzle reward is not a math answer check; register it "
                 "yourself in a reward_module (docs/CONFIG.md, reward.reward_module)",
})
