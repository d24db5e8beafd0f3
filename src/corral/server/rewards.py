"""Reward histograms for ``/metrics``: each step's reward and each named component.

Fed every observation the server returns; exported as the histograms
``corral_step_reward`` and ``corral_reward_component{component="..."}``. Prometheus
drops a histogram's ``_sum`` when it has negative buckets (penalties need them), so the
running sums are exported beside them as the gauges ``corral_step_reward_running_sum``
and ``corral_reward_component_running_sum``; the ``+Inf`` bucket is the count. The
number of component names tracked is bounded (:data:`MAX_COMPONENTS`): names beyond it
are counted under ``_other``, so an environment inventing names cannot grow the
server's memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from corral.contract import Observation
from corral.server.stats import Histogram

REWARD_BUCKETS: tuple[float, ...] = (
    -10.0,
    -5.0,
    -2.0,
    -1.0,
    -0.5,
    -0.25,
    -0.1,
    0.0,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
    10.0,
)
"""Upper bounds of the reward histograms."""

MAX_COMPONENTS = 64
"""Distinct component names tracked; further names share the ``_other`` series."""

OTHER = "_other"


class RewardStats:
    """Histograms of step rewards and of reward components."""

    def __init__(self) -> None:
        self.reward = _histogram()
        self.components: dict[str, Histogram] = {}

    def observe(self, observation: Observation) -> None:
        """Count ``observation``'s reward and components (non-finite values are skipped)."""
        reward = observation.reward
        if reward is not None and math.isfinite(reward):
            self.reward.observe(reward)
        self._components(observation)

    def observe_many(self, rewards: list[float], components: list[Observation]) -> None:
        """A batch's finite ``rewards`` in one go, and the components of the observations
        that carry some (``components``): :meth:`observe` for each of its observations."""
        if rewards:
            self.reward.observe_many(rewards)
        for observation in components:
            self._components(observation)

    def _components(self, observation: Observation) -> None:
        for name, value in observation.reward_components.items():
            if not math.isfinite(value):
                continue
            histogram = self.components.get(name)
            if histogram is None:
                key = name if len(self.components) < MAX_COMPONENTS else OTHER
                histogram = self.components.setdefault(key, _histogram())
            histogram.observe(value)


class RewardCollector(Collector):
    """Exports one :class:`RewardStats`."""

    def __init__(self, stats: RewardStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        """The histograms and their running sums."""
        reward = HistogramMetricFamily(
            "corral_step_reward", "Rewards of steps and resets (those that have one)."
        )
        reward.add_metric([], self.stats.reward.cumulative(), sum_value=self.stats.reward.total)
        yield reward
        yield GaugeMetricFamily(
            "corral_step_reward_running_sum",
            "Sum of all step and reset rewards.",
            value=self.stats.reward.total,
        )
        parts = HistogramMetricFamily(
            "corral_reward_component",
            "Named reward components (Observation.reward_components).",
            labels=["component"],
        )
        sums = GaugeMetricFamily(
            "corral_reward_component_running_sum",
            "Sum of each named reward component.",
            labels=["component"],
        )
        for name, histogram in sorted(self.stats.components.items()):
            parts.add_metric([name], histogram.cumulative(), sum_value=histogram.total)
            sums.add_metric([name], histogram.total)
        yield parts
        yield sums


def _histogram() -> Histogram:
    return Histogram(bounds=REWARD_BUCKETS, counts=[0] * (len(REWARD_BUCKETS) + 1))
