"""How many units generate-and-test replaces per step, counted on the host (:mod:`cl_lightning.nn.gnt`).

A layer's replacement count depends only on how many of its units are eligible (older than the maturity threshold),
and that only on past counts: every unit ages by one per step and a replaced unit restarts at 0. :class:`HostCounts`
keeps that on the host, so :class:`~cl_lightning.nn.gnt.GenerateAndTest` knows each count without a device read.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class HostCounts:
    """Host copy of what a layer's replacement count depends on: eligible units, the ages of the others, the carry."""

    clock: int = 0  # steps tested
    eligible: int = 0  # units with age > maturity threshold
    young: deque[list[int]] = field(default_factory=deque)  # [clock at age 0, units], oldest first
    carried: float = 0.0  # to_replace_i

    def tick(self, threshold: int) -> int:
        """One step older (``age += 1``): the young units now past ``threshold`` become eligible."""
        self.clock += 1
        while self.young and self.clock - self.young[0][0] > threshold:
            self.eligible += self.young.popleft()[1]
        return self.eligible

    def replace(self, count: int) -> None:
        """``count`` eligible units restart at age 0."""
        self.eligible -= count
        self.young.append([self.clock, count])

    @classmethod
    def from_ages(cls, age: Tensor, threshold: int, carried: float) -> HostCounts:
        """Rebuild from a layer's ages (read once, on load)."""
        ages = Counter(age.tolist())
        young = deque([-a, n] for a, n in sorted(ages.items(), reverse=True) if a <= threshold)
        return cls(0, sum(n for a, n in ages.items() if a > threshold), young, carried)
