"""Rule-based rewards for math: answer extraction, numeric equivalence, format; combined by name.

A verifier is `fn(completion: str, solution: str) -> float`. Register your own with `@register_verifier`
and name it in `verifier_function` with a weight in `verifier_weight`.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Callable, Dict, Optional, Sequence

from mindrlhf.configs.errors import ConfigError

VERIFIERS: Dict[str, Callable[[str, str], float]] = {}


def register_verifier(name: str):
    def wrap(fn):
        VERIFIERS[name] = fn
        return fn
    return wrap


def _boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...}, with nested braces."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str) -> Optional[str]:
    """The final answer a completion commits to: \\boxed{} > <answer></answer> > '#### n' (last wins)."""
    boxed = _boxed(text)
    if boxed is not None:
        return boxed.strip()
    tags = re.findall(r"<answer>(.*?)</answer>", text, flags=re.S)
    if tags:
        inner = tags[-1]
        return (_boxed(inner) or inner).strip()
    hashes = re.findall(r"####\s*([^\n]+)", text)
    if hashes:
        return hashes[-1].strip()
    return None


def to_number(text: str) -> Optional[Fraction]:
    """Parse '1,234', '-3.50', '7/2', '$12', '\\frac{7}{2}', '50%' into an exact fraction; None if not numeric."""
    if text is None:
        return None
    s = text.strip().replace("$", "").replace("\\!", "").replace("\\,", "").rstrip(".").strip()
    s = re.sub(r"\\(?:text|mathrm)\{[^}]*\}", "", s).strip()
    frac = re.fullmatch(r"-?\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    if frac:
        try:
            sign = -1 if s.startswith("-") else 1
            return sign * Fraction(frac.group(1)) / Fraction(frac.group(2))
        except (ValueError, ZeroDivisionError):
            return None
    s = s.rstrip("%").replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_equal(predicted: Optional[str], reference: str) -> bool:
    if predicted is None:
        return False
    a, b = to_number(predicted), to_number(reference)
    if a is not None and b is not None:
        return a == b
    norm = lambda x: re.sub(r"\s+", "", x).strip().lower()  # noqa: E731
    return norm(predicted) == norm(reference)


@register_verifier("accuracy_reward")
def accuracy_reward(completion: str, solution: str) -> float:
    """1 if the extracted final answer equals the reference (numerically when both are numbers)."""
    return 1.0 if answers_equal(extract_answer(completion), solution) else 0.0


@register_verifier("format_reward")
def format_reward(completion: str, solution: str) -> float:
    """1 for '<think>...</think><answer>...</answer>' (R1 style), else 0."""
    return 1.0 if re.fullmatch(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", completion, flags=re.S) else 0.0


@register_verifier("answer_format_reward")
def answer_format_reward(completion: str, solution: str) -> float:
    """1 if the completion states a final answer in any recognised form (\\boxed, <answer>, ####)."""
    return 1.0 if extract_answer(completion) is not None else 0.0


class RewardFn:
    """Weighted sum of named verifiers; also reports each part (for metrics)."""

    def __init__(self, names: Sequence[str], weights: Sequence[float]):
        if len(names) != len(weights):
            raise ConfigError(f"verifier_weight: {len(weights)} weights for {len(names)} verifier_function entries")
        for n in names:
            if n not in VERIFIERS:
                raise ConfigError(f"verifier_function: unknown verifier {n!r}; known: {sorted(VERIFIERS)}")
        self.names, self.weights = list(names), [float(w) for w in weights]

    def __call__(self, completions: Sequence[str], solutions: Sequence[str]):
        parts = {n: [VERIFIERS[n](c, s) for c, s in zip(completions, solutions)] for n in self.names}
        total = [sum(w * parts[n][i] for n, w in zip(self.names, self.weights)) for i in range(len(completions))]
        return total, parts
