"""Diagrams of machine definitions, optionally with one instance's history drawn over them.

Pipeline: definition export (plain dict) -> :func:`build_graph` -> :class:`Graph`
-> :func:`to_dot` / :func:`to_mermaid` text, or :func:`render` to a file
(``.svg``/``.png`` through Graphviz's ``dot``, ``.dot``/``.gv``, ``.mmd``).
"""

from __future__ import annotations

from .dot import GraphvizNotFound, render, to_dot
from .mermaid import to_mermaid
from .model import Edge, Graph, Node, build_graph

__all__ = ["build_graph", "to_dot", "to_mermaid", "render",
           "Graph", "Node", "Edge", "GraphvizNotFound"]
