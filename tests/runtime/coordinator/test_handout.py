"""runtime/coordinator/handout.py: tasks drawn past the prompt filter, outcomes counted only from their worker."""

from __future__ import annotations

import itertools

from echo2sdk.core.contracts import Task
from echo2sdk.core.prompt_filter import PromptFilter, prompt_key
from echo2sdk.core.records import Meta, Trajectory
from echo2sdk.runtime.coordinator.handout import MAX_DRAWS_PER_REQUEST, MAX_DRAWS_PER_TASK, Handout
from echo2sdk.runtime.learner.tasks import CountedTasks


def stream(questions: int):
    """Task ids never repeat; the prompts cycle through `questions` contents (a procedural stream's repeats)."""
    for i in itertools.count():
        q = i % questions
        yield Task(id=f"0-{i}", messages=({"role": "user", "content": f"q{q}"},), answer=str(q))


def group(task: Task, rewards: list[float], correct: list[bool]) -> list[Trajectory]:
    return [Trajectory(prompt="p", response=f"r{k}", reward=r, version=0,
                       meta=Meta(group_id=task.id, prompt_ids=(1,), response_ids=(2,), logprobs=(-0.1,),
                                 extra={"correct": c}))
            for k, (r, c) in enumerate(zip(rewards, correct))]


def test_without_a_filter_tasks_go_out_as_drawn():
    h = Handout(iter([Task(id=str(i), messages=()) for i in range(5)]))
    assert [t.id for t in h.take(3, "w")] == ["0", "1", "2"]
    assert [t.id for t in h.take(3, "w")] == ["3", "4"]  # the stream ended
    assert h.take(3, "w") == []
    assert h.metrics() == {"prompts_handed": 0, "prompts_skipped": 0, "prompts_skipped_by_reason": {},
                           "prompt_explore": None, "filter_rate_unskipped": None}


def test_a_prompt_that_gave_a_zero_variance_group_is_skipped_and_the_stream_counts_it():
    tasks = CountedTasks(stream(4))
    h = Handout(tasks, PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0))
    first = h.take(4, "w")  # q0..q3, all unknown: handed out
    assert [t.messages[0]["content"] for t in first] == ["q0", "q1", "q2", "q3"]
    h.outcome("w", group(first[0], [1.1, 1.1], [True, True]))  # q0: all right
    h.outcome("w", group(first[1], [0.0, 1.1], [False, True]))  # q1: mixed
    later = h.take(20, "w")
    contents = [t.messages[0]["content"] for t in later]
    skipped = h.stats()["skipped_by_reason"]["all_correct"]
    assert skipped > 0 and contents.count("q0") < contents.count("q1")
    assert tasks.issued == 4 + len(later) + skipped  # skipped prompts are drawn past: a resume starts after them
    assert h.state_dict()["tasks_issued"] == tasks.issued
    m = h.metrics()
    assert m["prompts_handed"] == 4 + len(later) and m["prompts_skipped"] == skipped
    assert m["prompts_skipped_by_reason"]["all_correct"] == skipped and m["prompt_explore"] == 0.05
    assert h.metrics()["prompts_skipped"] == 0  # since the previous call


def test_an_outcome_counts_only_from_the_worker_handed_the_task_and_only_once():
    f = PromptFilter(seed=0)
    h = Handout(stream(2), f)
    mine = h.take(1, "honest")[0]
    h.outcome("liar", group(mine, [0.0, 0.0], [False, False]))  # another worker claims its outcome
    assert f.stats()["observed"] == 0 and h.foreign == 1
    h.outcome("honest", group(mine, [0.0, 0.0], [False, False]))
    h.outcome("honest", group(mine, [0.0, 0.0], [False, False]))  # the same group again: counted once
    assert f.stats()["observed"] == 1 and f.stats()["zero_variance"] == 1
    h.outcome("honest", group(Task(id="never-handed", messages=()), [0.0, 0.0], [False, False]))
    assert f.stats()["observed"] == 1


def test_a_stream_of_only_skippable_prompts_never_starves_a_worker():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0)
    tasks = CountedTasks(itertools.islice(stream(1), 100_000))  # one prompt (finite: a broken bound fails, not hangs)
    h = Handout(tasks, f)
    (t,) = h.take(1, "w")
    for _ in range(10):
        h.outcome("w", group(t, [0.0, 0.0], [False, False]))
        (t,) = h.take(1, "w")
    for _ in range(20):
        assert len(h.take(2, "w")) == 2  # handed out, explored or forced
    per_take = lambda n: n * MAX_DRAWS_PER_TASK + n  # noqa: E731  (judged draws, then unjudged ones)
    assert tasks.issued <= 11 * per_take(1) + 20 * per_take(2)
    assert h.forced > 0


def test_pending_tasks_are_bounded_per_worker_and_one_worker_cannot_push_out_anothers():
    h = Handout(stream(1000), PromptFilter(seed=0), max_pending_per_worker=8)
    honest = h.take(4, "honest")
    h.take(20, "greedy")
    h.take(20, "greedy")
    assert h.stats()["pending"] == 4 + 8 and h.forgotten == 32
    h.outcome("honest", group(honest[0], [0.0, 1.0], [False, True]))
    assert h.filter.stats()["observed"] == 1  # the honest worker's task was still remembered


def test_a_request_draws_a_bounded_number_of_prompts():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0)
    tasks = CountedTasks(stream(1))
    h = Handout(tasks, f)
    (t,) = h.take(1, "w")
    for _ in range(6):
        h.outcome("w", group(t, [0.0, 0.0], [False, False]))
        (t,) = h.take(1, "w")
    before = tasks.issued
    assert len(h.take(1024, "w")) == 1024
    assert tasks.issued - before <= MAX_DRAWS_PER_REQUEST + 1024


def test_a_quarantined_worker_loses_its_pending_tasks_and_its_streaks():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0)
    h = Handout(stream(2), f)
    a, b = h.take(2, "liar")
    h.outcome("liar", group(a, [0.0, 0.0], [False, False]))
    assert f.stats()["zero_variance"] == 1 and h.stats()["pending"] == 1
    h.forget_worker("liar")
    assert h.stats()["pending"] == 0 and f.streak(prompt_key(a.messages, a.answer, a.info)) == 0


def test_a_resumed_handout_counts_its_first_metrics_row_from_the_checkpoint():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0)
    h = Handout(stream(2), f)
    for _ in range(5):
        for t in h.take(2, "w"):
            h.outcome("w", group(t, [0.0, 0.0], [False, False]))
    state = h.state_dict()
    again = Handout(stream(2), PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0))
    again.load_state_dict(state)
    assert again.stats()["handed"] == h.stats()["handed"]
    assert again.metrics()["prompts_handed"] == 0 and again.metrics()["prompts_skipped"] == 0


def test_an_env_task_with_no_identity_is_never_judged():
    f = PromptFilter(explore=0.05, min_explore=0.05, eta=0.0, seed=0)
    h = Handout(iter([Task(id=str(i), messages=()) for i in range(50)]), f)
    assert len(h.take(50, "w")) == 50 and f.stats()["handed"] == 0 and h.stats()["pending"] == 0
