"""The off-policy correction of asynchronous GRPO (``max_staleness >= 1``): importance weights between the policy
being trained and the behaviour policy that sampled the rows, truncated or masked at a cap.

A row sampled by weights some versions older than the ones it trains on is off-policy. GRPO's ratio clipping is
measured against the weights at the start of the step (TRL's ``old_per_token_logps``), so on its own it does not see
that gap; :class:`OffPolicyCorrection` weighs each token (or each row) by ``w = pi_theta / pi_behaviour``, computed
from the behaviour log-probabilities the batch carries, capped: ``min(w, cap)`` (``truncate``, truncated importance
sampling as in IMPALA/V-trace and TRL's vLLM correction) or ``0`` above the cap (``mask``). The same modes and the
same formula as TRL 1.16's ``vllm_importance_sampling_correction`` (token: per-token log-ratio; sequence: the sum of
a row's log-ratios), which TRL applies with vLLM only: the trainer's adapter multiplies the weights into the
advantages instead (every TRL loss it allows is linear in the advantage, and the weights are non-negative and carry no
gradient, so this is the same loss). Pure torch, tested on hand-built tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LEVELS", "MODES", "OffPolicyCorrection"]

LEVELS = ("token", "sequence")
MODES = ("truncate", "mask", "off")


@dataclass(frozen=True)
class OffPolicyCorrection:
    """Importance weights ``pi_theta / pi_behaviour`` capped at ``cap``, per ``level`` (token or sequence), by
    ``mode`` (``truncate``: ``min(w, cap)``; ``mask``: ``0`` where ``w > cap``; ``off``: every weight 1, the
    metrics still measured)."""

    cap: float = 2.0
    level: str = "token"
    mode: str = "truncate"

    def __post_init__(self) -> None:
        if not self.cap > 1:
            raise ValueError(f"OffPolicyCorrection(cap=...) must be > 1, got {self.cap}")
        if self.level not in LEVELS:
            raise ValueError(f"OffPolicyCorrection(level=...) must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.mode not in MODES:
            raise ValueError(f"OffPolicyCorrection(mode=...) must be one of {', '.join(MODES)}, got {self.mode!r}")

    def weights(
        self, trained_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The (B, C) weights of the tokens (0 off ``mask``) and the metrics ``async/is_clipped`` (the share of
        trained tokens, or of rows at sequence level, whose weight exceeded the cap) and ``async/mismatch`` (mean
        ``|log pi_theta - log pi_behaviour|`` over the trained tokens).

        ``trained_logps`` (B, C) are the trained policy's log-probabilities of the completion tokens,
        ``behaviour_logps`` (B, C) the sampling policy's, ``mask`` (B, C) 1 on the tokens the loss trains."""
        mask = mask.to(trained_logps.dtype)
        log_ratio = torch.nan_to_num((trained_logps - behaviour_logps) * mask, nan=0.0)  # (B, C)
        if self.level == "sequence":
            log_weights = log_ratio.sum(dim=-1, keepdim=True)  # (B, 1)
            rows = mask.sum(dim=-1, keepdim=True) > 0  # (B, 1) rows with a trained token
            counted = rows.to(trained_logps.dtype)
        else:
            log_weights = log_ratio  # (B, C)
            counted = mask
        raw = torch.exp(log_weights)
        above = (raw > self.cap).to(trained_logps.dtype) * counted
        if self.mode == "truncate":
            weights = raw.clamp(max=self.cap)
        elif self.mode == "mask":
            weights = raw.masked_fill(raw > self.cap, 0.0)
        else:
            weights = torch.ones_like(raw)
        tokens = mask.sum().clamp(min=1.0)
        metrics = {
            "async/is_clipped": float(above.sum() / counted.sum().clamp(min=1.0)),
            "async/mismatch": float(log_ratio.abs().sum() / tokens),
        }
        return weights.expand_as(trained_logps) * mask, metrics

    def weigh_advantages(
        self,
        advantages: torch.Tensor,
        trained_logps: torch.Tensor,
        behaviour_logps: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``advantages`` ((B,) per row or (B, C) per token) times the weights: the (B, C) advantages of a loss that
        multiplies each token's term by its weight, and the metrics of :meth:`weights`."""
        weights, metrics = self.weights(trained_logps, behaviour_logps, mask)  # (B, C)
        per_token = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, C)
        return per_token * weights.to(advantages.dtype), metrics
