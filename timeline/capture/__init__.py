"""Capture front-end (DESIGN §4): record a PyTorch module's operator trace on fake CPU tensors.

Needs the ``capture`` extra (``pip install -e '.[capture]'``: CPU torch and transformers). Nothing
outside this package imports torch; the CLI imports it lazily. Modules: :mod:`.recorder` (what is
recorded), :mod:`.gpu` (GPU kernel emulation), :mod:`.run` (one training step), :mod:`.hf`
(Hugging Face models from a config).
"""
