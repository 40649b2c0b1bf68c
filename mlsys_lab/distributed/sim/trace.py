"""The simulator's timeline record (what the cluster-timeline and collective widgets read)."""

from collections import namedtuple

__all__ = ["TraceEvent"]

TraceEvent = namedtuple("TraceEvent", "rank kind start end bytes src dst link")
TraceEvent.__doc__ = """One interval of the timeline: ``kind`` is ``compute``, ``send`` (a
transfer, on the sender's row, ``link`` the names of the link directions it held), or ``recv``
(from posting to completion, on the receiver's row)."""
