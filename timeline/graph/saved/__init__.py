"""Saved-tensor tables: per profile, what each forward op keeps for its backward (DESIGN §5).

A :class:`SavedTable` maps an op *rule* (``linear``, ``rmsnorm``, ``flash_attn``, …) to a
:class:`SaveRule`: the slots it saves (``in:x``, ``out:y``, ``extra:mask``), which of them only
the weight gradient needs (those stay alive until the W pass), and the source it follows. A
table also carries the few structural choices a framework makes for its ops (eager or flash
attention, dropout, fused norms, the MoE token convention) so op builders consult a table, never
the profile's name. Parameter facts are not here (:mod:`timeline.graph.profiles`).

Adding a profile: write ``saved/<name>.py`` defining ``TABLE = SavedTable(...)`` and register it,
with its parameter rules, in :data:`timeline.graph.framework.FRAMEWORKS`.
"""

from __future__ import annotations

from timeline.graph.saved.table import SavedTable, SaveRule

__all__ = ["SaveRule", "SavedTable"]
