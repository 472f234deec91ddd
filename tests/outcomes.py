"""Each test's outcome as it ends, one JSON line each, in the file that ``IC_TEST_OUTCOMES`` names.

A run that is killed (a step's time limit, a machine taken back) keeps every outcome it reached, where pytest's
JUnit XML is written only at the end.  Only the controlling process writes: under pytest-xdist the workers'
reports reach it too.  A plugin: ``python -m pytest -p outcomes`` with tests/ on ``PYTHONPATH`` loads it into any
run (scripts/gpu_report.py's tests step does).  Standard library only.
"""

from __future__ import annotations

import json
import os
import sys

OUTCOMES_ENV = "IC_TEST_OUTCOMES"
TRACEBACK_LINES = 15  # of a failure's report, the last lines kept


def outcome_record(report) -> dict | None:
    """The line of ``report`` (a test's setup, call or teardown, or a module's collection), or None where that
    phase says nothing of its own (a setup or teardown that passed)."""
    when = getattr(report, "when", "collect")
    if report.passed and when != "call":
        return None
    record = {"test": report.nodeid, "phase": when, "seconds": round(getattr(report, "duration", 0.0), 3)}
    if hasattr(report, "wasxfail"):
        record["outcome"] = "xfailed" if report.skipped else "xpassed"
        if report.wasxfail:
            record["reason"] = str(report.wasxfail).removeprefix("reason: ")
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        record.update(outcome="skipped", reason=str(reason).removeprefix("Skipped: "))
    elif report.failed:
        lines = str(report.longrepr).rstrip().splitlines()
        crash = getattr(report.longrepr, "reprcrash", None)  # the exception's own line, where pytest has it
        message = crash.message if crash is not None else (lines[-1] if lines else "")
        record.update(outcome="failed" if when == "call" else "error", message=message.splitlines()[0][:500]
                      if message else "", traceback="\n".join(lines[-TRACEBACK_LINES:]))
    else:
        record["outcome"] = "passed"
    return record


_failed: list[str] = []  # why the file could not be written, once: the tests run on without it
_worker: list[bool] = []  # whether this process is an xdist worker, whose controller writes its tests' lines


def pytest_configure(config):
    # asked of pytest, not of PYTEST_XDIST_WORKER: a pytest started by a test that an xdist worker runs inherits
    # that variable, and is a controller of its own
    _worker.append(hasattr(config, "workerinput"))


def _write(report) -> None:
    path = os.environ.get(OUTCOMES_ENV)
    if not path or any(_worker) or _failed:
        return
    record = outcome_record(report)
    if record is None:
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:  # one line a write: a reader sees whole lines
            handle.write(json.dumps(record) + "\n")
    except OSError as error:
        _failed.append(str(error))
        print(f"\noutcomes: {OUTCOMES_ENV}={path} cannot be written ({error}); no outcome is recorded there",
              file=sys.stderr, flush=True)


def pytest_runtest_logreport(report):
    _write(report)


def pytest_collectreport(report):
    if not report.passed:  # a module that cannot be imported, or one skipped whole
        _write(report)
