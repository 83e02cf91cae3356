"""The reward model (models/reward_model.py): an HF sequence-classification folder scored as transformers
scores it, and refused where a causal LM is expected."""
import numpy as np
import pytest

from hf_reference import hf_scores, make_hf_classifier
from mindrlhf.checkpoint.model_io import load_weights
from mindrlhf.configs.errors import ConfigError
from mindrlhf.configs.compat.hf import classifier_config_from_hf, model_config_from_hf
from mindrlhf.models.reward_model import SequenceClassifier


def _batch(padding: str, seed: int = 0):
    """(ids, mask) (4, 14): real tokens 1..159 (never the pad id 0). "left": left-padded rows; "both": our
    sample rows, a left-padded prompt of 6 then a right-padded response of 8."""
    r = np.random.RandomState(seed)
    ids = np.zeros((4, 14), np.int64)
    mask = np.zeros((4, 14), np.int64)
    for i, (p, n) in enumerate([(6, 8), (3, 5), (1, 8), (4, 1)]):
        if padding == "left":
            mask[i, 14 - p - n:] = 1
        else:
            mask[i, 6 - p:6] = 1
            mask[i, 6:6 + n] = 1
    ids[mask == 1] = r.randint(1, 160, int(mask.sum()))
    return ids, mask


@pytest.mark.parametrize("qkv_bias", [True, False], ids=["qwen2", "llama"])
@pytest.mark.parametrize("padding", ["left", "both"])
def test_scores_equal_transformers(tmp_path, qkv_bias, padding):
    hf = make_hf_classifier(str(tmp_path), qkv_bias=qkv_bias)
    cfg, labels = classifier_config_from_hf(str(tmp_path))
    assert labels == 1 and cfg.qkv_has_bias == qkv_bias
    ours = SequenceClassifier(cfg, labels, random_init=False)
    load_weights(ours, str(tmp_path))
    ids, mask = _batch(padding)
    got, want = ours.score_rows(ids, mask), hf_scores(hf, ids, mask)
    assert got.shape == want.shape == (4, 1)
    assert np.abs(want).max() > 0.1          # the scores differ from zero: a wrong row or token would show
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_classifier_folder_is_refused_as_a_policy(tmp_path):
    make_hf_classifier(str(tmp_path), layers=1)
    with pytest.raises(ConfigError, match="Qwen2ForSequenceClassification is a sequence classifier .*"
                                          "reward.reward_model.*causal LM"):
        model_config_from_hf(str(tmp_path))


def test_a_reward_model_has_one_label(tmp_path):
    make_hf_classifier(str(tmp_path), layers=1, num_labels=2)
    assert classifier_config_from_hf(str(tmp_path))[1] == 2
