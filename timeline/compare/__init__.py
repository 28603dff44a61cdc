"""Comparing recompute policies: variants of a run, per-device metrics, and the fit search.

Sits between ``result`` (it builds Timelines) and ``exporters``/``cli`` (which print and write
what it returns). It does no file I/O and never prints; the plots (:mod:`.plots`) draw onto a
handle they are given and import matplotlib only inside their functions.
"""
