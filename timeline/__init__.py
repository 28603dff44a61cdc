"""timeline: a trace-driven GPU memory timeline simulator for large-model training.

The package is a stack of one-way layers (see README): ``spec → profiles → graph → pipeline → alloc →
sim → result → exporters → cli``, with ``io`` at the edge. Importing the package does no work.
"""

__version__ = "0.1.0"
