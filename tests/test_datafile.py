"""The one reader of the toolkit's own files: regular files only (no link where refused, no FIFO waited on), a
bound on their size, and JSON within bounds of nesting and numbers, every failure a sentence, never a
traceback."""

from __future__ import annotations

import os
import threading

import pytest

from image_classification.records.datafile import (INT_LIMIT, MAX_DEPTH, DataFileError, parse_json, read_json,
                                           read_regular)


@pytest.mark.parametrize("text,words", [
    ("[" * 100_000, f"nests its values more than {MAX_DEPTH} levels deep (line 1)"),  # was a RecursionError
    ('{"samples": ' + "1" + "0" * 30 + "}", "holds the whole number 100000000000000000000000..., beyond what a "
                                            "64-bit integer holds"),
    (f'[{INT_LIMIT}]', f"holds the whole number {INT_LIMIT}, beyond"),
    ('{"x": 1e999}', "holds the number 1e999, which is not finite"),
    ("[NaN]", "holds the number NaN, which is not finite"),
    ('{"a": [1, 2}', "is not JSON (Expecting ',' delimiter: line 1 column 12)"),
    (b'{"caf\xe9": 1}', "is not UTF-8 text (byte 6 is not)"),
])
def test_json_outside_the_bounds_is_one_sentence(text, words):
    with pytest.raises(DataFileError) as refused:
        parse_json(text, 1 << 20)
    assert str(refused.value).startswith(words), str(refused.value)


def test_json_within_the_bounds_reads_as_json_does():
    nested = "[" * (MAX_DEPTH - 1) + '{"a": "[[[[\\"]]"}' + "]" * (MAX_DEPTH - 1)
    value = parse_json(nested, 1 << 20)
    for _ in range(MAX_DEPTH - 1):
        (value,) = value
    assert value == {"a": '[[[["]]'}  # brackets inside strings do not nest
    assert parse_json(f"[{-INT_LIMIT}, {INT_LIMIT - 1}, 0.5]", 100) == [-INT_LIMIT, INT_LIMIT - 1, 0.5]
    assert str(parse_json("[NaN, Infinity]", 100, allow_nonfinite=True)) == "[nan, inf]"
    with pytest.raises(DataFileError, match="holds more than 10 bytes"):
        parse_json("[" + "1, " * 10 + "1]", 10)


def test_a_link_a_fifo_a_folder_and_a_large_file_are_refused_without_waiting(tmp_path):
    real = tmp_path / "real.json"
    real.write_text('{"ok": true}')
    (tmp_path / "link.json").symlink_to(real)
    os.mkfifo(tmp_path / "fifo.json")
    outcome = {}

    def read_all():  # in a thread: a regression that waits on the FIFO fails below instead of hanging
        for name in ("real.json", "link.json", "fifo.json", ".", "missing.json"):
            try:
                outcome[name] = read_json(tmp_path / name, 100)
            except DataFileError as error:
                outcome[name] = str(error)

    reading = threading.Thread(target=read_all, daemon=True)
    reading.start()
    reading.join(timeout=30)
    assert outcome == {"real.json": {"ok": True}, "link.json": "is a symbolic link",
                       "fifo.json": "is not a regular file (a folder, a device or a pipe)",
                       ".": "is not a regular file (a folder, a device or a pipe)", "missing.json": "does not exist"}
    assert read_regular(tmp_path / "link.json", follow_links=True) == real.read_bytes()
    with pytest.raises(DataFileError, match="holds more than 11 bytes"):
        read_regular(real, 11)
