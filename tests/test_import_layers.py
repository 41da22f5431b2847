"""The packages that hold a family's facts import in one direction: benchmark -> backbones ->
converters, never back, counting lazy (function-level) imports too: read from the source."""
import ast
from pathlib import Path
from typing import Dict, Set

import mmvit_ext

PACKAGES = ('backbones', 'converters', 'benchmark')
ROOT = Path(mmvit_ext.__file__).parent


def _imported_packages(path: Path, package: str) -> Set[str]:
    """The mmvit_ext subpackages ``path`` imports anywhere in its code (any depth)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                parts = ['mmvit_ext', package][:max(0, 2 - (node.level - 1))]
                target = '.'.join(parts + ([node.module] if node.module else []))
                names = [target] if node.module else [f'{target}.{a.name}' for a in node.names]
            else:
                names = [node.module or '']
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split('.')
            if parts[0] == 'mmvit_ext' and len(parts) > 1:
                found.add(parts[1])
    return found


def import_graph() -> Dict[str, Set[str]]:
    """package -> the other packages of :data:`PACKAGES` it imports."""
    graph = {}
    for package in PACKAGES:
        edges = set()
        for path in (ROOT / package).rglob('*.py'):
            edges |= _imported_packages(path, package)
        graph[package] = edges & set(PACKAGES) - {package}
    return graph


def test_resolves_relative_and_lazy_imports(tmp_path):
    source = tmp_path / 'mod.py'
    source.write_text('from ..converters import x\n'
                      'def f():\n    from ..benchmark.peers import load_peer\n'
                      '    import mmvit_ext.backbones.base\n    from . import sibling\n')
    assert _imported_packages(source, 'layers') == {'converters', 'benchmark', 'backbones',
                                                    'layers'}


def test_no_import_cycle_between_backbones_converters_and_benchmark():
    graph = import_graph()
    assert graph['converters'] == set(), graph
    assert graph['backbones'] <= {'converters'}, graph
    seen: Set[str] = set()

    def visit(package: str, path: tuple) -> None:
        assert package not in path, f'import cycle: {" -> ".join(path + (package,))}'
        if package in seen:
            return
        for target in graph[package]:
            visit(target, path + (package,))
        seen.add(package)

    for package in PACKAGES:
        visit(package, ())
