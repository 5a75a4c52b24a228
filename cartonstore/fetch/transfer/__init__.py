"""The transfer engine: one blob downloaded from its URLs into a
BlobWriter, resumed, decoded and verified (download.py), and what moves is
counted (stats.py). Imports fetch/http/ and store/.
"""
