"""A carton out of the store: read-only model directories of hardlinks,
planned then built (tree.py), and a carton held in the store seen as a
CartonView for export (export_view.py). Imports store/root/, content/,
metadata/.
"""
