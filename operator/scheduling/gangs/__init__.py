"""The gangs room: the pods of an upstream PodGroup decided as one unit (``gangs``),
and a gang that fits only by preempting (``gang_preemption``). On top of the cycle.
"""
