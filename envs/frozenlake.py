"""FrozenLake as a text environment: the reference env that every other rllm-gym env copies."""

from __future__ import annotations

import hashlib
import math
import re
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

from rllm_gym.envs.base import TextRendering
from rllm_gym.spaces import TextSpace

__all__ = ["MAX_SIZE", "FrozenLakeEnv", "best_fixed_moves", "generate_random_map", "parse_action"]

LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
ACTION_NAMES = ("left", "down", "right", "up")
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (d_row, d_col) per action, Gymnasium's order
_WORDS = {name: index for index, name in enumerate(ACTION_NAMES)}
_TILES = {"S": "_", "F": "_", "H": "O", "G": "G"}  # map letter -> what the observation shows
MAX_SIZE = 64
_INVALID_QUOTE = 60  # characters of an invalid action quoted back in the observation

_DIRECTION = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
_FENCE = re.compile(r"```[^\n`]*+\n?(.*?)```", re.DOTALL)  # possessive: an unclosed fence was quadratic
# One run of spaces, asterisks and quotes between the label and the move: three overlapping \s* there backtracked
# cubically on "action:" and thousands of spaces (2,000: half a minute).
_LABELLED = re.compile(r"\baction\s*+[:=][\s*\"'`]*+(up|down|left|right)\b", re.IGNORECASE)


def parse_action(text: str) -> int | None:
    """The move a reply asks for (0 left, 1 down, 2 right, 3 up), or None when it names none or several.

    Looked for in this order, the first that decides wins:
    1. the whole reply is one direction word (any case, surrounding whitespace and punctuation ignored);
    2. the last fenced block (```` ```Left``` ````) names exactly one direction;
    3. the last labelled move (``Action: Left``, ``action = "up"``);
    4. the reply names exactly one distinct direction anywhere (``I will go left.``).
    A reply naming two different directions outside a fence or label is ambiguous and gets None.
    """
    if not isinstance(text, str):
        return None
    move = _WORDS.get(text.strip(" \t\n.!*`'\"").lower())
    if move is not None:
        return move
    fences = _FENCE.findall(text) if "```" in text else None
    if fences:
        named = {word.lower() for word in _DIRECTION.findall(fences[-1])}
        if len(named) == 1:
            return _WORDS[named.pop()]
    labelled = _LABELLED.findall(text)
    if labelled:
        return _WORDS[labelled[-1].lower()]
    named = {word.lower() for word in _DIRECTION.findall(text)}
    return _WORDS[named.pop()] if len(named) == 1 else None


def _reachable(rows: list[str]) -> bool:
    """Breadth-first search from S to G over non-hole tiles."""
    n_rows, n_cols = len(rows), len(rows[0])
    start = next((r, row.index("S")) for r, row in enumerate(rows) if "S" in row)
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == "G":
            return True
        for dr, dc in _MOVES:
            nr, nc = r + dr, c + dc
            if 0 <= nr < n_rows and 0 <= nc < n_cols and (nr, nc) not in seen and rows[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append((nr, nc))
    return False


def _check_size_and_p(size: Any, p: Any) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= MAX_SIZE:
        raise ValueError(f"FrozenLake size must be an int in [2, {MAX_SIZE}], got {size!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
        raise ValueError(f"FrozenLake p (the probability of a frozen tile) must lie in (0, 1], got {p!r}")


def generate_random_map(size: int = 4, p: float = 0.8, rng: np.random.Generator | None = None) -> list[str]:
    """A ``size`` x ``size`` map, S top-left and G bottom-right, each other tile frozen with probability ``p``.

    Maps are resampled until the goal is reachable from the start, as in Gymnasium's generator.
    """
    _check_size_and_p(size, p)
    rng = rng if rng is not None else np.random.default_rng()
    for _ in range(10_000):
        frozen = rng.random((size, size)) < p
        rows = ["".join("F" if cell else "H" for cell in line) for line in frozen]
        rows[0] = "S" + rows[0][1:]
        rows[-1] = rows[-1][:-1] + "G"
        if _reachable(rows):
            return rows
    raise ValueError(f"no reachable FrozenLake map found in 10000 draws with size={size}, p={p}: raise p")


def best_fixed_moves(maps: list[list[str]], max_moves: int) -> tuple[list[str], int]:
    """The sequence of at most ``max_moves`` moves that solves the most of ``maps`` (non-slippery) when played blind,
    and how many it solves: what a policy that ignores the grid can reach, the baseline a policy that reads it must
    beat.

    Exact: a breadth-first search over the joint state of all maps (each player's tile, or in a hole, or at the goal),
    one level per move, keeping one sequence per distinct joint state.
    """
    maps = [_validate_map(rows) for rows in maps]
    goal, hole = -1, -2
    starts = tuple(next(r * 64 + row.index("S") for r, row in enumerate(rows) if "S" in row) for rows in maps)

    def move(state: tuple[int, ...], action: int) -> tuple[int, ...]:
        d_row, d_col = _MOVES[action]
        after = []
        for rows, tile in zip(maps, state, strict=True):
            if tile < 0:
                after.append(tile)
                continue
            row = min(max(tile // 64 + d_row, 0), len(rows) - 1)
            col = min(max(tile % 64 + d_col, 0), len(rows[0]) - 1)
            letter = rows[row][col]
            after.append(goal if letter == "G" else hole if letter == "H" else row * 64 + col)
        return tuple(after)

    level: dict[tuple[int, ...], list[str]] = {starts: []}
    best: tuple[int, list[str]] = (0, [])
    for _ in range(max_moves):
        following: dict[tuple[int, ...], list[str]] = {}
        for state, moves in level.items():
            for action in range(4):
                after = move(state, action)
                if after != state and after not in following:
                    following[after] = [*moves, ACTION_NAMES[action]]
        for state, moves in following.items():
            solved = state.count(goal)
            if solved > best[0]:
                best = (solved, moves)
        level = following
    return best[1], best[0]


def _validate_map(rows: Any) -> list[str]:
    if isinstance(rows, str):
        rows = rows.split()
    if not isinstance(rows, (list, tuple)) or not rows or not all(isinstance(row, str) for row in rows):
        raise ValueError(
            f"task['map'] must be a non-empty list of row strings such as ['SFF', 'FHF', 'FFG'], got {rows!r}"
        )
    rows = list(rows)
    if len(rows) > MAX_SIZE or any(len(row) != len(rows[0]) or not row for row in rows) or len(rows[0]) > MAX_SIZE:
        raise ValueError(f"task['map'] must be rectangular with at most {MAX_SIZE} rows and columns, got {rows!r}")
    letters = "".join(rows)
    if set(letters) - set("SFHG") or letters.count("S") != 1 or letters.count("G") != 1:
        raise ValueError(
            f"task['map'] may only use the letters S (start, exactly one), F (frozen), H (hole) and G (goal, exactly "
            f"one), got {rows!r}"
        )
    return rows


class FrozenLakeEnv(TextRendering, gym.Env[str, str]):
    """Cross a frozen lake from the start to the goal without falling into a hole, reading and writing text.

    ## Description
    Gymnasium's FrozenLake with a text interface. The player starts in the top-left corner and must reach the goal
    in the bottom-right corner of a grid of frozen tiles and holes. Each reset draws a new random map (seeded, and
    resampled until the goal is reachable) unless the task pins one.

    ## Action Space
    ``TextSpace(max_length=100_000)``: the model's reply. It is parsed into one of ``left``, ``down``, ``right``,
    ``up`` (see Action Parsing). An action outside the space (``bytes``, ``None``, a number, text over 100,000
    characters) is an invalid action.

    ## Observation Space
    ``TextSpace``: the grid, one row per line, tiles separated by spaces: ``P`` the player, ``_`` frozen, ``O`` a
    hole, ``G`` the goal. After an invalid action the grid is preceded by one line that says what was wrong.

    ## Prompt Format
    The observation holds no instructions: agents (``rllm_gym.agents``) add the rules and the answer format.
    Example observation of a 4x4 map::

        P _ _ _
        _ O _ O
        _ _ _ O
        O _ _ G

    ## Action Parsing
    See :func:`parse_action`: a bare direction word, the last fenced block, the last ``Action: <dir>`` label, or a
    single direction named anywhere. Case is ignored. Anything else is an invalid action: the player does not
    move, the observation says so, and the step earns ``invalid_action_reward``.

    ## Starting State
    The player on the start tile of a new map: ``reset(seed=s)`` draws the map from the env's seeded generator;
    ``reset(options={"task": {"map": ["SFFF", "FHFH", "FFFH", "HFFG"]}})`` pins a map, and
    ``reset(options={"task": {"seed": 7, "size": 6, "p": 0.8}})`` pins the map that seed generates.

    ## Rewards
    1.0 on reaching the goal, 0.0 for every other move, ``invalid_action_reward`` (default 0.0) for an action that
    names no single direction. Reaching the goal ends the episode, so with the default arguments a step earns 0.0 or
    1.0 and an episode returns 0.0 or 1.0 (``metadata["step_reward_range"]`` and ``["episode_return_range"]``, both
    ``(0.0, 1.0)``). Any other ``invalid_action_reward`` r moves the step range to ``[min(0, r), max(1, r)]``; since
    invalid actions may repeat until ``max_episode_steps`` (which the env does not know), ``metadata`` then gives the
    episode return as unbounded on r's side (``-inf`` or ``inf``; at most ``max_episode_steps`` times r there).

    ## Episode End
    Terminated when the player reaches the goal or falls into a hole. Truncated by Gymnasium's ``TimeLimit``
    wrapper after ``max_episode_steps`` (100 when made with ``gym.make("rllm/FrozenLake-v0")``).

    ## Information
    ``reset`` and ``step`` return: ``task`` (reset only: ``{"id", "map"}``), ``position`` (``(row, col)``),
    ``is_correct`` (the goal is reached). ``step`` adds ``action`` (the parsed direction, or None) and
    ``invalid_action`` (bool).

    ## Arguments
    ``size`` (int, 4): side of generated maps, 2 to 64. ``p`` (float, 0.8): probability of a frozen tile.
    ``is_slippery`` (bool, False): with probability 2/3 the player slides perpendicular to the chosen direction,
    as in Gymnasium. ``invalid_action_reward`` (float, 0.0). ``render_mode`` (``"human"``: the grid printed after
    every reset and step; ``"ansi"``: ``render()`` returns it; or None).

    ## Version History
    * v0: initial version; text over ``max_length`` became an invalid action, and ``render_mode="human"`` was
      added.
    """

    metadata = {
        "render_modes": ["human", "ansi"],
        "render_fps": 4,
        "rllm_gym.inline_step": True,
        "step_reward_range": (0.0, 1.0),  # with the default invalid_action_reward (see ## Rewards)
        "episode_return_range": (0.0, 1.0),
    }

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        invalid_action_reward: float = 0.0,
        render_mode: str | None = None,
    ):
        _check_size_and_p(size, p)
        if not isinstance(is_slippery, bool):
            raise ValueError(f"FrozenLakeEnv is_slippery must be True or False, got {is_slippery!r}")
        if (
            isinstance(invalid_action_reward, bool)
            or not isinstance(invalid_action_reward, (int, float))
            or not math.isfinite(invalid_action_reward)
        ):
            raise ValueError(
                f"FrozenLakeEnv invalid_action_reward must be a finite number, got {invalid_action_reward!r}"
            )
        self.size, self.p, self.is_slippery = size, p, is_slippery
        self.invalid_action_reward = float(invalid_action_reward)
        reward = self.invalid_action_reward
        if reward != 0.0:  # invalid actions may repeat until a time limit the env does not know: unbounded
            self.metadata = {
                **type(self).metadata,
                "step_reward_range": (min(0.0, reward), max(1.0, reward)),
                "episode_return_range": (-math.inf if reward < 0 else 0.0, math.inf if reward > 0 else 1.0),
            }
        self.set_render_mode(render_mode)
        # The largest grid, and the invalid-action line above it: a quote of up to 63 characters whose repr() may take
        # 10 for each one ("\U000e0001"), in about 110 characters of message.
        self.observation_space = TextSpace(max_length=2 * MAX_SIZE * MAX_SIZE + 1024)
        self.action_space = TextSpace(max_length=100_000)
        self._rows: list[str] = []
        self._tiles: list[str] = []
        self._row, self._col = 0, 0
        self._done = False

    # The task

    def _task_map(self, task: dict[str, Any]) -> list[str]:
        if not isinstance(task, dict):
            raise ValueError(f"options['task'] must be a dict with 'map' or 'seed', got {type(task).__name__}")
        if "map" in task:
            return _validate_map(task["map"])
        if "seed" in task:
            if not isinstance(task["seed"], int) or isinstance(task["seed"], bool) or task["seed"] < 0:
                raise ValueError(f"task['seed'] must be a non-negative int, got {task['seed']!r}")
            rng = np.random.default_rng(task["seed"])
            return generate_random_map(task.get("size", self.size), task.get("p", self.p), rng)
        raise ValueError(f"options['task'] must have a 'map' (rows of S/F/H/G) or a 'seed', got keys {sorted(task)}")

    def _load(self, rows: list[str], task_id: str | None) -> dict[str, Any]:
        self._rows = rows
        self._tiles = [" ".join(_TILES[letter] for letter in row) for row in rows]
        self._row, self._col = next((r, row.index("S")) for r, row in enumerate(rows) if "S" in row)
        self._done = False
        if task_id is None:
            digest = hashlib.sha1("/".join(rows).encode()).hexdigest()[:12]
            task_id = f"frozenlake-{len(rows)}x{len(rows[0])}-{digest}"
        return {"id": task_id, "map": list(rows)}

    # Gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            rows, task_id = generate_random_map(self.size, self.p, self.np_random), None
        else:
            rows, task_id = self._task_map(task), task.get("id")
        info = {"task": self._load(rows, task_id), "position": (self._row, self._col), "is_correct": False}
        return self.rendered((self._render_grid(), info))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self._rows:
            raise RuntimeError("FrozenLakeEnv.step called before reset(): call reset() first")
        if self._done:
            raise RuntimeError("FrozenLakeEnv.step called after the episode ended: call reset() first")
        return self.rendered(self._move(action))

    def _move(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        move = parse_action(action) if self.action_space.contains(action) else None
        if move is None:
            quoted = action if isinstance(action, str) else repr(action)
            if len(quoted) > _INVALID_QUOTE:
                quoted = quoted[:_INVALID_QUOTE] + "..."
            observation = (
                f"Invalid action {quoted!r}: reply with exactly one of up, down, left, right "
                f"(e.g. 'Action: Left'). You did not move.\n" + self._render_grid()
            )
            info = {"action": None, "invalid_action": True, "position": (self._row, self._col), "is_correct": False}
            return observation, self.invalid_action_reward, False, False, info
        chosen = move
        if self.is_slippery:
            move = (move + int(self.np_random.integers(-1, 2))) % 4
        d_row, d_col = _MOVES[move]
        self._row = min(max(self._row + d_row, 0), len(self._rows) - 1)
        self._col = min(max(self._col + d_col, 0), len(self._rows[0]) - 1)
        letter = self._rows[self._row][self._col]
        self._done = letter in "GH"
        reached = letter == "G"
        info = {
            "action": ACTION_NAMES[chosen],
            "invalid_action": False,
            "position": (self._row, self._col),
            "is_correct": reached,
        }
        return self._render_grid(), 1.0 if reached else 0.0, self._done, False, info

    render_end = "\n\n"  # a blank line between the grids "human" prints

    def render_text(self) -> str:
        """The grid as text (``render()``: returned for ``"ansi"``, printed for ``"human"``)."""
        return self._render_grid()

    def _render_grid(self) -> str:
        if not self._tiles:
            return ""  # before the first reset, as the other text envs render
        tiles = self._tiles.copy()
        line = tiles[self._row]
        tiles[self._row] = line[: 2 * self._col] + "P" + line[2 * self._col + 1 :]
        return "\n".join(tiles)
