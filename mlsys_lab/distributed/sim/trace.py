"""The simulator's timeline record: a :class:`~mlsys_lab.span.Span` per compute, send and receive
(what the cluster-timeline and collective widgets draw)."""

from ...span import Span

__all__ = ["trace_span"]


def trace_span(rank, kind, start, end, nbytes, src, dst, link):
    """The :class:`~mlsys_lab.span.Span` of one interval of rank ``rank``'s timeline.

    ``kind`` is ``"compute"``, ``"send"`` (a transfer, from its start on the link to its arrival,
    on the sender's row; ``link`` the names of the link directions it held) or ``"recv"`` (from
    posting to completion, on the receiver's row). The lane is ``"rank N"``, the name
    ``"compute"`` or ``"send 0->1, 1024 B"``; the details ``rank``, ``bytes``, ``src``, ``dst`` and
    ``link`` are readable as attributes (``span.rank``, ``span.bytes``).
    """
    name = kind if kind == "compute" else f"{kind} {src}->{dst}, {nbytes} B"
    return Span(f"rank {rank}", name, start, end, kind,
                {"rank": rank, "bytes": nbytes, "src": src, "dst": dst, "link": link})


#: The name the event loop (``engine.py``, ``batch.py``) records with; a Span, not a class.
TraceEvent = trace_span
