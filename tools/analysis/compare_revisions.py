"""Time the same benchmark at several revisions of this repository in one run, alternated.

Each variant is ``LABEL=REV`` or ``LABEL=REV+ARGS`` (REV ``.``: this checkout as it is;
``last-with:PATH``: the last revision that holds PATH) (extra benchmark arguments for that variant,
e.g. ``compiled=HEAD+--compile``). Every revision gets a detached git worktree (reused between
runs); the variants' benchmark processes run in turn, ``--rounds`` times (A B C A B C ...), so a
drifting machine or a busy neighbour affects each alike. Each round's per-model medians are
read from benchmark.py's table; the table printed holds the median over rounds, and every
variant's time as a ratio to the first variant's.

Example (the 0.2.0 CPU kernels against the plain code, and the plain code compiled):
    python tools/analysis/compare_revisions.py kernels=last-with:mmvit_ext/ops plain=. compiled=.+--compile \\
        --rounds 2 -- swin:tiny --against pvtv2:b2 --batch 1 --warmup 1 --repeat 3
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r'^\| (\S+) \| (fwd|fwdbwd) \| (\d+\.\d+) \|')


def parse_args() -> Tuple[argparse.Namespace, List[str]]:
    argv = sys.argv[1:]
    bench = argv[argv.index('--') + 1:] if '--' in argv else []
    argv = argv[:argv.index('--')] if '--' in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('variants', nargs='+', metavar='LABEL=REV[+ARGS]')
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--worktrees', default=str(Path.home() / '.cache' / 'mmvit_ext' /
                                                    'revisions'))
    args = parser.parse_args(argv)
    if not bench:
        parser.error('give the benchmark arguments after --')
    return args, bench


def git(*args: str) -> str:
    return subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def worktree(rev: str, base: Path) -> Path:
    """A detached worktree at ``rev`` (resolved to its commit), made once; ``.`` is this
    checkout as it is, uncommitted changes included."""
    if rev == '.':
        return ROOT
    if rev.startswith('last-with:'):  # the last revision holding PATH (before its removal)
        path = rev.split(':', 1)[1]
        last = git('log', '-1', '--format=%H', '--', path)
        if not last:
            sys.exit(f'error: no revision holds {path}')
        has = subprocess.run(['git', 'cat-file', '-e', f'{last}:{path}'], cwd=ROOT,
                             capture_output=True).returncode == 0
        rev = last if has else f'{last}^'
    commit = git('rev-parse', '--verify', f'{rev}^{{commit}}')
    path = base / commit[:12]
    if not (path / 'tools' / 'analysis' / 'benchmark.py').exists():
        base.mkdir(parents=True, exist_ok=True)
        subprocess.run(['git', 'worktree', 'add', '--detach', '--force', str(path), commit],
                       cwd=ROOT, check=True, capture_output=True)
    return path


def run_variant(path: Path, bench: List[str]) -> Dict[Tuple[str, str], float]:
    env = {**os.environ, 'PYTHONPATH': str(path)}
    result = subprocess.run([sys.executable, 'tools/analysis/benchmark.py', *bench], cwd=path,
                            env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f'error: benchmark failed in {path}:\n{result.stderr[-3000:]}')
    times = {}
    for line in result.stdout.splitlines():
        match = ROW.match(line)
        if match:
            times[match.group(1), match.group(2)] = float(match.group(3))
    return times


def main() -> None:
    args, bench = parse_args()
    variants = []
    for item in args.variants:
        label, sep, spec = item.partition('=')
        if not sep or not label:
            sys.exit(f'error: variants are LABEL=REV[+ARGS], got {item!r}')
        rev, _, extra = spec.partition('+')
        variants.append((label, worktree(rev, Path(args.worktrees)), shlex.split(extra)))
    rounds: Dict[str, List[Dict[Tuple[str, str], float]]] = {label: [] for label, _, _ in variants}
    for r in range(args.rounds):
        for label, path, extra in variants:
            rounds[label].append(run_variant(path, bench + extra))
            print(f'[round {r + 1}/{args.rounds}] {label} ({path.name}) done', file=sys.stderr)
    keys = list(rounds[variants[0][0]][0])
    labels = [label for label, _, _ in variants]
    print(f'benchmark.py {" ".join(bench)}; {args.rounds} rounds, variants alternated')
    print('; '.join(f'{label}: {path.name}{" " + " ".join(extra) if extra else ""}'
                    for label, path, extra in variants) + '\n')
    print('| model | mode | ' + ' | '.join(f'{label} s' for label in labels) + ' | ' +
          ' | '.join(f'{label} / {labels[0]}' for label in labels[1:]) + ' |')
    print('|---|---|' + '---|' * (2 * len(labels) - 1))
    for key in keys:
        med = [statistics.median(run[key] for run in rounds[label]) for label in labels]
        print(f'| {key[0]} | {key[1]} | ' + ' | '.join(f'{m:.3f}' for m in med) + ' | ' +
              ' | '.join(f'{m / med[0]:.2f}x' for m in med[1:]) + ' |')


if __name__ == '__main__':
    main()
