"""No import cycle among the project's modules.

A cycle is usually dodged with an import inside a function, which hides it
from the import contracts; this reads every import, at any depth, and finds
the modules that reach each other.
"""

from __future__ import annotations

import grimp

PACKAGES = ("gateway", "backends", "specgate", "domains")


def cycles(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """Each pair of modules where one imports the other directly and the other reaches back."""
    found = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(importer=imported, imported=module):
                found.add((min(module, imported), max(module, imported)))
    return found


def test_no_module_reaches_back_to_a_module_that_imports_it() -> None:
    assert cycles(grimp.build_graph(*PACKAGES, cache_dir=None)) == set()


def test_a_cycle_is_found_however_deep_the_import_that_closes_it() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in (("a.cli", "a.impl"), ("a.impl", "a.helpers"), ("a.helpers", "a.cli"), ("a.x", "a.impl")):
        graph.add_import(importer=importer, imported=imported)
    assert cycles(graph) == {("a.cli", "a.impl"), ("a.helpers", "a.impl"), ("a.cli", "a.helpers")}
