"""Rule-based rewards for math: answer extraction, answer equivalence, format; combined by name.

Answers are judged as math-verify judges them (mindrlhf.reward.latex): \\frac{\\sqrt3}{2}, x \\in [0,1),
\\dfrac12 = 0.5, units and \\text{}; two plain numbers are compared here without it (most answers, and no
sympy). mindrlhf.reward.compat adds MindSpeed-RL's and MindRLHF's verifier names.

A verifier is `fn(completion: str, solution: str) -> float`. Register your own with `@register_verifier`
in a module of yours, name that module in `reward_module` (a dotted name or a .py file) and the verifier in
`verifier_function` with a weight in `verifier_weight`.
"""
from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from mindrlhf.configs.errors import ConfigError
from mindrlhf.reward import latex

VERIFIERS: Dict[str, Callable[[str, str], float]] = {}
UNAVAILABLE: Dict[str, str] = {}    # names other frameworks use that we cannot honour -> why


_LOADING: List[List[str]] = []      # names registered while load_reward_module imports a module


def register_verifier(name: str):
    """`fn(completion, solution) -> float`; a verifier with a third parameter named `tool_calls` is also given
    the episode's tool-call count (0 for a single-turn sample), as MindSpeed-RL's retool_reward reads it."""
    def wrap(fn):
        VERIFIERS[name] = fn
        for names in _LOADING:
            names.append(name)
        return fn
    return wrap


def load_reward_module(spec: str) -> List[str]:
    """Import a user's verifiers: `spec` is a .py file or an importable dotted module name whose
    `@register_verifier` functions register on import. Returns the names it registered."""
    import importlib
    import importlib.util
    import os
    if not spec:
        return []
    added: List[str] = []
    _LOADING.append(added)
    try:
        if spec.endswith(".py") or os.sep in spec:
            if not os.path.isfile(spec):
                raise ConfigError(f"reward.reward_module: no such file: {spec}")
            name = "mindrlhf_reward_module_" + os.path.splitext(os.path.basename(spec))[0]
            module_spec = importlib.util.spec_from_file_location(name, spec)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's module: any failure is a set-up error naming it
        raise ConfigError(f"reward.reward_module {spec}: importing it failed: {type(err).__name__}: {err}") from None
    finally:
        _LOADING.remove(added)
    if not added and not spec.endswith(".py") and sys.modules.get(spec) is not None:
        added = [n for n, fn in VERIFIERS.items() if getattr(fn, "__module__", "") == spec]   # imported before
    if not added:
        raise ConfigError(f"reward.reward_module {spec}: registers no verifier (decorate each with "
                          f"@register_verifier(\"name\") from mindrlhf.reward.verifiers)")
    return sorted(set(added))


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
    close = text.rfind("</answer>")            # the last tag pair, by two linear scans (a regex over
    start = text.rfind("<answer>", 0, close)   # repeated unclosed tags is quadratic)
    if close >= 0 and start >= 0:
        inner = text[start + len("<answer>"):close]
        return (_boxed(inner) or inner).strip()
    hashes = re.findall(r"####\s*([^\n]+)", text)
    if hashes:
        return hashes[-1].strip()
    return None


# What a number may look like before Fraction() sees it: Fraction("1e999999999") builds a billion-digit
# integer (minutes, while every other rank waits), so exponents and lengths are bounded first.
_DECIMAL = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?"
_NUMBER_RE = re.compile(rf"{_DECIMAL}(?:/{_DECIMAL})?")
MAX_NUMBER_CHARS = 64


def _fraction(s: str) -> Optional[Fraction]:
    if len(s) > MAX_NUMBER_CHARS or not _NUMBER_RE.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


_UNITS_RE = re.compile(r"(?:\\(?:text|mathrm)\{[^{}]*\}\s*)+$")     # trailing units: '10\\text{ cm}'
_GROUPED_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def to_number(text: str) -> Optional[Fraction]:
    """Parse '1,234', '-3.50', '7/2', '$12', '\\frac{7}{2}', '50%' into an exact fraction; None if not
    numeric (or longer than MAX_NUMBER_CHARS, or with an exponent beyond 3 digits). A comma is read only as a
    thousands separator: '1,2' is a list of two answers, not 12."""
    if text is None or len(text) > 4 * MAX_NUMBER_CHARS:
        return None
    s = text.strip().replace("\\$", "").replace("$", "").replace("\\!", "").replace("\\,", "").rstrip(".").strip()
    s = _UNITS_RE.sub("", s).strip()
    frac = re.fullmatch(r"-?\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}", s)
    if frac:
        num, den = _fraction(frac.group(1)), _fraction(frac.group(2))
        if num is None or den is None or den == 0:
            return None
        sign = -1 if s.startswith("-") else 1
        return sign * num / den
    s = s.rstrip("%")
    if "," in s and not _GROUPED_RE.fullmatch(s):
        return None
    return _fraction(s.replace(",", ""))


_LAST_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> Optional[str]:
    """The flexible extraction: the last number anywhere in the text (GSM8K's 'flexible-extract')."""
    found = _LAST_NUMBER_RE.findall(text)
    return found[-1].rstrip(",") if found else None


def answers_equal(predicted: Optional[str], reference: str) -> bool:
    """Numerically when both parse as numbers, else as text without white space. An empty answer or an
    empty reference never matches (a row with no reference answer must not reward an empty \\boxed{})."""
    if predicted is None or not predicted.strip() or not str(reference).strip():
        return False
    a, b = to_number(predicted), to_number(reference)
    if a is not None and b is not None:
        return a == b
    norm = lambda x: re.sub(r"\s+", "", x).strip().lower()  # noqa: E731
    return norm(predicted) == norm(reference)


# A number too long or with too large an exponent for Fraction (to_number refuses it) still looks like this.
_NUMBER_SHAPE_RE = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_DECIMAL_RE = re.compile(r"\.\d|\d[eE][+-]?\d")


def _plain_number(text: str):
    """(value, written with a decimal point or exponent) for a plain number ('1,234', '-3.50', '7/2', '$12',
    '\\frac{7}{2}', '10\\text{ cm}'); 'huge' for a number too large to evaluate; None for anything else.
    A percentage is not plain: math-verify reads '50%' as both 50 and 0.5."""
    if "%" in text:
        return None
    value = to_number(text)
    if value is not None:
        return value, bool(_DECIMAL_RE.search(text))
    return "huge" if _NUMBER_SHAPE_RE.fullmatch(text.strip().rstrip(".")) else None


def quick_verdict(predicted: Optional[str], reference: str) -> Optional[bool]:
    """The verdict when it needs no LaTeX parsing, else None. Empty answers never match; equal texts match;
    two plain numbers match when equal, and do not when unequal and neither is written as a decimal (a
    decimal may equal a fraction to math-verify's 6 places: 0.333333 = 1/3, so that case goes on to it)."""
    if predicted is None or not predicted.strip() or not str(reference).strip():
        return False
    pred, ref = predicted.strip(), str(reference).strip()
    if pred == ref:
        return True
    a, b = _plain_number(pred), _plain_number(ref)
    if a is None or b is None:
        return None
    if a == "huge" or b == "huge":
        return False
    if a[0] == b[0]:
        return True
    return None if a[1] or b[1] else False


def math_equal(predicted: Optional[str], reference: str) -> bool:
    """Is `predicted` the reference answer? Plain numbers are compared here (quick_verdict); anything else
    as math-verify judges it (parse, then verify with the reference as gold), or, without math-verify
    installed, as answers_equal does (counted in answer/latex_unjudged by RewardFn)."""
    verdict = quick_verdict(predicted, reference)
    if verdict is not None:
        return verdict
    if not latex.available():
        return answers_equal(predicted, reference)
    own = latex.OWN_TIMEOUT if _own_timer_usable() and not _TIMER_ARMED[0] else None
    return latex.latex_equal(predicted.strip(), str(reference).strip(), own)


def _own_timer_usable() -> bool:
    """math-verify's own limits use signal.alarm: only in the main thread of a Unix process."""
    return hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()


def judges_latex(fn):
    """Mark a verifier that calls math_equal: RewardFn loads math-verify for it before any time limit runs."""
    fn.judges_latex = True
    return fn


@register_verifier("accuracy_reward")
@judges_latex
def accuracy_reward(completion: str, solution: str) -> float:
    """1 if the final answer (\\boxed{} > <answer></answer> > '#### n') is the reference (math_equal)."""
    return 1.0 if math_equal(extract_answer(completion), solution) else 0.0


def r1_format(text: str) -> bool:
    """'<think>...</think>', white space, then '<answer>...</answer>' ending a line, from the first character:
    the R1 format as MindRLHF's format_reward and MindSpeed-RL's format check it (more lines may follow the
    answer's). By scans that each visit a character once: a regex over repeated tags backtracks."""
    if not text.startswith("<think>"):
        return False
    close, answer = text.find("</think>", len("<think>")), -1
    while close >= 0 and answer < 0:
        after = close + len("</think>")
        while after < len(text) and text[after].isspace():
            after += 1
        if text.startswith("<answer>", after):
            answer = after
        close = text.find("</think>", close + 1)
    end = text.find("</answer>", answer + len("<answer>")) if answer >= 0 else -1
    while end >= 0:
        if text.startswith("\n", end + len("</answer>")) or end + len("</answer>") == len(text):
            return True
        end = text.find("</answer>", end + 1)
    return False


@register_verifier("format_reward")
def format_reward(completion: str, solution: str) -> float:
    """1 for the R1 format '<think>...</think> <answer>...</answer>' (r1_format), else 0."""
    return 1.0 if r1_format(completion) else 0.0


@register_verifier("answer_format_reward")
def answer_format_reward(completion: str, solution: str) -> float:
    """1 if the completion states a final answer in any recognised form (\\boxed, <answer>, ####)."""
    return 1.0 if extract_answer(completion) is not None else 0.0


@dataclass
class Scores:
    total: List[float]                 # weighted reward per completion
    parts: Dict[str, List[float]]      # each verifier's value per completion
    stats: Dict[str, float]            # shares over the batch (see RewardFn.score)


def merge_scores(scores: List[Scores], rows: Sequence[int]) -> Scores:
    """Several batches' scores as one: totals and parts of the concatenated batch at `rows`; the stats
    (shares) over every completion of every batch, weighted by batch size."""
    sizes = [len(s.total) for s in scores]
    total = [t for s in scores for t in s.total]
    parts = {name: [v for s in scores for v in s.parts[name]] for name in scores[0].parts}
    stats = {k: float(sum(s.stats[k] * n for s, n in zip(scores, sizes)) / max(sum(sizes), 1))
             for k in scores[0].stats}
    return Scores([total[i] for i in rows], {k: [v[i] for i in rows] for k, v in parts.items()}, stats)


class RewardFn:
    """Weighted sum of named verifiers; also reports each part (for metrics).

    A verifier that raises, or runs longer than `time_limit` seconds on one completion (checked with a
    timer signal where one is available: the main thread on Unix), scores 0 for that completion and is
    counted in `reward/errors`: a bad completion never stops or stalls the run."""

    def __init__(self, names: Sequence[str], weights: Sequence[float], time_limit: float = 5.0):
        if len(names) != len(weights):
            raise ConfigError(f"verifier_weight: {len(weights)} weights for {len(names)} verifier_function entries")
        for n in names:
            if n in UNAVAILABLE and n not in VERIFIERS:
                raise ConfigError(f"verifier_function: {n!r} cannot be used here: {UNAVAILABLE[n]}")
            if n not in VERIFIERS:
                raise ConfigError(f"verifier_function: unknown verifier {n!r}; known: {sorted(VERIFIERS)}")
        self.names, self.weights = list(names), [float(w) for w in weights]
        self.time_limit = time_limit
        # loaded now, outside any time limit: importing sympy and building the LaTeX parser take seconds
        self.judges_latex = any(getattr(VERIFIERS[n], "judges_latex", False) for n in self.names)
        if self.judges_latex and not latex.prepare():
            warnings.warn("math-verify is not installed: answers that are not plain numbers are compared as text "
                          "(counted in answer/latex_unjudged); pip install math-verify", RuntimeWarning, stacklevel=2)

    def __call__(self, completions: Sequence[str], solutions: Sequence[str]):
        scores = self.score(completions, solutions)
        return scores.total, scores.parts

    # per-completion flags behind the batch statistics, as columns after the total and the verifiers' parts
    FLAGS = ("reward/errors", "answer/missing", "answer/strict_flexible_disagree", "answer/latex_unjudged")

    @property
    def columns(self) -> int:
        return 1 + len(self.names) + len(self.FLAGS)

    def score_rows(self, completions: Sequence[str], solutions: Sequence[str],
                   tool_calls: Optional[Sequence[int]] = None) -> np.ndarray:
        """(n, columns) float32: per completion the weighted reward, each verifier's value, and the flags
        `reward/errors` (share of verifier calls that raised or overran), `answer/missing` (no final answer
        in a recognised form), `answer/strict_flexible_disagree` (the strict answer (boxed, <answer>, ####)
        and the last number in the text differ in correctness; the strict one judged by accuracy_reward when
        it is configured), `answer/latex_unjudged` (a verifier needed math-verify for this answer and it is
        not installed). Rows of a table are independent, so ranks can each score a share of a batch and add
        their tables (the trainer does). `tool_calls`: each completion's episode tool calls (default none), for the
        verifiers that read them (register_verifier)."""
        table = np.zeros((len(completions), self.columns), np.float32)
        parts = np.zeros((len(completions), len(self.names)))        # float64 until the weighted sum
        errors = np.zeros(len(completions))
        for k, n in enumerate(self.names):
            values = score_each(VERIFIERS[n], completions, solutions, self.time_limit, tool_calls)
            errors += [v is None for v in values]
            parts[:, k] = [0.0 if v is None else float(v) for v in values]
        table[:, 0] = [sum(w * float(v) for w, v in zip(self.weights, row)) for row in parts]
        table[:, 1:1 + len(self.names)] = parts
        # our own extractions are bounded (linear scans, bounded numbers): no timer needed
        strict = [extract_answer(c) for c in completions]
        flags = table[:, 1 + len(self.names):]
        flags[:, 0] = errors / max(len(self.names), 1)
        flags[:, 1] = [a is None for a in strict]
        if "accuracy_reward" in self.names:      # already judged, within the time limit
            strict_right = parts[:, self.names.index("accuracy_reward")] > 0
        else:
            strict_right = [answers_equal(a, s) for a, s in zip(strict, solutions)]
        flags[:, 2] = [bool(ok) != answers_equal(last_number(c), s)
                       for ok, c, s in zip(strict_right, completions, solutions)]
        if self.judges_latex and not latex.available():
            flags[:, 3] = [a is not None and quick_verdict(a, s) is None for a, s in zip(strict, solutions)]
        return table

    def scores_of(self, table: np.ndarray) -> Scores:
        """The Scores of a (n, columns) table from score_rows: statistics are means over its rows."""
        parts = {n: table[:, 1 + k].tolist() for k, n in enumerate(self.names)}
        flags = table[:, 1 + len(self.names):]
        stats = {f: float(flags[:, j].mean()) if len(table) else 0.0 for j, f in enumerate(self.FLAGS)}
        return Scores(table[:, 0].tolist(), parts, stats)

    def score(self, completions: Sequence[str], solutions: Sequence[str]) -> Scores:
        """Rewards plus the shares a reader needs to tell format learning from real learning (score_rows)."""
        return self.scores_of(self.score_rows(completions, solutions))


def score_each(fn, completions: Sequence[str], solutions: Sequence[str], time_limit: float,
               tool_calls: Optional[Sequence[int]] = None) -> List[Optional[float]]:
    """fn(completion, solution) for each pair (and the tool-call count, for a verifier that takes it), None
    where it raised or ran past `time_limit` seconds."""
    with _time_limits(time_limit) as call:
        if not takes_tool_calls(fn):
            return [call(fn, c, s) for c, s in zip(completions, solutions)]
        counts = [0] * len(completions) if tool_calls is None else [int(n) for n in tool_calls]
        return [call(fn, c, s, n) for c, s, n in zip(completions, solutions, counts)]


def takes_tool_calls(fn) -> bool:
    """Whether a verifier's third parameter is `tool_calls` (register_verifier)."""
    import inspect
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) >= 3 and params[2] == "tool_calls"


class _Overrun(BaseException):
    """Not an Exception: library code that catches Exception (math-verify, sympy) must not swallow it."""


_TIMER_ARMED = [False]     # a verifier call is running under our timer (math_equal then turns math-verify's off)


@contextlib.contextmanager
def _time_limits(limit: float):
    """Yields call(fn, *args) -> fn(*args), or None if it raised or ran past `limit` seconds. The SIGALRM
    handler is installed once for the batch; each call only arms and disarms the timer. Without a usable
    timer (not the main thread, no setitimer) calls run unbounded but failures still score None."""
    timed = limit > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    previous = None
    if timed:
        def on_alarm(signum, frame):
            raise _Overrun()
        previous = signal.signal(signal.SIGALRM, on_alarm)

    def call(fn, *args):
        try:
            try:
                if timed:
                    _TIMER_ARMED[0] = True
                    signal.setitimer(signal.ITIMER_REAL, limit)
                return fn(*args)
            finally:                  # an alarm landing here (limit reached as fn returned) is caught below
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    _TIMER_ARMED[0] = False
        except (Exception, _Overrun):  # noqa: BLE001 - a verifier's failure is a score of 0, counted, never a crash
            if timed:
                _TIMER_ARMED[0] = False
            return None

    try:
        yield call
    finally:
        if timed:
            signal.signal(signal.SIGALRM, previous)
