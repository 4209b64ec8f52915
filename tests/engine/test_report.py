from rllm_gym.engine.report import ErrorTally, all_errored, describe_errors, termination_counts
from rllm_gym.types import Episode, TerminationReason


def episode(uid, reason, error=None):
    metadata = {"error": {"type": error[0], "message": error[1], "traceback": "..."}} if error else {}
    return Episode(id=uid, termination_reason=reason, metadata=metadata)


def test_errors_are_grouped_by_type_and_message_with_a_count_and_the_first_example():
    episodes = [
        episode("a:0", TerminationReason.ERROR, ("PolicyError", "server down")),
        episode("b:0", TerminationReason.ENV_DONE),
        episode("c:0", TerminationReason.ERROR, ("ValueError", "bad map")),
        episode("d:0", TerminationReason.ERROR, ("PolicyError", "server down")),
    ]
    tally = ErrorTally()
    tally.add(episodes)
    assert tally.groups() == [
        {"type": "PolicyError", "message": "server down", "count": 2, "example": "a:0"},
        {"type": "ValueError", "message": "bad map", "count": 1, "example": "c:0"},
    ]
    assert termination_counts(episodes) == {"env_done": 1, "error": 3}
    assert not all_errored(episodes) and all_errored([episodes[0]]) and not all_errored([])
    text = describe_errors(tally.groups(), limit=1)
    assert text == "2 x PolicyError: server down (e.g. episode a:0)\n... and 1 other distinct errors"
