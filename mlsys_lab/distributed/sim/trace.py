"""The simulator's timeline record: a :class:`~mlsys_lab.span.Span` per compute, send and receive
(what the cluster-timeline and collective widgets draw)."""

from ...span import Span

__all__ = ["spans", "trace_span"]


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


def TraceEvent(rank, kind, start, end, nbytes, src, dst, link):  # noqa: N802 - the loop's name
    """What the event loop (``engine.py``, ``batch.py``) appends while it runs: the arguments of
    :func:`trace_span` as a plain tuple, which costs a sixth of a Span; ``Result.trace`` makes
    the spans (:func:`spans`) when it is first read, so a run nobody draws pays almost nothing
    for its trace."""
    return (rank, kind, start, end, nbytes, src, dst, link)


def spans(recorded):
    """The :class:`~mlsys_lab.span.Span` of each tuple :func:`TraceEvent` recorded, in order."""
    return [trace_span(*fields) for fields in recorded]
