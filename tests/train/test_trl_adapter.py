import contextlib
import re
import tomllib
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trl
from packaging.specifiers import SpecifierSet
from transformers import AutoModelForCausalLM

from rllm_gym.train import trl_adapter
from rllm_gym.train.trl_adapter import INTERNALS, SUPPORTED_TRL, GRPOAdapter, available, completion_positions_only

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", [name for name in INTERNALS if name != "driver_worker"])
def test_every_private_name_the_adapter_uses_is_where_it_expects(name):
    # Fails when a TRL or transformers upgrade moved one: update train/trl_adapter.py (INTERNALS says what for).
    assert trl.__version__ in SUPPORTED_TRL
    assert INTERNALS[name].present(), f"{INTERNALS[name].where}.{name} moved in TRL {trl.__version__}"


def test_pyproject_declares_the_adapters_trl_range():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (trl_requirement,) = [d for d in dependencies if re.match(r"trl\b", d)]
    assert SpecifierSet(trl_requirement.removeprefix("trl")) == SUPPORTED_TRL


def test_a_moved_internal_falls_back_to_trls_own_path_with_one_warning(monkeypatch):
    from trl.trainer import utils as trl_utils

    monkeypatch.setattr(trl_adapter, "_answers", {})
    monkeypatch.delattr(trl_utils, "_use_triton")
    with pytest.warns(RuntimeWarning, match=re.escape("no longer has trl.trainer.utils._use_triton")) as caught:
        for _ in range(3):
            with completion_positions_only():
                assert not hasattr(trl_utils, "_use_triton")  # TRL's own choice of rows: nothing patched
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1


def test_a_trl_outside_the_range_is_refused_by_the_trainer_and_skipped_by_the_speedups(monkeypatch):
    monkeypatch.setattr(trl_adapter, "_answers", {})
    monkeypatch.setattr(trl, "__version__", "1.99.0")
    with pytest.raises(RuntimeError, match=re.escape(f"supports TRL {SUPPORTED_TRL}, found TRL 1.99.0")):
        GRPOAdapter(model="unused")
    with pytest.warns(RuntimeWarning, match="outside the range"):
        assert available("_get_per_token_logps_and_entropies") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert available("_get_per_token_logps_and_entropies") is False  # warned once only


PRIVATE = re.compile(
    r"(\.|def |\"|')(_generate_and_score_completions|_get_per_token_logps_and_entropies|_use_triton|_metrics\["
    r"|_issue_warnings_after_load|_llm_weights_sleeping|_iter_named_params|_last_loaded_step|driver_worker"
    r"|_generate_single_turn|_calculate_rewards)|trainer\._generate\b"
)


def test_no_file_but_the_adapter_uses_the_private_names():
    users = []
    for folder in ("rllm_gym", "train", "envs", "agents", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "trl_adapter.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE.search(line):
                    users.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert users == []


def test_fused_lm_head_scores_only_the_completion_with_the_same_values_and_gradients(tiny_model_dir):
    from trl.trainer import utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    input_ids = torch.randint(3, 1000, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :4] = 0  # a left-padded row
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-3] = -100  # the last 3 positions are the completion

    def scored(compact: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
        calls = []
        kernel = trl_utils._ChunkedLogProbFunction.apply

        def counted(hidden, *args):
            calls.append(hidden.shape[0])  # the rows the LM head is computed on
            return kernel(hidden, *args)

        trl_utils._ChunkedLogProbFunction.apply = counted
        try:
            if compact:
                with completion_positions_only():
                    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
            else:
                out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        finally:
            trl_utils._ChunkedLogProbFunction.apply = kernel
        (out.log_probs.sum() + out.entropy.sum()).backward()
        assert calls == ([3 * 3] if compact else [3 * 11])  # scored positions only, or every position
        return out.log_probs, out.entropy, [p.grad for p in model.parameters()]

    use_triton = trl_utils._use_triton
    full, compact = scored(False), scored(True)
    assert trl_utils._use_triton is use_triton  # restored
    torch.testing.assert_close(compact[0], full[0])
    torch.testing.assert_close(compact[1], full[1])
    assert (full[0][:, :-3] == 0).all() and (compact[0][:, :-3] == 0).all()
    for a, b in zip(compact[2], full[2], strict=True):
        torch.testing.assert_close(a, b)


def test_trainer_scores_rows_in_width_groups_with_the_same_values_and_gradients(tiny_model_dir):
    from trl import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    # 40 rows of 9 prompt tokens and 2 of 97, left-padded to 97, each with a 3-token reply (one cut short)
    torch.manual_seed(0)
    input_ids = torch.randint(3, 1000, (42, 100))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[:40, :88] = 0
    attention_mask[5, -1] = 0
    trainer = GRPOAdapter.__new__(GRPOAdapter)  # only the scoring method runs: no episodes, no training
    # float32 whatever earlier tests set up, one process
    trainer.accelerator = SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True, num_processes=1)

    def scored(method) -> tuple[list[tuple[int, ...]], torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
        shapes = []
        model.register_forward_pre_hook(
            lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
        )
        logps, entropies, _ = method(trainer, model, input_ids, attention_mask, 3, compute_entropy=True)
        (logps.sum() + entropies.sum()).backward()
        return shapes, logps, entropies, [p.grad for p in model.parameters()]

    grouped = scored(GRPOAdapter._get_per_token_logps_and_entropies)
    whole = scored(GRPOTrainer._get_per_token_logps_and_entropies)  # TRL's: every row 100 tokens wide
    assert grouped[0] == [(40, 12), (2, 100)] and whole[0] == [(42, 100)]
    close = {"rtol": 1e-4, "atol": 1e-4}  # the rows' positions moved by 88: rotary angles round differently
    torch.testing.assert_close(grouped[1], whole[1], **close)
    torch.testing.assert_close(grouped[2], whole[2], **close)
    assert grouped[1][5, -1] == 0 and grouped[1][6, -1] != 0  # still in the batch's row order
    for a, b in zip(grouped[3], whole[3], strict=True):
        assert (a - b).norm() <= 1e-4 * b.norm()

    # with several processes (each must run the same forwards), one group, cut to the common padding only
    trainer.accelerator.num_processes = 2
    assert scored(GRPOAdapter._get_per_token_logps_and_entropies)[0] == [(42, 100)]
    attention_mask[40:, :88] = 0
    assert scored(GRPOAdapter._get_per_token_logps_and_entropies)[0] == [(42, 12)]


def test_the_generation_workers_copy_has_no_training_hooks_and_pickles(tiny_model_dir):
    import pickle

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.enable_input_require_grads()  # what TRL and PEFT do: a hook with a local function
    copied = trl_adapter.copy_without_hooks(model)
    pickle.dumps(copied)  # the worker gets it through a pipe
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():  # nothing requires gradients here but what the hook sets
        assert not copied.get_input_embeddings()(ids).requires_grad
        assert model.get_input_embeddings()(ids).requires_grad  # the trained model keeps its hook
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), copied.parameters(), strict=True))


def async_trainer_and_step(tiny_model_dir, tmp_path, correction):
    """A trainer with ``max_staleness=1`` and ``correction`` (its worker starts with train() only), a micro-batch of
    4 random rows of 3 completion tokens, and behaviour log-probabilities 1 nat apart from the trained ones on average
    (some weights above the cap of 2)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from rllm_gym.train.advantages import AdvantageConfig
    from rllm_gym.train.trainer import EnvSetup, EpisodeRollout, RLLMGRPOTrainer, encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=4,
                      num_generations=4, beta=0.0, bf16=False)  # fmt: skip
    trainer = RLLMGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": encode_prompt("rllm/FrozenLake-v0", 0)}] * 4),
        rollout=EpisodeRollout([EnvSetup("rllm/FrozenLake-v0")]), advantage_config=AdvantageConfig(), max_staleness=1,
        off_policy=correction,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    ones = torch.ones(4, 3, dtype=torch.long)
    inputs = {
        "prompt_ids": torch.randint(3, 500, (4, 6), generator=generator), "prompt_mask": torch.ones(4, 6).long(),
        "completion_ids": torch.randint(3, 500, (4, 3), generator=generator), "completion_mask": ones,
        "tool_mask": ones, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]), "num_items_in_batch": torch.tensor(12),
    }  # fmt: skip
    with torch.no_grad():
        trained, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1), 3,
        )  # fmt: skip
    behaviour = trained + torch.randn(4, 3, generator=generator)  # (B, C)
    return trainer, inputs, trained, behaviour


def test_the_loss_weighs_its_advantages_by_its_own_forward_as_a_forward_of_their_own_does(tiny_model_dir, tmp_path):
    from rllm_gym.train.off_policy import OffPolicyCorrection

    correction = OffPolicyCorrection(mode="truncate")
    trainer, inputs, _, behaviour = async_trainer_and_step(tiny_model_dir, tmp_path, correction)
    weighed, _ = trainer._off_policy_advantages(inputs, behaviour)  # a forward of their own (TRL moved its loss)
    own_forward = trainer.compute_loss(trainer.model, {**inputs, "advantages": weighed})
    in_the_loss = trainer.compute_loss(trainer.model, {**inputs, trl_adapter.BEHAVIOUR_KEY: behaviour})
    unweighed = trainer.compute_loss(trainer.model, inputs)
    torch.testing.assert_close(in_the_loss, own_forward, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(in_the_loss, unweighed, atol=1e-4)
    mode = "train" if trainer.model.training else "eval"
    assert trainer._metrics[mode]["async/is_clipped"][-1] > 0  # its metrics logged with the step's


def test_with_clip_the_loss_measures_grpos_ratio_against_the_behaviour_log_probabilities(tiny_model_dir, tmp_path):
    from rllm_gym.train.off_policy import OffPolicyCorrection

    trainer, inputs, trained, behaviour = async_trainer_and_step(tiny_model_dir, tmp_path, OffPolicyCorrection())
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    old = trainer.off_policy.old_logps(behaviour, mask)  # what the adapter puts in TRL's batch (clip mode)
    step = {**inputs, "old_per_token_logps": old, trl_adapter.BEHAVIOUR_KEY: behaviour}
    in_the_loss = trainer.compute_loss(trainer.model, step)
    ratio = torch.exp(trained - old)  # (B, C) the clipped objective of TRL's dapo loss, written out
    advantages = inputs["advantages"].unsqueeze(-1)
    expected = -torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages).sum() / 12
    torch.testing.assert_close(in_the_loss, expected, rtol=1e-5, atol=1e-6)
    mode = "train" if trainer.model.training else "eval"
    assert trainer._metrics[mode]["clip_ratio/region_mean"][-1] > 0  # GRPO's clipping saw the stale tokens
    assert trainer._metrics[mode]["async/mismatch"][-1] > 0.5  # and the correction's metrics are logged
    assert not torch.allclose(in_the_loss, trainer.compute_loss(trainer.model, inputs), atol=1e-4)  # TRL's own ratio
