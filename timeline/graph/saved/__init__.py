"""Saved-tensor tables: per profile, what each forward op keeps for its backward (DESIGN §5).

A :class:`SavedTable` maps an op *rule* (``linear``, ``rmsnorm``, ``flash_attn``, …) to a
:class:`SaveRule`: the slots it saves (``in:x``, ``out:y``, ``extra:mask``), which of them only
the weight gradient needs (those stay alive until the W pass), and the source it follows. A
table also carries the few structural choices a framework makes (eager or flash attention,
dropout, fused norms, the MoE token convention) so layer builders consult a table, never the
profile's name.

Adding a profile: write ``saved/<name>.py`` defining ``TABLE = SavedTable(...)`` and add it to
:data:`TABLES` (a test checks every profile run validation accepts has a table).
"""

from __future__ import annotations

from timeline.graph.saved import hf, megatron, paper
from timeline.graph.saved.table import SavedTable, SaveRule

__all__ = ["TABLES", "SaveRule", "SavedTable", "saved_table"]

#: profile name -> table; a new profile's rules file registers here
TABLES: dict[str, SavedTable] = {"paper": paper.TABLE, "megatron": megatron.TABLE, "hf": hf.TABLE}


def saved_table(profile: str) -> SavedTable:
    """The saved-tensor table of ``profile`` (every profile of :data:`timeline.spec.profiles.PROFILES` has one)."""
    return TABLES[profile]
