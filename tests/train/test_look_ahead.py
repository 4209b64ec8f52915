from rllm_gym.train.look_ahead import LookAhead


def test_look_ahead_hands_over_the_next_steps_prompts_and_starts_again_each_epoch():
    submitted = []
    look_ahead = LookAhead(depth=2, submit=submitted.append)
    epoch = iter([[{"prompt": f"p{i}"}] for i in range(4)])
    first = list(zip(range(1), look_ahead.batches(epoch), strict=False))  # the trainer takes step 0's batch
    assert first == [(0, [{"prompt": "p0"}])] and submitted == [["p0"], ["p1"], ["p2"]]
    assert next(look_ahead.batches(epoch)) == [{"prompt": "p1"}] and submitted[-1] == ["p3"]
    assert [batch[0]["prompt"] for batch in look_ahead.batches(epoch)] == ["p2", "p3"]  # the epoch's end: no more
    submitted.clear()
    assert next(look_ahead.batches(iter([[{"prompt": "q0"}]]))) == [{"prompt": "q0"}]  # a new epoch's iterator
    assert submitted == [["q0"]]
    # With 2 batches per generation (TRL repeats a generation batch), only the first of each pair is generated.
    submitted.clear()
    repeated = LookAhead(depth=1, submit=submitted.append, generate_every=2)
    pairs = iter([[{"prompt": "a"}], [{"prompt": "a"}], [{"prompt": "b"}], [{"prompt": "b"}]])
    assert len(list(repeated.batches(pairs))) == 4 and submitted == [["a"], ["b"]]


def test_with_several_batches_a_step_the_look_ahead_hands_over_depth_steps_no_more():
    # Gradient accumulation: a step takes generate_every batches. While step 0's batches are taken, only the steps up
    # to `depth` ahead may be handed over (their weights are at most `depth` versions older than the trained ones):
    # handing step 2 over during step 0 had every row of it dropped as too old at K = 1.
    submitted = []
    look_ahead = LookAhead(depth=1, submit=submitted.append, generate_every=2)
    epoch = iter([[{"prompt": name}] for name in "aabbccdd"])
    step = look_ahead.batches(epoch)
    assert [next(step), next(step)] == [[{"prompt": "a"}]] * 2 and submitted == [["a"], ["b"]]
    step = look_ahead.batches(epoch)
    assert [next(step), next(step)] == [[{"prompt": "b"}]] * 2 and submitted == [["a"], ["b"], ["c"]]
    assert [batch[0]["prompt"] for batch in look_ahead.batches(epoch)] == list("ccdd") and len(submitted) == 4
