"""Device placement: which devices the simulation stands for, the chunks each holds and the
static state (parameters, weights, gradients, optimizer bytes) it keeps.

Between ``pipeline`` (which orders actions and places chunks on pipeline ranks) and ``sim``
(which times them): it reads the graph for the parameters of each rank's chunks. No time, no
file I/O.
"""

from __future__ import annotations

from timeline.placement.devices import StaticDevice, chunk_holders, ep_devices, static_devices

__all__ = ["StaticDevice", "chunk_holders", "ep_devices", "static_devices"]
