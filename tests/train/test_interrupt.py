"""train/interrupt.py: Ctrl-C finishes the step under way and stops with a checkpoint; during the last step the run
simply finishes."""

import signal

from transformers import TrainerControl, TrainerState

from rllm_gym.train.interrupt import StopOnInterrupt


def ctrl_c_during_step(max_steps: int, step: int, capsys) -> tuple[TrainerControl, str]:
    """Start training at ``step - 1`` of ``max_steps``, press Ctrl-C, end step ``step``: the control and the notice."""
    callback, control = StopOnInterrupt(), TrainerControl()
    state = TrainerState(global_step=step - 1, max_steps=max_steps)
    before = signal.getsignal(signal.SIGINT)
    callback.on_train_begin(None, state, control)
    try:
        signal.raise_signal(signal.SIGINT)  # the handler runs here, in the main thread
        state.global_step = step
        callback.on_step_end(None, state, control)
    finally:
        callback.on_train_end(None, state, control)
    assert signal.getsignal(signal.SIGINT) is before  # the handler that was there is back
    return control, capsys.readouterr().out


def test_ctrl_c_stops_after_the_step_under_way_with_a_checkpoint(capsys):
    control, notice = ctrl_c_during_step(max_steps=5, step=3, capsys=capsys)
    assert control.should_training_stop and control.should_save
    assert notice.startswith("Ctrl-C: stopping after step 3 with a checkpoint (continue with --resume true")


def test_ctrl_c_during_the_last_step_lets_the_run_finish(capsys):
    control, notice = ctrl_c_during_step(max_steps=5, step=5, capsys=capsys)
    assert not control.should_training_stop and not control.should_save  # the trainer's own end: eval, save, final/
    assert notice.startswith("Ctrl-C: step 5 is the last: the run ends after it")
