"""The interop's one-line errors: a library's exception quoted on one line, bounded."""

from rllm_gym.integrations import describe_error


def test_a_multiline_or_huge_message_is_one_bounded_line() -> None:
    page = "Server error '501 Unsupported method'\nFor more information check: https://example.org/501\n"
    assert describe_error(RuntimeError(page)) == (
        "RuntimeError: Server error '501 Unsupported method' For more information check: https://example.org/501"
    )
    huge = describe_error(ValueError("x" * 10_000))
    assert len(huge) == len("ValueError: ") + 300 and huge.endswith("...")
    assert describe_error(TimeoutError()) == "TimeoutError"
