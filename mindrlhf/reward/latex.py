"""LaTeX answers judged by math-verify (its parse, then its verify), imported only when first needed.

math-verify is a dependency (setup.py), yet this module imports without it: a run whose answers are plain
numbers never needs it, and a missing package must not stop a run in the middle of a step (accuracy_reward
then compares such answers as text and counts them in `answer/latex_unjudged`).

Time limits: math-verify bounds parse and verify itself with signal.alarm and, when done, cancels the alarm
and restores the previous SIGALRM handler. Under RewardFn's timer (mindrlhf.reward.verifiers) that would
cancel our timer, so there its own limits are off (`timeout=None`) and ours bounds the whole call; called on
its own in the main thread it uses its own limits (OWN_TIMEOUT)."""
from __future__ import annotations

import logging
from typing import Optional

from mindrlhf.configs.errors import ConfigError

# An answer longer than this is not judged (no match): MATH's longest reference answers are ~160 characters,
# and a long junk answer would otherwise spend the whole time limit in the LaTeX parser.
MAX_LATEX_CHARS = 1000
OWN_TIMEOUT = 5            # seconds: math-verify's own limit per parse/compare when no timer of ours is armed

_module = None             # math_verify once imported; False when it is not installed


class _OurTimerBoundsIt(logging.Filter):
    """math-verify warns, once, that with its timeouts off the caller must bound the time: ours does."""

    def filter(self, record):
        return not str(record.msg).startswith("Timeout is disabled")


def math_verify():
    """The math_verify module, or None if it is not installed (looked up once)."""
    global _module
    if _module is None:
        try:
            import math_verify as module
        except ImportError:
            module = False
        else:
            for name in ("math_verify.parser", "math_verify.grader"):
                logging.getLogger(name).addFilter(_OurTimerBoundsIt())
        _module = module
    return _module or None


def available() -> bool:
    return math_verify() is not None


def prepare() -> bool:
    """Import math-verify and build its LaTeX parser now, outside any time limit (the first parse costs the
    most). True if it is installed; a broken install is a set-up error, not a stream of zero rewards."""
    module = math_verify()
    if module is None:
        return False
    try:
        parsed = module.parse("\\boxed{\\frac{1}{2}}", parsing_timeout=None, raise_on_error=True)
    except Exception as err:  # noqa: BLE001 - any failure here means every LaTeX answer would score 0
        raise ConfigError(f"math-verify is installed but cannot parse LaTeX ({type(err).__name__}: {err}); "
                          f"check its antlr4-python3-runtime version (pip install -U math-verify)") from None
    if not parsed:
        raise ConfigError("math-verify is installed but parses \\frac{1}{2} to nothing; reinstall it "
                          "(pip install -U math-verify)")
    return True


def latex_equal(predicted: str, reference: str, timeout: Optional[int]) -> bool:
    """math-verify's verdict on two final answers, each read as the content of a \\boxed{} (the reference
    as gold: verify is not symmetric). `timeout`: seconds for math-verify's own limits, None for none (the
    caller bounds the time)."""
    module = math_verify()
    if module is None:
        raise ImportError("judging LaTeX answers needs math-verify: pip install math-verify")
    if len(predicted) > MAX_LATEX_CHARS or len(reference) > MAX_LATEX_CHARS:
        return False
    gold = module.parse("\\boxed{" + reference + "}", parsing_timeout=timeout)
    guess = module.parse("\\boxed{" + predicted + "}", parsing_timeout=timeout)
    return bool(module.verify(gold, guess, timeout_seconds=timeout))
