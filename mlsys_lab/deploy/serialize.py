"""Save and load a :class:`~mlsys_lab.engine.graph.Graph` without pickle.

The file is a zip archive: ``graph.json`` holds the values, nodes (op name, inputs, outputs,
attributes, source line) and structure, and ``arrays/<k>.npy`` each constant (read back with
``allow_pickle=False``). Attributes are written as tagged JSON (tuples, slices, Ellipsis,
dtypes, arrays and the subgraphs of ``cond`` keep their types), so any graph of registry ops
round-trips, training graphs and fused ones included. Kernel annotations (``node.meta``) are
not saved: operator selection writes them again. ONNX (:func:`~.onnx.export_onnx`) is
the interchange format; this one is mlsys_lab's own, for every op.
"""

import io
import json
import math
import pathlib
import zipfile
import zlib

import numpy as np

from ..engine.graph import Graph, Node, Value
from ..engine.registry import REGISTRY
from ..errors import ArgumentError, CheckpointError, MLSysError, UnknownNameError

FORMAT = "mlsys_lab.graph"
VERSION = 1
_TYPES = {"tuple": tuple, "list": list, "dict": dict}


class _Writer:
    """Encodes one graph (and its subgraphs) into JSON-ready objects plus arrays."""

    def __init__(self):
        self.arrays = []

    def array(self, arr):
        self.arrays.append(np.ascontiguousarray(arr))
        return len(self.arrays) - 1

    def value(self, v, where):  # noqa: C901 - one branch per tagged type
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, np.integer)) and not isinstance(v, np.bool_):
            return int(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return f if math.isfinite(f) else {"$float": repr(f)}
        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, tuple):
            return {"$tuple": [self.value(e, where) for e in v]}
        if isinstance(v, list):
            return [self.value(e, where) for e in v]
        if isinstance(v, dict):
            return {"$dict": [[self.value(k, where), self.value(e, where)] for k, e in v.items()]}
        if isinstance(v, slice):
            return {"$slice": [self.value(e, where) for e in (v.start, v.stop, v.step)]}
        if v is Ellipsis:
            return {"$ellipsis": True}
        if isinstance(v, np.dtype):
            return {"$dtype": v.str if v.kind != "b" else "bool"}
        if isinstance(v, np.ndarray):
            return {"$array": self.array(v)}
        if isinstance(v, Graph):
            return {"$graph": self.graph(v)}
        if isinstance(v, type) and v in _TYPES.values():
            return {"$type": v.__name__}
        raise ArgumentError(f"save_graph: {where} holds a {type(v).__name__} ({v!r:.60}), "
                            f"which the graph format cannot store")

    def graph(self, g):
        ids = {}
        values = []
        for v in g.values():
            ids[id(v)] = len(values)
            values.append({"name": v.name, "shape": list(v.shape), "dtype": v.dtype.str})
        nodes = []
        for n in g.nodes:
            where = f"node #{n.id} {n.op}"
            nodes.append({"op": n.op, "inputs": [ids[id(v)] for v in n.inputs],
                          "outputs": [ids[id(v)] for v in n.outputs], "source": n.source,
                          "attrs": {k: self.value(a, f"{where} attribute {k!r}")
                                    for k, a in n.attrs.items()}})
        return {"name": g.name, "values": values, "inputs": [ids[id(v)] for v in g.inputs],
                "consts": [[ids[id(v)], self.array(a)] for v, a in g.consts.items()],
                "nodes": nodes, "outputs": [ids[id(v)] for v in g.outputs],
                "out_tree": self.value(g.out_tree, "out_tree"),
                "in_tree": self.value(g.in_tree, "in_tree")}


def save_graph(graph, path):
    """Write ``graph`` to ``path`` (a zip of ``graph.json`` and ``.npy`` constants).

    Raises:
        ArgumentError: an attribute holds something the format cannot store (a function).
    """
    writer = _Writer()
    doc = {"format": FORMAT, "version": VERSION, "graph": writer.graph(graph)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("graph.json", json.dumps(doc))
        for k, arr in enumerate(writer.arrays):
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            z.writestr(f"arrays/{k}.npy", buf.getvalue())
    return pathlib.Path(path)


#: What zipfile, zlib and numpy raise on a damaged archive or member.
_DAMAGE = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError,
           RuntimeError, OSError, ValueError, UnicodeDecodeError)


class _Reader:
    def __init__(self, archive, where):
        self.archive, self.where = archive, where

    def bad(self, what):
        raise CheckpointError(f"load_graph: {self.where}: {what}")

    def member(self, name):
        """The bytes of archive member ``name`` (a CheckpointError when missing or damaged)."""
        try:
            return self.archive.read(name)
        except KeyError:
            self.bad(f"{name} is missing (not a saved graph?)")
        except _DAMAGE as e:
            self.bad(f"{name} is truncated or corrupted ({type(e).__name__}: {e})")

    def array(self, k):
        name = f"arrays/{int(k)}.npy"
        try:
            return np.load(io.BytesIO(self.member(name)), allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            self.bad(f"the array {name} is unreadable ({e})")

    def value(self, v):  # noqa: C901 - one branch per tag
        if isinstance(v, list):
            return [self.value(e) for e in v]
        if not isinstance(v, dict):
            return v
        if len(v) != 1:
            self.bad(f"an attribute object has keys {sorted(v)}")
        (tag, body), = v.items()
        if tag == "$tuple":
            return tuple(self.value(e) for e in body)
        if tag == "$dict":
            return {self.value(k): self.value(e) for k, e in body}
        if tag == "$slice":
            return slice(*(self.value(e) for e in body))
        if tag == "$ellipsis":
            return Ellipsis
        if tag == "$float":
            return float(body)
        if tag == "$dtype":
            return np.dtype(body)
        if tag == "$array":
            return self.array(body)
        if tag == "$graph":
            return self.graph(body)
        if tag == "$type" and body in _TYPES:
            return _TYPES[body]
        self.bad(f"unknown attribute tag {tag!r}")

    def graph(self, doc):
        try:
            values = [Value(v["name"], v["shape"], np.dtype(v["dtype"])) for v in doc["values"]]
            nodes = []
            for i, n in enumerate(doc["nodes"]):
                if n["op"] not in REGISTRY:
                    raise UnknownNameError(f"load_graph: {self.where}: node #{i} uses op "
                                           f"{n['op']!r}, which is not registered (define it "
                                           f"before loading)")
                nodes.append(Node(n["op"], [values[k] for k in n["inputs"]],
                                  {k: self.value(a) for k, a in n["attrs"].items()},
                                  [values[k] for k in n["outputs"]], n.get("source", "")))
            consts = {values[k]: self.array(a) for k, a in doc["consts"]}
            return Graph([values[k] for k in doc["inputs"]], nodes,
                         [values[k] for k in doc["outputs"]], consts,
                         self.value(doc["out_tree"]), self.value(doc["in_tree"]), doc["name"])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, UnknownNameError):
                raise
            self.bad(f"the graph description is malformed ({type(e).__name__}: {e})")


def load_graph(path):
    """Read a graph written by :func:`save_graph`; it is linted before it is returned.

    Raises:
        CheckpointError: the file is missing, truncated, corrupted or of another format.
        UnknownNameError: a node uses an op that is not registered.
    """
    where = repr(str(path))
    if not pathlib.Path(path).is_file():
        raise CheckpointError(f"load_graph: no file {where}")
    try:
        archive = zipfile.ZipFile(path)
    except _DAMAGE as e:
        raise CheckpointError(f"load_graph: {where} is truncated or corrupted, or not a saved "
                              f"graph ({type(e).__name__}: {e})") from None
    with archive:
        reader = _Reader(archive, where)
        try:
            doc = json.loads(reader.member("graph.json"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"load_graph: {where}: graph.json is corrupted ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CheckpointError(f"load_graph: {where} is not a {FORMAT} file")
        if doc.get("version") != VERSION:
            raise CheckpointError(f"load_graph: {where} has format version "
                                  f"{doc.get('version')!r}; this mlsys_lab reads {VERSION}")
        if not isinstance(doc.get("graph"), dict):
            raise CheckpointError(f"load_graph: {where} describes no graph")
        graph = reader.graph(doc["graph"])
    try:
        return graph.lint()
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        if isinstance(e, MLSysError):
            raise
        raise CheckpointError(f"load_graph: {where}: a node's attributes do not fit its op "
                              f"({type(e).__name__}: {e})") from None
