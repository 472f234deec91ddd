"""The rendezvous of a job step started by SLURM's ``srun``, whose processes no launcher gave
``MASTER_ADDR`` and ``MASTER_PORT``: the step's first node, found from SLURM's own variables without
``scontrol``.  :func:`~image_classification.system.runtime.make_runtime` takes them when it joins the
process group.  Standard library only.
"""

from __future__ import annotations

import os
from typing import Mapping

DEFAULT_SLURM_PORT = 29500


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: ``a[1-2,5],b`` -> ``['a[1-2,5]', 'b']``."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def first_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist, expanded without ``scontrol``.

    ``node[01-04],other`` -> ``node01``; ``rack[1-2]-gpu[3,5]`` -> ``rack1-gpu3``; ``host`` -> ``host``.
    """
    entries = _split_top_level(nodelist)
    if not entries:
        raise ValueError("empty SLURM node list")
    host, rest = [], entries[0]
    while "[" in rest:
        prefix, _, after = rest.partition("[")
        ranges, closing, rest = after.partition("]")
        if not closing:
            raise ValueError(f"unbalanced brackets in SLURM node list {nodelist!r}")
        first_range = ranges.split(",")[0].strip()
        host += [prefix, first_range.split("-")[0]]  # "01-04" -> "01", keeping the zero padding
    host.append(rest)
    return "".join(host)


def slurm_rendezvous_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` for a job step started by ``srun``; {} outside one.

    The address is the step's first node (``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``); the
    port is 29500, or ``MASTER_PORT`` when the user exported one.  Values already in the environment
    are returned unchanged, so an explicit ``MASTER_ADDR`` wins.
    """
    environ = os.environ if environ is None else environ
    nodelist = next((environ[key] for key in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                     if environ.get(key)), None)
    if "SLURM_PROCID" not in environ or not nodelist:
        return {}
    return {
        "MASTER_ADDR": environ.get("MASTER_ADDR") or first_host(nodelist),
        "MASTER_PORT": environ.get("MASTER_PORT") or str(DEFAULT_SLURM_PORT),
    }
