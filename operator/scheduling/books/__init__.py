"""The books: the cluster as the engine knows it. ``Books`` and its parts (nodes and
cards, the pods that hold shares and their allocations, DRA slices, claims and their
ledger, the allocation gate, holds and nominations), the one read view and the one writer
(``view``), the records they keep (``entries``, ``changes``), the ranking index, overlays
for what-ifs (``overlay``) and what metrics read (``usage``).

The books import the dialects (to book what a pod holds) and never the cycle. Others use
what ``__all__`` names.
"""
