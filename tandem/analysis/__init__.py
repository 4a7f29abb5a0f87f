"""Analyses of evaluation outputs: displaced vocabulary (``displacement``) and the loading and
plotting helpers the notebooks call (``report``).

What this file leaves out: everything; import the modules themselves.
"""
