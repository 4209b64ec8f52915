"""Fixtures of the trainer's tests."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from datasets import Dataset

from rllm_gym.train.advantages import AdvantageConfig
from rllm_gym.train.trainer import RLLMGRPOTrainer


@pytest.fixture
def make_trainer():
    """``make_trainer(model, tokenizer, args, rows, rollout, **advantages)``: an RLLMGRPOTrainer on the dataset
    ``rows`` with ``AdvantageConfig(**advantages)``."""

    def make(model, tokenizer, args, rows, rollout, **advantages):
        dataset = Dataset.from_list(rows)
        config = AdvantageConfig(**advantages)
        return RLLMGRPOTrainer(model, args=args, processing_class=tokenizer, train_dataset=dataset, rollout=rollout,
                               advantage_config=config)  # fmt: skip

    return make


@pytest.fixture
def train_and_record():
    """``train_and_record(trainer)`` trains and returns, per batch, the output the loss got and the
    :class:`~rllm_gym.train.rollout.RolloutBatch` (padded) it was built from."""

    def train(trainer):
        outputs, batches = [], []
        collect, generate = RLLMGRPOTrainer.collect, RLLMGRPOTrainer._generate_and_score_completions

        def recorded_collect(self, prompts):
            batches.append(collect(self, prompts))
            return batches[-1]

        def recorded_generate(self, inputs):
            outputs.append(generate(self, inputs))
            return outputs[-1]

        with (
            patch.object(RLLMGRPOTrainer, "collect", recorded_collect),
            patch.object(RLLMGRPOTrainer, "_generate_and_score_completions", recorded_generate),
        ):
            trainer.train()
        return list(zip(outputs, batches, strict=True))

    return train
