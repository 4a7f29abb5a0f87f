"""Analyses of evaluation outputs: the study of the paper's claims (``study``, which measures its
inputs in ``measure`` and ``problems`` and renders them in ``page`` and ``sections``), how a
claim is read (``claims``, ``estimates``) from one model of seed and problem variance
(``mixed``, calibrated on the simulated studies of ``simulate``), the committed inputs of a page
(``inputs``), the displaced vocabulary (``displacement``, the paper's statistics; ``pullback``,
direction apart from size), the notation world's mechanism (``notation``) and the loading and
plotting helpers the notebooks call (``report``).

What this file leaves out: everything; import the modules themselves.
"""
