"""accuracy_reward on MATH-style answers: the same verdicts as math-verify called directly, bounded in time,
and a clear fallback when math-verify is missing."""
import random
import signal
import sys
import time
from fractions import Fraction

import pytest

from mindrlhf.configs import ConfigError
from mindrlhf.reward import latex
from mindrlhf.reward.verifiers import RewardFn, accuracy_reward, math_equal, quick_verdict, to_number

math_verify = pytest.importorskip("math_verify")

# (answer in \boxed{}, reference answer, math-verify's verdict): equivalent and not. The verdicts are math-verify
# 0.9.0's (setup.py pins it; latex2sympy2_extended 1.11.0, sympy 1.14.0), written out: a release that changes one
# changes a reward, and test_math_verify_gives_the_recorded_verdicts fails. A few are its own quirks, which we
# inherit on purpose (the comments say which).
GOLDEN = [
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
    ("\\dfrac12", "0.5", True),
    ("0.5", "\\frac{1}{2}", True),                                            # plain numbers: no sympy
    ("\\frac{1}{2}", "0.5", True),                                            # plain numbers
    ("\\dfrac{1}{4}", "\\tfrac14", True),
    ("\\frac{1}{2}", "\\frac{2}{3}", False),
    ("-\\frac{7}{2}", "-3.5", True),                                          # plain numbers
    ("1\\frac{1}{2}", "\\frac32", True),                                      # a mixed number
    ("0.333333", "\\frac13", True),                                           # 6 decimal places
    ("0.33", "\\frac13", False),
    ("1.0000004", "1", False),                                                # a decimal vs an integer
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", True),
    ("5\\sqrt{2}", "5\\sqrt{3}", False),
    ("\\frac{1+\\sqrt{5}}{2}", "\\frac{\\sqrt{5}+1}{2}", True),
    ("x \\in [0, 1)", "[0,1)", True),
    ("[0,1]", "[0,1)", False),
    ("(-\\infty, 2]", "x \\le 2", True),
    ("2 \\le x \\le 5", "[2,5]", False),                                      # a relation vs an interval
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("1, 2, 3", "\\{1,2,3\\}", True),
    ("-2, 3", "3, -2", True),
    ("1,2", "12", False),                                                     # two answers, not 12
    ("(1,2)", "(2,1)", False),                                                # an ordered pair
    ("(3, -1)", "(3,-1)", True),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{pmatrix}1&3\\\\2&4\\end{pmatrix}", False),
    ("x=3", "3", True),
    ("3", "x=3", True),
    ("y=2x+3", "2x+3", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+1", "(x+1)^2", False),
    ("\\sqrt{x}", "x^{1/2}", True),
    ("10\\text{ cm}", "10", True),                                            # units
    ("4\\text{ dollars}", "\\$4", True),
    ("\\$12.50", "12.5", True),
    ("5\\text{ and }6", "56", False),                                         # two answers
    ("\\text{(A)}", "A", True),
    ("\\text{north}", "\\text{south}", False),
    ("90^\\circ", "90", True),                                                # degrees
    ("\\frac{\\pi}{2}", "90^\\circ", False),
    ("30^{\\circ}", "\\frac{\\pi}{6}", False),
    ("50\\%", "0.5", True),                                                   # percentages
    ("50%", "50", True),
    ("\\frac{3}{4}", "75\\%", True),
    ("1.5\\times10^{3}", "1500", True),                                       # scientific notation
    ("6.02\\times 10^{23}", "6.02 \\cdot 10^{23}", True),
    ("10^{-3}", "0.001", True),
    ("1,234", "1234", True),                                                  # plain numbers
    ("10,\\!000", "10000", True),                                             # plain numbers
    ("18", "19", False),                                                      # plain numbers
    ("2 \\pi", "2\\pi", True),
    ("\\pi", "3.14", False),
    ("3+2i", "2i+3", True),
    ("\\log_2 8", "3", True),
    ("e^{i\\pi}", "-1", False),                                               # math-verify's reading
    ("\\infty", "\\infty", True),
    ("5 (or 4)", "4", True),                                                  # math-verify's reading
    # more of math-verify's readings, recorded as they are
    ("\\{1,2\\}", "(1,2)", True),                                             # a set equals a pair
    ("a=1, b=2", "(1,2)", True),
    ("\\text{B}", "(B)", True),
    ("1:2", "\\frac12", True),                                                # a ratio is a fraction
    ("\\binom{5}{2}", "10", True),
    ("\\sin^2 x+\\cos^2 x", "1", True),
    ("2x", "x2", True),
    ("x>2", "(2,\\infty)", False),                                            # a relation vs an interval
    ("i^2", "-1", False),                                                     # i stays a symbol
    ("\\overline{3}", "3", False),
    ("\\frac{\\sqrt{2}}{2}", "0.7071", False),                                # 4 decimals are not enough
    ("\\frac{22}{7}", "\\pi", False),
]
PAIRS = [(answer, reference) for answer, reference, _ in GOLDEN]

# Where we answer differently on purpose: plain numbers that math-verify does not read as numbers.
DIFFERENT = [
    ("1e5", "100000", True),       # math-verify: 1*e*5 (Euler's number)
    ("18.", "18", True),           # a sentence's full stop; math-verify: the string '18.'
    ("10\\,000", "10000", True),   # a thin-space thousands separator; math-verify: 10*0
]


def _completion(answer):
    return f"Adding the two cases gives the result.\nThe final answer is $\\boxed{{{answer}}}$."


def _direct(answer, reference):
    """math-verify on its own, as its documentation uses it: the reference parsed as gold."""
    return math_verify.verify(math_verify.parse("\\boxed{" + reference + "}"), math_verify.parse(_completion(answer)))


def test_math_verify_gives_the_recorded_verdicts():
    """The installed math-verify is the pinned one, and it gives every recorded verdict (all differences
    listed at once)."""
    import importlib.metadata
    import re
    with open(__file__.replace("tests/test_math_answers.py", "setup.py"), encoding="utf-8") as fh:
        pin = re.search(r'"math-verify==([0-9.]+)"', fh.read()).group(1)
    assert importlib.metadata.version("math-verify") == pin == "0.9.0"
    changed = [(a, r, want) for a, r, want in GOLDEN if _direct(a, r) is not want]
    assert not changed, f"math-verify's verdict changed (recorded verdict shown): {changed}"


@pytest.mark.parametrize("answer,reference,verdict", GOLDEN)
def test_accuracy_reward_judges_as_math_verify_does(answer, reference, verdict):
    assert accuracy_reward(_completion(answer), reference) == float(verdict)


def test_the_table_has_both_verdicts_and_plain_numbers_skip_sympy(monkeypatch):
    verdicts = [_direct(a, r) for a, r in PAIRS]
    assert len(PAIRS) >= 30 and 10 <= sum(verdicts) <= len(PAIRS) - 10
    monkeypatch.setattr(latex, "latex_equal", lambda *a: pytest.fail("LaTeX path for plain numbers"))
    for answer, reference in [("0.5", "\\frac{1}{2}"), ("1,234", "1234"), ("18", "19"), ("-\\frac{7}{2}", "-3.5"),
                              ("10\\text{ cm}", "10"), ("\\$12.50", "12.5")]:
        assert quick_verdict(answer, reference) is not None
        assert accuracy_reward(_completion(answer), reference) == float(_direct(answer, reference))


@pytest.mark.parametrize("answer,reference,ours", DIFFERENT)
def test_plain_numbers_math_verify_misreads(answer, reference, ours):
    assert math_equal(answer, reference) is ours
    assert _direct(answer, reference) is not ours


def _plain_number_text(rng):
    value = Fraction(rng.choice(["0", "1", "3", "12", "50", "1234", "1234567", "1/2", "1/3", "2/3", "7/2", "1/1000"]))
    sign = rng.choice(["", "", "-"])
    decimal = f"{float(value):.{rng.choice([1, 2, 6, 7])}f}"
    forms = [decimal, f"{value.numerator}/{value.denominator}", f"\\frac{{{value.numerator}}}{{{value.denominator}}}",
             f"\\dfrac{{{value.numerator}}}{{{value.denominator}}}", decimal + "\\text{ cm}", "\\$" + decimal]
    if value.denominator == 1:
        forms += [str(value.numerator), f"{value.numerator:,}", str(value.numerator) + ".0"]
    return sign + rng.choice(forms)


def test_plain_numbers_get_math_verify_verdicts_without_it():
    """Random pairs of plain numbers in the forms answers take: where the quick comparison decides, it
    decides as math-verify does (it leaves unequal decimals to math-verify: 6 decimal places)."""
    rng = random.Random(0)
    decided = 0
    for _ in range(600):
        answer, reference = _plain_number_text(rng), _plain_number_text(rng)
        if rng.random() < 0.3:
            reference = answer
        verdict = quick_verdict(answer, reference)
        if verdict is not None:
            decided += 1
            assert verdict is _direct(answer, reference), (answer, reference)
    assert decided > 300


def test_commas_separate_thousands_only():
    assert to_number("1,234,567") == 1234567 and to_number("-1,234.5") == -1234.5
    assert to_number("1,2") is None and to_number("12,34") is None


def test_time_per_call_on_the_table(capsys):
    """Time of accuracy_reward per completion on the table, as RewardFn calls it (under its timer)."""
    fn = RewardFn(["accuracy_reward"], [1.0], time_limit=5.0)
    completions, references = [_completion(a) for a, _ in PAIRS], [r for _, r in PAIRS]
    fn.score(completions, references)                     # sympy's caches warm, as in a run's later steps
    seconds = []
    for c, r in zip(completions, references):
        t0 = time.perf_counter()
        fn.score([c], [r])
        seconds.append(time.perf_counter() - t0)
    with capsys.disabled():
        print(f"\naccuracy_reward on {len(PAIRS)} pairs: mean {1000 * sum(seconds) / len(seconds):.1f} ms, "
              f"max {1000 * max(seconds):.1f} ms per call")
    assert max(seconds) < 5.0


@pytest.mark.parametrize("answer", ["10^{10^{10}}", "(10^{10})!", "(" * 300 + "1" + ")" * 300],
                         ids=["tower", "factorial", "300-parentheses"])
def test_a_pathological_answer_ends_at_our_time_limit(answer):
    """math-verify's own limits (5 s, signal.alarm) are off under our timer: the answer ends at ours (0.5 s),
    is counted as an error, the next completion is judged normally, and no alarm is left armed."""
    before = signal.getsignal(signal.SIGALRM)
    fn = RewardFn(["accuracy_reward"], [1.0], time_limit=0.5)
    t0 = time.perf_counter()
    scores = fn.score([_completion(answer), _completion("\\dfrac12")], ["1", "0.5"])
    assert time.perf_counter() - t0 < 2.5
    assert scores.parts["accuracy_reward"] == [0.0, 1.0] and scores.stats["reward/errors"] == 0.5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before


def test_called_on_its_own_math_verify_bounds_itself(monkeypatch):
    """Outside RewardFn (a user's script) math-verify's own limits apply."""
    monkeypatch.setattr(latex, "OWN_TIMEOUT", 1)
    t0 = time.perf_counter()
    assert accuracy_reward(_completion("10^{10^{10}}"), "1") == 0.0
    assert time.perf_counter() - t0 < 4.0


def test_without_math_verify_latex_answers_are_compared_as_text_and_counted(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)          # import math_verify now raises ImportError
    monkeypatch.setattr(latex, "_module", None)
    with pytest.warns(RuntimeWarning, match="math-verify is not installed"):
        fn = RewardFn(["accuracy_reward"], [1.0])
    scores = fn.score([_completion("\\dfrac12"), _completion("\\frac{1}{2}"), _completion("18"), "no answer"],
                      ["0.5", "\\frac{1}{2}", "18", "3"])
    assert scores.parts["accuracy_reward"] == [0.0, 1.0, 1.0, 0.0]
    assert scores.stats["answer/latex_unjudged"] == 0.25           # only \dfrac12 needed math-verify
    with pytest.raises(ImportError, match="pip install math-verify"):
        latex.latex_equal("\\dfrac12", "0.5", None)


def test_a_broken_math_verify_is_a_set_up_error(monkeypatch):
    """An install that cannot parse (an antlr4 runtime of another version) would score every LaTeX answer 0."""
    def broken(*args, **kwargs):
        raise RuntimeError("Could not deserialize ATN with version 3 (expected 4)")
    monkeypatch.setattr(math_verify, "parse", broken)
    with pytest.raises(ConfigError, match="math-verify is installed but cannot parse LaTeX .*ATN"):
        RewardFn(["accuracy_reward"], [1.0])
    RewardFn(["format_reward"], [1.0])                             # a run that never judges answers is fine
