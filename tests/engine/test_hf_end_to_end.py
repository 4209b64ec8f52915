"""The engine with the embedded tiny model through HFPolicy: Steps carry exactly the tokens the model produced."""

from transformers import AutoTokenizer

from rllm_gym.policies.hf import HFPolicy
from rllm_gym.types import TerminationReason


async def test_tiny_model_episodes_carry_matching_tokens(tiny_model_dir, frozenlake_engine):
    policy = HFPolicy(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = frozenlake_engine(policy, max_turns=2, max_tokens=12)
    episodes = await engine.run(list(range(3)), n_rollouts=2)
    assert len(episodes) == 6
    for episode in episodes:
        assert episode.termination_reason is not TerminationReason.ERROR, episode.metadata.get("error")
        for step in episode.trajectories[0].steps:
            output = step.model_output
            assert step.response_ids == output.completion_ids and 1 <= len(step.response_ids) <= 12
            assert len(step.logprobs) == len(step.response_ids) and all(lp <= 0.0 for lp in step.logprobs)
            # The prompt ids are the chat template applied to exactly the messages the Step recorded.
            expected = tokenizer.apply_chat_template(
                step.chat_completions[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert step.prompt_ids == list(expected)
            assert tokenizer.decode(step.response_ids, skip_special_tokens=True) == output.text
