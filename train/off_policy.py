"""The off-policy correction of asynchronous GRPO (``max_staleness >= 1``): the loss measured against the behaviour
policy that sampled the rows, not only against the weights it trains.

A row sampled by weights some versions older than the ones it trains on is off-policy. With one iteration per batch
TRL's ratio ``pi_theta / pi_old`` is measured against the weights at the start of the step (its
``old_per_token_logps`` are the loss's own, detached): it is 1, and GRPO's clipping never sees the gap.
:class:`OffPolicyCorrection` closes it, from the behaviour log-probabilities the batch carries, by its ``mode``:

- ``clip`` (the default): the behaviour log-probabilities ARE the loss's old ones, so the ratio is
  ``pi_theta / pi_behaviour`` and GRPO's clipping is PPO's trust region around the policy that sampled the rows (as
  PPO treats its own stale samples after the first epoch): a token already moved past ``1 +/- epsilon`` in its
  advantage's direction trains no further; the others are weighted by the ratio. The ratio's level is TRL's
  ``importance_sampling_level``; the cap is not used.
- ``truncate``: every token (or row) is weighted by ``w = pi_theta / pi_behaviour`` capped, ``min(w, cap)``
  (truncated importance sampling as in IMPALA/V-trace and TRL's vLLM correction), ``mask``: ``0`` above the cap.
  The same formula as TRL 1.16's ``vllm_importance_sampling_correction`` (token: per-token log-ratio; sequence: the
  sum of a row's log-ratios), which TRL applies with vLLM only: the trainer's adapter multiplies the weights into the
  advantages instead (every TRL loss it allows is linear in the advantage, and the weights are non-negative and carry
  no gradient, so this is the same loss); GRPO's own ratio stays 1.
- ``off``: no correction (the stale rows train as if on-policy), for comparison.

Why ``clip`` is the default: on the main job (``benchmarks/async_heldout.py``, seeds 0-2), ``truncate`` with K = 2
went near-deterministic on failing moves within 25-65 steps in every run (0/64 held out after 220 steps), where
``clip`` learned (README, "Asynchronous GRPO"). A weight above 1 pushes a token the policy has already made likelier
since the row was sampled further the same way, and nothing bounds how far the stale rows move it; ``clip`` stops
exactly those tokens. The metrics (``async/mismatch``, ``async/is_clipped``: the share of weights
``pi_theta / pi_behaviour`` above the cap) are measured in every mode; with ``clip``, TRL's ``clip_ratio/*`` show the
share of tokens its clipping stopped. Pure torch, tested on hand-built tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LEVELS", "MODES", "OffPolicyCorrection"]

LEVELS = ("token", "sequence")
MODES = ("clip", "truncate", "mask", "off")


@dataclass(frozen=True)
class OffPolicyCorrection:
    """The correction of rows sampled by older weights, by ``mode``: ``clip`` (the behaviour log-probabilities as the
    loss's old ones, :meth:`old_logps`; weights all 1), or importance weights ``pi_theta / pi_behaviour`` per ``level``
    (token or sequence) capped at ``cap`` (``truncate``: ``min(w, cap)``; ``mask``: ``0`` where ``w > cap``), or
    ``off`` (weights all 1). The metrics are measured in every mode."""

    cap: float = 2.0
    level: str = "token"
    mode: str = "clip"

    def __post_init__(self) -> None:
        if not self.cap > 1:
            raise ValueError(f"OffPolicyCorrection(cap=...) must be > 1, got {self.cap}")
        if self.level not in LEVELS:
            raise ValueError(f"OffPolicyCorrection(level=...) must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.mode not in MODES:
            raise ValueError(f"OffPolicyCorrection(mode=...) must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "clip" and self.level != "token":
            raise ValueError(
                "OffPolicyCorrection(level=...) applies to the truncate and mask modes: with mode='clip' the ratio's "
                "level is the loss's (TRL's importance_sampling_level: set it to 'sequence' there)"
            )

    @property
    def in_the_loss(self) -> bool:
        """Whether the correction is the loss's own ratio (``clip``: :meth:`old_logps`) rather than weights."""
        return self.mode == "clip"

    def old_logps(self, behaviour_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The (B, C) old log-probabilities of GRPO's ratio in ``clip`` mode: the behaviour ones on the tokens the
        loss trains (``mask`` 1), 0 elsewhere (no value there: the loss masks those positions, and a NaN would
        survive its masking)."""
        trained = mask.to(torch.bool)
        return torch.where(trained, torch.nan_to_num(behaviour_logps, nan=0.0), torch.zeros_like(behaviour_logps))

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
        else:  # off, or clip (the loss's ratio corrects)
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
