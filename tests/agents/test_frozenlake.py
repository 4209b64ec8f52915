import re

import pytest

from rllm_gym.agents.frozenlake import FrozenLakeAgent


def test_observation_template_with_another_placeholder_is_refused_when_the_agent_is_made():
    with pytest.raises(ValueError, match=re.escape("a placeholder other than {observation} (KeyError: 'up|down')")):
        FrozenLakeAgent(observation_template="Grid:\n{observation}\nReply {up|down}")
    agent = FrozenLakeAgent(observation_template="Grid:\n{observation}\nReply {{up|down}}")
    assert agent.format_observation("P _\n_ G", {}) == "Grid:\nP _\n_ G\nReply {up|down}"
