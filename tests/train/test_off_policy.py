import math
import re

import pytest
import torch

from rllm_gym.train.off_policy import OffPolicyCorrection


def hand_built():
    """Two rows of three tokens; row 0's last token is an env token (mask 0). Log-ratios trained - behaviour:
    row 0: log 3, log 0.5, (masked); row 1: 0, log 1.5, log 1.5."""
    behaviour = torch.log(torch.tensor([[0.1, 0.4, 0.3], [0.2, 0.2, 0.2]]))  # (B, C)
    trained = torch.log(torch.tensor([[0.3, 0.2, 0.9], [0.2, 0.3, 0.3]]))  # (B, C)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return trained, behaviour, mask


def test_token_level_truncation_caps_each_tokens_ratio_and_reports_clipped_share_and_mismatch():
    trained, behaviour, mask = hand_built()
    weights, metrics = OffPolicyCorrection(cap=2.0, mode="truncate").weights(trained, behaviour, mask)
    expected = torch.tensor([[2.0, 0.5, 0.0], [1.0, 1.5, 1.5]])  # 3 -> 2 (capped); masked token -> 0
    assert torch.allclose(weights, expected, atol=1e-6)
    assert metrics["async/is_clipped"] == pytest.approx(1 / 5)  # one of five trained tokens above the cap
    mismatch = (math.log(3) + math.log(2) + 0 + 2 * math.log(1.5)) / 5
    assert metrics["async/mismatch"] == pytest.approx(mismatch, rel=1e-5)


def test_token_level_masking_zeroes_the_tokens_above_the_cap():
    trained, behaviour, mask = hand_built()
    weights, _ = OffPolicyCorrection(cap=2.0, mode="mask").weights(trained, behaviour, mask)
    assert torch.allclose(weights, torch.tensor([[0.0, 0.5, 0.0], [1.0, 1.5, 1.5]]), atol=1e-6)


def test_sequence_level_weights_use_the_rows_summed_log_ratio():
    trained, behaviour, mask = hand_built()
    weights, metrics = OffPolicyCorrection(cap=2.0, level="sequence", mode="truncate").weights(
        trained, behaviour, mask
    )
    # Row 0: 3 * 0.5 = 1.5 (under the cap); row 1: 1.5 * 1.5 = 2.25 -> 2.
    assert torch.allclose(weights, torch.tensor([[1.5, 1.5, 0.0], [2.0, 2.0, 2.0]]), atol=1e-5)
    assert metrics["async/is_clipped"] == pytest.approx(1 / 2)  # one row of two


def test_off_mode_weighs_nothing_but_still_measures():
    trained, behaviour, mask = hand_built()
    weights, metrics = OffPolicyCorrection(mode="off").weights(trained, behaviour, mask)
    assert torch.equal(weights, mask.float())
    assert metrics["async/mismatch"] > 0.3


def test_clip_mode_weighs_nothing_and_hands_the_loss_the_behaviour_log_probabilities_as_its_old_ones():
    trained, behaviour, mask = hand_built()
    correction = OffPolicyCorrection()
    assert correction.mode == "clip" and correction.in_the_loss
    weights, metrics = correction.weights(trained, behaviour, mask)
    assert torch.equal(weights, mask.float())
    assert metrics["async/is_clipped"] == pytest.approx(1 / 5)  # measured as in every mode
    behaviour[1, 2] = float("nan")  # a position with no value must not reach the loss as NaN
    mask[1, 2] = 0
    old = correction.old_logps(behaviour, mask)
    expected = torch.log(torch.tensor([[0.1, 0.4, 1.0], [0.2, 0.2, 1.0]]))  # log 1 = 0 off the mask
    assert torch.allclose(old, expected, atol=1e-6)
    # The loss's ratio is then pi_theta / pi_behaviour: row 0's first token (3x likelier than when sampled) is past
    # GRPO's clip for a positive advantage and trains nothing; its second (half as likely) still trains.
    logps = trained.clone().requires_grad_(True)
    ratio = torch.exp(logps - old)
    advantages = torch.ones(2, 1)
    loss = (-torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages) * mask).sum()
    loss.backward()
    assert logps.grad[0, 0] == 0 and logps.grad[0, 1] < 0


def test_weighted_advantages_are_the_advantages_times_the_weights_per_token():
    trained, behaviour, mask = hand_built()
    advantages, _ = OffPolicyCorrection(cap=2.0, mode="truncate").weigh_advantages(
        torch.tensor([1.0, -2.0]), trained, behaviour, mask
    )
    assert torch.allclose(advantages, torch.tensor([[2.0, 0.5, 0.0], [-2.0, -3.0, -3.0]]), atol=1e-6)
    per_token = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, -1.0]])
    advantages, _ = OffPolicyCorrection(cap=2.0, mode="truncate").weigh_advantages(per_token, trained, behaviour, mask)
    assert torch.allclose(advantages, torch.tensor([[2.0, 1.0, 0.0], [1.0, 1.5, -1.5]]), atol=1e-6)


def test_the_grpo_loss_with_weighted_advantages_is_the_loss_times_the_weights():
    # What folding the weights into the advantages relies on: -min(r A, clip(r) A) is linear in A for A * w, w >= 0.
    ratio = torch.tensor([0.5, 0.9, 1.1, 1.5])
    advantages = torch.tensor([1.0, -1.0, 2.0, -0.5])
    weights = torch.tensor([0.0, 0.7, 2.0, 1.3])

    def loss(a):
        return -torch.min(ratio * a, ratio.clamp(0.8, 1.2) * a)

    assert torch.allclose(loss(advantages * weights), loss(advantages) * weights)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cap": 1.0}, "OffPolicyCorrection(cap=...) must be > 1, got 1.0"),
        ({"level": "row"}, "OffPolicyCorrection(level=...) must be one of token, sequence, got 'row'"),
        ({"mode": "ppo"}, "OffPolicyCorrection(mode=...) must be one of clip, truncate, mask, off, got 'ppo'"),
        ({"level": "sequence"}, "OffPolicyCorrection(level=...) applies to the truncate and mask modes"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OffPolicyCorrection(**kwargs)
