from __future__ import annotations

import base64
import importlib.util
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rllm_gym import types as rl
from rllm_gym.agoge import (
    AREEvaluatedTrajectory,
    AssistantMessage,
    Chat,
    EvaluatedTrajectory,
    FunctionCall,
    ImageContent,
    LLMEvaluatedTrajectory,
    SystemMessage,
    Task,
    TextContent,
    TimeStep,
    ToolCall,
    ToolMessage,
    Trajectory,
    UserMessage,
    agoge_to_episode,
    episode_to_agoge,
    message_from_openai,
    message_to_openai,
)

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))

# Chat


def test_chat_is_frozen_and_plus_returns_new_chats():
    chat = Chat(messages=[UserMessage(content="hi")], logprobs=[-0.5, -0.1])
    with pytest.raises(ValidationError, match="frozen"):
        chat.logprobs = None
    reply = AssistantMessage(content="hello")
    longer = chat + reply
    assert longer is not chat and chat.messages == [UserMessage(content="hi")]
    assert longer.messages == [UserMessage(content="hi"), reply] and longer.logprobs is None
    both = chat + Chat(messages=[reply], logprobs=[-1.0])
    assert both.messages == longer.messages and both.logprobs is None
    system = SystemMessage(content="be brief")
    front = system + chat
    assert isinstance(front, Chat) and front.messages == [system, UserMessage(content="hi")]
    assert front.logprobs is None
    assert (system + reply).messages == [system, reply]


def test_adding_nothing_keeps_logprobs_and_other_types_are_rejected():
    chat = Chat(messages=[UserMessage(content="hi")], logprobs=[-0.5])
    assert (chat + Chat()).logprobs == [-0.5]
    assert (Chat() + chat).logprobs == [-0.5]
    with pytest.raises(TypeError, match=re.escape("unsupported operand type(s) for +: 'Chat' and 'str'")):
        _ = chat + "text"


def test_chat_accepts_a_single_message_dict_as_in_agoge():
    chat = Chat.model_validate({"role": "user", "content": [{"type": "text", "text": "Thanks!"}]})
    assert chat.messages == [UserMessage(content=[TextContent(text="Thanks!")])]
    assert Chat.model_validate(SystemMessage(content="s")).messages == [SystemMessage(content="s")]


def test_validation_errors_name_the_field():
    with pytest.raises(ValidationError, match=r"chats\n  List should have at least 1 item"):
        TimeStep(chats=[])
    with pytest.raises(ValidationError, match="tool_call_id"):
        ToolMessage(content="42")
    with pytest.raises(ValidationError, match=r"unit_id\n  Extra inputs are not permitted"):
        Task(task_id="x", unit_id=1)
    with pytest.raises(ValidationError, match=re.escape("data: not valid base64")):
        ImageContent(data="not base64!")
    with pytest.raises(ValidationError, match=re.escape("an image needs `data` (base64 or a data URL) or `url`")):
        ImageContent()


def test_unknown_role_is_a_validation_error_naming_the_tag():
    with pytest.raises(ValidationError, match=re.escape("does not match any of the expected tags: 'system', 'user'")):
        Chat.model_validate({"messages": [{"role": "robot", "content": "x"}]})


def test_history_view_keeps_recent_messages_and_the_system_message():
    msgs = [
        SystemMessage(content="sys"),
        UserMessage(content="u1"),
        AssistantMessage(content="a1"),
        ToolMessage(content="t1", tool_call_id="c1"),
        UserMessage(content="u2"),
        ToolMessage(content="t2", tool_call_id="c2"),
        AssistantMessage(content="a2"),
    ]
    chat = Chat(messages=msgs, logprobs=[0.0])
    assert chat.history_view(None) is chat
    assert chat.history_view({"total": 3}).messages == [msgs[0], msgs[4], msgs[5], msgs[6]]
    assert chat.history_view({"tool": 1}).messages == [msgs[0], msgs[1], msgs[2], msgs[4], msgs[5], msgs[6]]
    view = chat.history_view({"total": 2, "assistant": 0})
    assert view.messages == [msgs[0], msgs[4], msgs[5]] and view.logprobs is None
    assert chat.history_view({"total": 100}) is chat
    with pytest.raises(ValueError, match=re.escape("limits: unknown key 'system'")):
        chat.history_view({"system": 1})
    with pytest.raises(ValueError, match=re.escape("limits['total'] must be a non-negative int, got -1")):
        chat.history_view({"total": -1})


def test_extract_images_as_bytes_in_message_order():
    data_url = "data:image/jpeg;base64," + base64.b64encode(b"jpeg-bytes").decode()
    chat = Chat(
        messages=[
            UserMessage(content=[TextContent(text="look"), ImageContent.from_bytes(PNG)]),
            AssistantMessage(content="a cat"),
            UserMessage(content=[ImageContent(data=data_url)]),
        ]
    )
    assert chat.extract_images(as_bytes=True) == [PNG, b"jpeg-bytes"]
    assert chat.messages[2].content[0].mime_type == "image/jpeg"
    remote = Chat(messages=[UserMessage(content=[ImageContent(url="https://example.org/cat.png")])])
    with pytest.raises(ValueError, match=re.escape("'https://example.org/cat.png' is only a remote URL")):
        remote.extract_images(as_bytes=True)


def test_extract_images_as_pil_or_a_clear_import_error():
    chat = Chat(messages=[UserMessage(content=[ImageContent.from_bytes(PNG)])])
    if importlib.util.find_spec("PIL") is None:
        with pytest.raises(ImportError, match=re.escape("needs the `pillow` package")):
            chat.extract_images()
    else:
        from PIL import Image

        buffer = __import__("io").BytesIO()
        Image.new("RGB", (3, 2)).save(buffer, format="PNG")
        images = Chat(messages=[UserMessage(content=[ImageContent.from_bytes(buffer.getvalue())])]).extract_images()
        assert images[0].size == (3, 2)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "be", "brief", "hi", "hello", "42"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", chat_template=template)


def test_apply_chat_template_with_a_real_tokenizer(tokenizer):
    chat = Chat(
        messages=[
            SystemMessage(content="be brief"),
            UserMessage(content="hi"),
            AssistantMessage(content="hello"),
            ToolMessage(content="42", tool_call_id="c1"),
        ]
    )
    text = chat.apply_chat_template(tokenizer, tokenize=False)
    assert text == "<|system|> be brief <|user|> hi <|assistant|> hello <|tool|> 42 "
    assert chat.apply_chat_template(tokenizer, exclude=["system", -1], tokenize=False, add_generation_prompt=True) == (
        "<|user|> hi <|assistant|> hello <|assistant|>"
    )
    assert chat.apply_chat_template(tokenizer, exclude=[0, 2], tokenize=False) == "<|user|> hi <|tool|> 42 "
    ids = chat.apply_chat_template(tokenizer, exclude=["tool"], tokenize=True, return_dict=False)
    assert ids == [1, 5, 6, 2, 7, 3, 8]


# Trajectories


def test_evaluated_trajectories_expose_one_evaluation_interface():
    step = TimeStep(chats=[Chat(messages=[UserMessage(content="hi")])], reward=1.0, done=True)
    with pytest.raises(TypeError, match="abstract"):
        EvaluatedTrajectory(timesteps=[step])
    are = AREEvaluatedTrajectory(timesteps=[step], reset_kwargs={"task": {}}, are_evaluation={"success": True})
    assert are.evaluation == {"success": True} and isinstance(are, EvaluatedTrajectory)
    assert LLMEvaluatedTrajectory(timesteps=[step]).evaluation == {}
    judged = LLMEvaluatedTrajectory(timesteps=[step], judge_response={"success": False, "rationale": "wrong"})
    assert judged.evaluation == {"success": False, "rationale": "wrong"}
    episode = agoge_to_episode([judged])
    assert episode.is_correct is False and episode.trajectories[0].reward == 1.0
    assert agoge_to_episode([are.model_copy(update={"episode_id": "t:3"})]).is_correct is True


def test_openai_messages_round_trip_including_tool_calls_and_images():
    call = ToolCall(id="c1", function=FunctionCall(name="calc", arguments='{"x": 1}'))
    for message in [
        AssistantMessage(content=None, tool_calls=[call]),
        ToolMessage(content="2", tool_call_id="c1"),
        UserMessage(content=[TextContent(text="see"), ImageContent.from_bytes(PNG, "image/gif")]),
    ]:
        assert message_from_openai(message_to_openai(message)) == message
    assert message_to_openai(AssistantMessage(content=None, tool_calls=[call]))["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}
    ]
    assert message_from_openai({"role": "developer", "content": "x"}) == SystemMessage(content="x")
    # unreadable dicts become a user message holding their JSON (the converters also keep the dict itself)
    assert message_from_openai({"role": ["x"], "content": 1}) == UserMessage(content='{"role": ["x"], "content": 1}')
    bad_image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x,%"}}]}
    assert isinstance(message_from_openai(bad_image), UserMessage)
    assert message_from_openai(bad_image).content.startswith('{"role": "user"')


def test_agoge_to_episode_maps_fields_natively():
    chat = Chat(messages=[UserMessage(content="q"), AssistantMessage(content=[TextContent(text="ans")])])
    traj = Trajectory(
        timesteps=[TimeStep(chats=[chat, chat], reward=0.5, done=True, mc_return=0.5)],
        reset_kwargs={"task": {"question": "q"}},
        error_info={"message": "boom"},
        episode_id="math:7",
    )
    episode = agoge_to_episode([traj])
    assert episode.id == "math:7" and episode.task == {"question": "q"}
    assert episode.termination_reason == rl.TerminationReason.ERROR
    steps = episode.trajectories[0].steps
    assert [s.reward for s in steps] == [0.0, 0.5] and [s.done for s in steps] == [False, True]
    assert steps[1].chat_completions == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "ans"}]},
    ]
    assert steps[1].model_response == "ans"
    assert episode_to_agoge(episode) == [traj]
    assert agoge_to_episode([traj.model_copy(update={"episode_id": None})]).id == "agoge:0"
    with pytest.raises(ValueError, match=re.escape("episode_id differs between trajectories")):
        agoge_to_episode([traj, traj.model_copy(update={"episode_id": "math:8"})])
    with pytest.raises(ValueError, match=re.escape("trajectories is empty")):
        agoge_to_episode([])


def test_episode_to_agoge_maps_fields_natively_and_keeps_an_empty_episode():
    step = rl.Step(chat_completions=[{"role": "user", "content": "hi"}], reward=2.0, done=True, advantage=0.3)
    episode = rl.Episode(id="a:b:1", task={"q": 1}, trajectories=[rl.Trajectory(name="solver", steps=[step])])
    (traj,) = episode_to_agoge(episode)
    assert traj.episode_id == "a:b:1" and traj.reset_kwargs == {"task": {"q": 1}} and traj.error_info is None
    assert traj.timesteps[0].chats[0].messages == [UserMessage(content="hi")]
    assert (traj.timesteps[0].reward, traj.timesteps[0].done, traj.timesteps[0].advantage) == (2.0, True, 0.3)
    traj.reset_kwargs["task"]["q"] = 2  # the converted records share no objects with the input
    traj.metadata["rllm"]["episode"]["metrics"]["new"] = 1
    assert episode.task == {"q": 1} and episode.metrics == {}
    back = agoge_to_episode(episode_to_agoge(episode))
    back.trajectories[0].steps[0].chat_completions[0]["content"] = "changed"
    assert step.chat_completions == [{"role": "user", "content": "hi"}]
    empty = rl.Episode(id="t:0", termination_reason="timeout", metrics={"m": 1})
    assert agoge_to_episode(episode_to_agoge(empty)) == empty


def test_edited_imports_and_lookalike_keys_are_not_lost():
    traj = Trajectory(timesteps=[TimeStep(chats=[Chat(messages=[UserMessage(content="x")])])], episode_id="e:0")
    episode = agoge_to_episode([traj])
    episode.trajectories[0].steps[0].reward = 3.0  # edited after import: the rllm data now rules
    assert agoge_to_episode(episode_to_agoge(episode)) == episode
    lookalike = rl.Episode(id="e:1", metadata={"agoge": {"user": "data"}})
    assert agoge_to_episode(episode_to_agoge(lookalike)) == lookalike
    fake = Trajectory(metadata={"rllm": {"not": "ours"}}, episode_id="e:2")
    assert episode_to_agoge(agoge_to_episode([fake])) == [fake]


# Property tests

json_scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8)
json_scalar = json_scalar | st.floats(allow_nan=False, allow_infinity=False)
json_value = st.recursive(
    json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
json_dict = st.dictionaries(st.text(max_size=6), json_value, max_size=3)
finite = st.floats(-1e6, 1e6, allow_nan=False)
data_url = st.binary(min_size=1, max_size=12).map(lambda b: "data:image/png;base64," + base64.b64encode(b).decode())
openai_part = st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=10)) | st.builds(
    lambda u: {"type": "image_url", "image_url": {"url": u}}, data_url | st.just("https://x.org/a.png")
)
openai_content = st.text(max_size=20) | st.lists(openai_part, max_size=3)
openai_call = st.builds(
    lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
    st.text(max_size=4),
    st.text(max_size=6),
    st.text(max_size=10),
)
openai_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": openai_content}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": openai_content | st.none()},
        optional={"tool_calls": st.lists(openai_call, max_size=2)},
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "content": openai_content, "tool_call_id": st.text(max_size=4)}),
    # dicts the agoge messages cannot hold exactly: kept verbatim beside the Chat
    st.fixed_dictionaries({"role": st.sampled_from(["developer", "user", "robot"]), "content": json_value}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.text(max_size=5), "name": st.text(max_size=3)}),
    st.fixed_dictionaries({"role": json_value, "content": json_value, "tool_calls": json_value}),
    st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.just([{"type": "image_url", "image_url": {"url": "data:x,%%"}}])}
    ),
)
token_ids = st.lists(st.integers(0, 50_000), max_size=5)


@st.composite
def model_outputs(draw):
    completion = draw(token_ids)
    return rl.ModelOutput(
        text=draw(st.text(max_size=10)),
        content=draw(st.text(max_size=10)),
        reasoning=draw(st.text(max_size=5)),
        tool_calls=draw(st.lists(st.builds(rl.ToolCall, name=st.text(max_size=5), arguments=json_dict), max_size=2)),
        prompt_ids=draw(token_ids),
        completion_ids=completion,
        logprobs=draw(st.lists(finite, min_size=len(completion), max_size=len(completion))),
        prompt_length=draw(st.integers(0, 100)),
        finish_reason=draw(st.none() | st.sampled_from(["stop", "length"])),
    )


steps = st.builds(
    rl.Step,
    id=st.text(min_size=1, max_size=6),
    input=json_value,
    output=json_value,
    action=json_value,
    reward=finite,
    done=st.booleans(),
    metadata=st.none() | json_dict,
    prompt_ids=token_ids,
    response_ids=token_ids,
    logprobs=st.lists(finite, max_size=4),
    chat_completions=st.lists(openai_message, max_size=4),
    advantage=st.none() | finite,
    observation=json_value,
    thought=st.text(max_size=5),
    model_response=st.text(max_size=5),
    model_output=st.none() | model_outputs(),
    mc_return=finite,
    info=json_dict,
)
rllm_trajectories = st.builds(
    rl.Trajectory,
    uid=st.text(min_size=1, max_size=6),
    name=st.sampled_from(["agent", "solver", "judge"]),
    task=json_value,
    steps=st.lists(steps, max_size=3),
    reward=st.none() | finite,
    input=st.none() | json_dict,
    output=json_value,
    signals=st.dictionaries(st.text(max_size=4), finite, max_size=2),
    metadata=st.none() | json_dict | st.just({"agoge": {"kind": "Trajectory"}}),
)
episodes = st.builds(
    rl.Episode,
    id=st.builds(lambda t, i: f"{t}:{i}", st.text(min_size=1, max_size=8), st.integers(0, 9)),
    task=json_value,
    termination_reason=st.none() | st.sampled_from(list(rl.TerminationReason)),
    is_correct=st.booleans(),
    trajectories=st.lists(rllm_trajectories, max_size=3),
    artifacts=json_dict,
    metrics=json_dict,
    metadata=json_dict | st.just({"agoge": {"schema_version": 1}}),
)

text_part = st.builds(TextContent, text=st.text(max_size=10))
image_part = st.builds(ImageContent.from_bytes, st.binary(min_size=1, max_size=10), st.sampled_from(["image/png"]))
image_part = image_part | st.builds(ImageContent, url=st.text(max_size=8), data=st.none() | st.just("AAAA"))
content = st.text(max_size=20) | st.lists(text_part | image_part, max_size=3)
calls = st.lists(
    st.builds(ToolCall, id=st.text(max_size=3), function=st.builds(FunctionCall, name=st.text(max_size=4))),
    max_size=2,
)
messages = st.one_of(
    st.builds(SystemMessage, content=content),
    st.builds(UserMessage, content=content),
    st.builds(AssistantMessage, content=content | st.none(), tool_calls=st.none() | calls),
    st.builds(ToolMessage, content=content, tool_call_id=st.text(max_size=4)),
)
chats = st.builds(Chat, messages=st.lists(messages, max_size=4), logprobs=st.none() | st.lists(finite, max_size=4))
timesteps = st.builds(
    TimeStep,
    chats=st.lists(chats, min_size=1, max_size=3),
    reward=st.none() | finite,
    done=st.booleans(),
    available_tool_schemas=st.none() | st.lists(json_dict, max_size=2),
    advantage=st.none() | finite,
    mc_return=st.none() | finite,
    metadata=json_dict,
)
common = {
    "timesteps": st.lists(timesteps, max_size=3),
    "reset_kwargs": json_dict | st.builds(lambda v: {"task": v}, json_value),
    "error_info": st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=6), max_size=2),
    "schema_version": st.integers(0, 3),
    "metadata": json_dict | st.just({"rllm": {"episode": {}, "trajectory": None}}),
}
agoge_trajectories = st.one_of(
    st.builds(Trajectory, **common),
    st.builds(AREEvaluatedTrajectory, **common, are_evaluation=json_dict),
    st.builds(LLMEvaluatedTrajectory, **common, judge_response=st.none() | json_dict),
)
agoge_episodes = st.builds(
    lambda ts, episode_id: [t.model_copy(update={"episode_id": episode_id}) for t in ts],
    st.lists(agoge_trajectories, min_size=1, max_size=3),
    st.none() | st.text(max_size=6),
)
quick = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@quick
@given(episodes)
def test_episode_round_trips_through_agoge_and_its_json(episode):
    trajectories = episode_to_agoge(episode)
    assert agoge_to_episode(trajectories) == episode
    from_json = [type(t).model_validate_json(t.model_dump_json()) for t in trajectories]
    assert from_json == trajectories
    assert agoge_to_episode(from_json) == episode


@quick
@given(agoge_episodes)
def test_agoge_round_trips_through_episode_and_its_json(trajectories):
    episode = agoge_to_episode(trajectories)
    assert episode_to_agoge(episode) == trajectories
    assert episode_to_agoge(rl.Episode.from_json(episode.to_json())) == trajectories
    assert [type(t).model_validate_json(t.model_dump_json()) for t in trajectories] == trajectories
