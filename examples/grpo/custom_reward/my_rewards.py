"""Your own verifiers, without a wrapper script:

    python examples/grpo/qwen_grpo_tutorial/grpo_one_stage.py ... \
        --reward_module examples/grpo/custom_reward/my_rewards.py \
        --verifier_function accuracy_reward,concise_answer --verifier_weight 1.0,0.2

`reward_module` takes a .py file or an importable module name; each `@register_verifier` function becomes a
name for `verifier_function`. A verifier gets one completion (decoded text) and its reference solution and
returns a float; it runs under `reward.verifier_timeout`, and one that raises scores 0 (counted in
`reward/errors`).
"""
from mindrlhf.reward.verifiers import extract_answer, register_verifier


@register_verifier("concise_answer")
def concise_answer(completion: str, solution: str) -> float:
    """1 for a stated final answer within 200 characters, falling to 0 at 600: rewards getting to the point."""
    if extract_answer(completion) is None:
        return 0.0
    return max(0.0, min(1.0, (600 - len(completion)) / 400))
