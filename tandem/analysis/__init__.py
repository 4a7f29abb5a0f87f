"""Analyses of evaluation outputs: displaced vocabulary (``displacement``), the paper's claims
and how they are judged (``claims``), the study page (``study``), and the loading and plotting
helpers the notebooks call (``report``).

What this file leaves out: everything; import the modules themselves.
"""
