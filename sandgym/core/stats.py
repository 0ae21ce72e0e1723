"""Group statistics: unbiased pass@k and group-normalised advantages."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), from n samples of which c
    passed. Computed as a stable product, never with huge binomials."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n} c={c}")
    if k < 1 or k > n:
        raise ValueError(f"need 1 <= k <= n, got n={n} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def ks_for(n: int) -> list[int]:
    """The k values an eval with n rollouts per example reports: powers of two, and n."""
    ks = [1 << i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    if n >= 1 and n not in ks:
        ks.append(n)
    return ks


def group_advantages(rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6) -> list[float]:
    """GRPO advantages of one rollout group: reward minus the group mean, divided by
    (std + eps) when `normalize_std` (population std, as in Dr. GRPO's analysis and TRL);
    without it the reward scale is kept (Dr. GRPO). A group whose rewards are all equal (std
    below eps) gets zeros: it teaches nothing. Rubrics and the trainer both call this."""
    if not rewards:
        return []
    n = len(rewards)
    mean = sum(rewards) / n
    centered = [r - mean for r in rewards]
    if not normalize_std:
        return centered
    std = math.sqrt(sum(x * x for x in centered) / n)
    if std < eps:
        return [0.0] * n
    return [x / (std + eps) for x in centered]
