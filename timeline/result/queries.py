"""Queries over a whole Timeline that the CLI and the exporters share: which device is worst, and
why a device peaks (the data of the ``worst: pp rank 0 …`` line under ``timeline simulate``'s
table). Pure: they return numbers and names; the callers format them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from timeline.result.categories import STATIC_CATEGORIES
from timeline.result.timeline import DeviceInfo, Peak, Timeline


def worst_device(tl: Timeline, among: Iterable[int] | None = None) -> int:
    """The device (index) with the highest peak reserved bytes, the first on ties; ``among``
    limits the choice (default: every device)."""
    return max(range(tl.num_devices) if among is None else among, key=lambda i: (tl.peak(i).reserved_bytes, -i))


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakExplanation:
    """Why device ``index`` peaks: its requested peak, the action running then, the (stage,
    micro-batch) pairs whose saved activations are live, and its largest live non-static tensors
    (dicts as :meth:`Timeline.top_tensors` returns them, largest first)."""

    index: int
    device: DeviceInfo
    peak: Peak
    action: str | None
    in_flight: tuple[tuple[int, int], ...]
    largest: tuple[dict, ...]

    @property
    def stages(self) -> list[int]:
        """The stages whose activations are in flight at the peak, in order."""
        return sorted({s for s, _ in self.in_flight})


def explain_peak(tl: Timeline, d: int, n: int = 3, *, search: int = 64) -> PeakExplanation:
    """Device ``d``'s :class:`PeakExplanation` with its ``n`` largest live tensors outside
    :data:`STATIC_CATEGORIES`, chosen among the ``search`` largest live tensors."""
    pk, ctx = tl.peak(d), tl.peak_context(d)
    largest = [t for t in tl.top_tensors(d, pk.event_index, search) if t["category"] not in STATIC_CATEGORIES][:n]
    return PeakExplanation(index=d, device=tl.devices[d], peak=pk, action=ctx["action"],
                           in_flight=tuple(ctx["in_flight"]), largest=tuple(largest))
