"""Loops of imports, for the tests that keep imports running one way: the parent package's
(tests/test_layers.py) and the worker side's (tests/test_compat.py)."""

from __future__ import annotations

from typing import TypeVar

Node = TypeVar("Node")  # a module's name, or its file


def circles(graph: dict[Node, set[Node]]) -> list[list[Node]]:
    """Each loop of imports once, as the nodes along it (depth first: a node met again on the walk
    that reached it closes a loop)."""
    found: list[list[Node]] = []
    done: set[Node] = set()

    def walk(node: Node, trail: list[Node]) -> None:
        if node in trail:
            loop = trail[trail.index(node):]
            if set(loop) not in [set(known) for known in found]:
                found.append(loop)
            return
        if node in done:
            return
        for imported in sorted(graph.get(node, ()), key=str):
            walk(imported, [*trail, node])
        done.add(node)

    for node in sorted(graph, key=str):
        walk(node, [])
    return found
