"""The defragmentation room: the fewest moves that free room for a pod waiting on
scattered shares (``defrag``), its vocabulary (``defrag_parts``) and the books as the
planner reads and changes them on an overlay (``defrag_books``). On top of the cycle.
"""
