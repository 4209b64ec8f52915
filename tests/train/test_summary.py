"""train/summary.py: the summary's fields from the values a run returns, and the run's log read back from
metrics.jsonl as ConsoleLog writes it."""

import json
import logging

from rllm_gym.train import summary
from rllm_gym.train.summary import RunLog, episode_fields

ENV = "rllm/FrozenLake-v0"


def write_log(folder, records):
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))


def evaluation(step, greedy, **extra):
    return {"step": step, "elapsed_s": 1.5 * step, "eval_train/greedy": greedy, "eval_train/tasks": 4, **extra}


def test_the_log_splits_training_logs_from_evaluations_in_order(tmp_path):
    write_log(tmp_path, [evaluation(0, 0.25), {"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75}])
    log = summary.read_run_log(tmp_path)
    assert [record["step"] for record in log.training] == [1, 2]
    assert [record["step"] for record in log.evaluations] == [0]
    assert summary.read_run_log(tmp_path / "missing") == RunLog(training=[], evaluations=[])


def test_the_evaluation_after_is_the_last_one_since_training_started_as_the_evaluator_returned_it(tmp_path):
    write_log(tmp_path, [evaluation(0, 0.25), evaluation(2, 0.5), evaluation(4, 0.75, epoch=1.0, eval_reward=0.1)])
    log = summary.read_run_log(tmp_path)
    # The log's own fields (elapsed time, the trainer's epoch and its own eval_ metrics) are not the evaluation's.
    assert log.evaluation_after(0) == {"step": 4, "eval_train/greedy": 0.75, "eval_train/tasks": 4}
    assert log.evaluation_after(4) is None  # a resume from step 4 that evaluated nothing
    assert RunLog(training=[], evaluations=[evaluation(0, 0.25)]).evaluation_after(0) is None  # only the one before


def outcome(log, started_at=0):
    return summary.TrainingOutcome(started_at=started_at, steps=4, seconds=2.0, episodes={}, log=log)


def test_evaluation_fields_give_the_per_env_scores_of_the_evaluation_after():
    log = RunLog(training=[], evaluations=[evaluation(4, 0.75, **{"eval_heldout/greedy": 0.5})])
    fields = summary.evaluation_fields(outcome(log), [ENV])
    assert fields["greedy_after"] == {ENV: 0.75} and fields["heldout_after"] == {ENV: 0.5}
    assert fields["evaluation_after"]["step"] == 4
    assert summary.evaluation_fields(outcome(log, started_at=4), [ENV]) == {}


def test_reward_fields_are_the_first_and_last_logged_rewards():
    log = RunLog(
        training=[{"step": step, "reward": reward} for step, reward in ((1, 0.1), (2, 0.2), (3, 0.4))], evaluations=[]
    )
    assert summary.reward_fields(log) == {"reward_first": 0.1, "reward_last": 0.4}
    assert summary.reward_fields(RunLog(training=[], evaluations=[])) == {}


def test_episode_fields_count_terminations_sorted_with_the_infra_failures():
    fields = episode_fields({"max_turns": 3, "env_done": 5}, [])
    assert list(fields["termination_reasons"]) == ["env_done", "max_turns"] and fields["infra_failed"] == 0
    assert episode_fields({"infra_failed": 2}, [])["infra_failed"] == 2


def test_report_episodes_writes_the_summary_and_names_the_errors(tmp_path, caplog):
    errors = [{"count": 3, "type": "ValueError", "message": "bad map", "example": "t:0"}]
    written = {"stopped": "training stopped", **episode_fields({"error": 3}, errors)}
    with caplog.at_level(logging.WARNING, logger="rllm_gym"):
        summary.report_episodes(written, tmp_path, write=True)
    assert json.loads((tmp_path / "summary.json").read_text()) == written
    assert "3 training episodes ended in ERROR" in caplog.text
    summary.report_episodes(written, tmp_path / "elsewhere", write=False)  # another process: writes nothing
    assert not (tmp_path / "elsewhere").exists()
