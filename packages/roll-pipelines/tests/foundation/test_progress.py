"""Step progress: plain periodic lines (no carriage returns) when stderr is not a terminal."""

from __future__ import annotations

import io

import pytest

from roll.pipelines.progress import PlainProgress, format_duration, step_progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("seconds", "text"), [(9.6, "10s"), (75.2, "1m15s"), (3725, "1h02m05s"), (0, "0s")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_plain_lines_on_the_first_and_last_step_and_every_twentieth():
    stream, clock = io.StringIO(), Clock()
    progress = PlainProgress(100, 0, "rlvr-tiny", stream, clock=clock)
    for _ in range(100):
        clock.now += 2.0
        progress.update()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert len(lines) == 21  # step 1, then 5, 10, ..., 100
    assert lines[0] == "rlvr-tiny: step 1/100 (1%), 2s elapsed, ETA 3m18s"
    assert lines[1] == "rlvr-tiny: step 5/100 (5%), 10s elapsed, ETA 3m10s"
    assert lines[-1] == "rlvr-tiny: step 100/100 (100%), 3m20s elapsed"


def test_a_slow_run_gets_a_line_at_least_every_interval_and_resumes_count_from_the_start_step():
    stream, clock = io.StringIO(), Clock()
    progress = PlainProgress(1000, 500, "sft", stream, min_interval_s=60.0, clock=clock)
    for _ in range(4):
        clock.now += 45.0
        progress.update()
    lines = stream.getvalue().splitlines()
    # step 501 (first), then 503 (90 s after 501 > 60 s); 502 and 504 come 45 s after a line
    assert [line.split(",")[0] for line in lines] == ["sft: step 501/1000 (50%)", "sft: step 503/1000 (50%)"]
    assert lines[0].endswith("45s elapsed, ETA 6h14m15s")  # 499 steps left at 45 s per step since the resume


def test_step_progress_is_plain_for_a_non_terminal_stream():
    stream = io.StringIO()
    with step_progress(3, 0, "x", stream) as bar:
        assert isinstance(bar, PlainProgress)
        for _ in range(3):
            bar.update()
    assert stream.getvalue().count("\n") == 3


def test_step_progress_draws_a_bar_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    with step_progress(3, 0, "x", stream) as bar:
        assert not isinstance(bar, PlainProgress)
        bar.update(3)
    assert "\r" in stream.getvalue() and "3/3" in stream.getvalue()
