"""The one way this package derives a random seed from the run's seed and a position in the run.

Every stream (the process generators, the sampler's shuffle, each sample's augmentation on every
backend, DALI's included, synthetic data) takes its seed from :func:`mix_seed`, and a resumed run
recomputes each one from the counters its checkpoint records. The weights are distinct primes; the
sums are the ones every earlier version used, so checkpoints written before this module existed resume
with the same random streams.
"""

from __future__ import annotations

WEIGHTS = (1_000_003, 7_919, 104_729)
SEED_MODULUS = 2**63 - 1  # torch and numpy take 63-bit seeds; python's random takes any


def mix_seed(base: int, *terms: int, modulus: int = SEED_MODULUS) -> int:
    """``base`` plus each term times its weight (1,000,003, 7,919, 104,729, in order), modulo ``modulus``."""
    if len(terms) > len(WEIGHTS):
        raise ValueError(f"mix_seed takes at most {len(WEIGHTS)} terms besides the base, got {len(terms)}")
    return (base + sum(term * weight for term, weight in zip(terms, WEIGHTS))) % modulus
