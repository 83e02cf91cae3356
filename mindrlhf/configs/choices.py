"""Names a config may choose from, in one place: the config's choices and the registries that implement
them (trainer/grpo_math.py, parallel/reshard.py, rollout/backends.py) both read these."""

ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
KL_ESTIMATORS = ("k1", "k2", "k3")
POLICY_LOSSES = ("vanilla", "gspo", "cispo", "kl_cov", "clip_cov")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
RESHARD_TRANSPORTS = ("auto", "shm", "collective")
ROLLOUT_BACKENDS = ("mindspore", "vllm_mindspore")
LR_SCHEDULES = ("cosine", "constant", "mindrlhf_cosine", "mindrlhf_polynomial", "megatron_constant", "megatron_linear",
                "megatron_cosine")
CHECKPOINT_STORAGE = ("shared", "node_local")
ROUTER_REPLAY = ("none", "r2", "r3")
