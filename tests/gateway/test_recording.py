from rllm_gym.gateway.recording import model_context, previous_step, record_step, vocab_size
from rllm_gym.policies.scripted import ScriptedPolicy
from rllm_gym.types import ModelOutput, Trajectory


def _output(text: str, prompt: list[int], completion: list[int]) -> ModelOutput:
    return ModelOutput(text=text, content=text, prompt_ids=prompt, completion_ids=completion, logprobs=[-0.5] * 2)


def test_a_call_becomes_a_step_with_its_exact_ids_and_a_later_chat_finds_the_call_it_continues():
    trajectory = Trajectory(name="agent")
    user = {"role": "user", "content": "2 + 2?"}
    reply = {"role": "assistant", "content": "4"}
    record_step(trajectory, _output("4", [1, 2, 3], [7, 8]), [user, reply], [{"type": "function"}])
    (step,) = trajectory.steps
    assert (step.prompt_ids, step.response_ids, step.logprobs) == ([1, 2, 3], [7, 8], [-0.5, -0.5])
    assert step.chat_completions == [user, reply] and step.action == reply
    assert step.info == {"tools": [{"type": "function"}]}

    follow_up = [user, reply, {"role": "user", "content": "and 3 + 3?"}]
    assert previous_step(trajectory, follow_up) is step
    assert previous_step(trajectory, [user, {"role": "assistant", "content": "5"}, follow_up[2]]) is None
    assert previous_step(trajectory, [user]) is None  # shorter than the recorded call: a new row

    record_step(trajectory, _output("x", [4], [5, 6]), [], None)  # a completions call: no chat, never continued
    assert trajectory.steps[1].action == "x" and trajectory.steps[1].info == {}
    assert previous_step(trajectory, follow_up) is step


def test_model_context_is_none_for_a_policy_without_a_model():
    assert model_context(ScriptedPolicy(["a"])) is None


def test_vocab_size_is_the_smaller_of_the_tokenizers_and_the_models():
    class Config:
        vocab_size = 100

    class Model:
        config = Config()

    class Policy:
        tokenizer = ["t"] * 120  # added tokens past the model's embedding rows
        model = Model()

    assert vocab_size(Policy()) == 100
    Config.vocab_size = 150  # padded embeddings: the rows past the tokenizer are no tokens
    assert vocab_size(Policy()) == 120
    assert vocab_size(ScriptedPolicy(["a"])) is None
