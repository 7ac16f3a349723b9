"""Issue 27: a long run says up front how long it will take. The estimate is said once, from the
steps after the first (set-up) one, without the time spent evaluating, and a long one comes with
the caller's hint. A clock the test moves by hand stands in for time."""

from __future__ import annotations

from lmlab.train.estimate import Estimate, duration, per_step


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_and_step_times_read_as_people_say_them():
    assert [duration(s) for s in (0.42, 38.4, 125, 1500, 11_400, 7200)] == [
        "0.4 s", "38 s", "2 min 5 s", "25 min", "3 h 10 min", "2 h"]
    assert [per_step(s) for s in (0.045, 0.31, 2.91, 140.0)] == [
        "45 ms/step", "0.31 s/step", "2.9 s/step", "140 s/step"]


def run_steps(estimate: Estimate, clock: Clock, steps: range, seconds: float, evaluate_at=(), eval_s=0.0):
    for step in steps:
        clock.now += seconds
        estimate.update(step)
        if step in evaluate_at:
            clock.now += eval_s
            estimate.pause()


def test_said_once_after_the_timed_steps_with_the_hint_when_long():
    said, clock = [], Clock()
    est = Estimate(4000, say=said.append, note=" (plus 3 evaluations of 872 examples)",
                   hint=lambda rate: f"hint: --max-steps {int(600 / rate)}", clock=clock)
    clock.now += 30.0  # the first step sets things up: not timed
    est.update(1)
    run_steps(est, clock, range(2, 10), 2.9, evaluate_at={3}, eval_s=500.0)  # the evaluation: left out
    assert said == ["estimate: ~3 h 13 min for 4,000 steps at 2.9 s/step (plus 3 evaluations of 872 "
                    "examples)", "hint: --max-steps 206"]


def test_a_short_run_has_no_hint_and_a_resumed_one_counts_what_is_left():
    said, clock = [], Clock()
    est = Estimate(100, say=said.append, hint=lambda rate: "hint", clock=clock)
    run_steps(est, clock, range(1, 101), 0.5)
    assert said == ["estimate: ~50 s for 100 steps at 0.50 s/step"]
    said.clear()
    est = Estimate(100, 60, say=said.append, clock=clock)
    run_steps(est, clock, range(61, 101), 0.5)
    assert said == ["estimate: ~20 s for 40 more steps at 0.50 s/step"]


def test_a_slow_step_is_enough_and_a_run_that_ends_first_says_nothing():
    said, clock = [], Clock()
    est = Estimate(50, say=said.append, clock=clock)
    run_steps(est, clock, range(1, 3), 60.0)
    assert said == ["estimate: ~50 min for 50 steps at 60.0 s/step"]
    said.clear()
    est = Estimate(3, say=said.append, clock=clock)
    run_steps(est, clock, range(1, 4), 1.0)
    assert said == []  # done before an estimate could help: the summary says the time
