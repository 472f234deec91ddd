"""The line a pass says every minute or so where no progress bar is drawn."""

from __future__ import annotations

from image_classification.train.progress import Heartbeat, format_duration


def test_durations_read_as_a_person_writes_them():
    assert [format_duration(s) for s in (0, 42.4, 60, 185, 3599, 3600, 7620)] == \
        ["0s", "42s", "1m 00s", "3m 05s", "59m 59s", "1h 00m", "2h 07m"]


def test_a_line_at_most_every_interval_with_the_time_left_at_the_rate_so_far():
    now, said = [100.0], []
    beat = Heartbeat(10, "epoch 3", said.append, done=2, every=60, clock=lambda: now[0])
    for seconds in (20, 20, 30):  # three steps, 70 s: one line, after the third
        now[0] += seconds
        beat.update()
    assert said == ["epoch 3: 5/10 iterations, 1m 10s so far, about 1m 57s left"]  # 5 left at 3 per 70 s
    now[0] += 10
    beat.update()
    assert len(said) == 1  # 10 s after the last line
    for _ in range(5):  # the pass's end: its own lines say the rest
        now[0] += 100
        beat.update()
    assert len(said) == 4 and said[-1].startswith("epoch 3: 9/10 iterations")
