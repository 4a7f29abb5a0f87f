"""The evaluation pipeline behind ``python -m tandem.evaluate``: eval sets, sampling, teacher
forcing for drift and legibility, records and result tables.

What this file leaves out: everything; import the modules themselves.
"""
