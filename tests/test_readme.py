"""The README's first two commands are what CI runs; beside them it runs only the oldest stack."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_commands_and_the_oldest_stack():
    readme = (ROOT / 'README.md').read_text()
    block = re.search(r'```bash\n(.*?)```', readme, re.S).group(1)
    readme_cmds = [line.strip() for line in block.splitlines() if line.strip()][:2]
    ci_lines = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()
                if line.strip() and not line.startswith(('#', 'set ', 'cd '))]
    assert len(readme_cmds) == 2
    at = [ci_lines.index(cmd) for cmd in readme_cmds]
    assert at == sorted(at)  # both, in the README's order
    rest = [line for line in ci_lines if line not in readme_cmds]
    # everything else in .ci/run is the oldest stack's leg: started, waited for, reported
    started = [line for line in rest if 'tools/test_oldest.sh' in line]
    assert len(started) == 1 and started[0].endswith('& oldest=$!')
    assert any(line.startswith('status=0; wait "$oldest"') for line in rest)
    assert rest[-1] == 'exit "$status"'
    assert 'tools/test_oldest.sh' in (ROOT / 'docs' / 'install.md').read_text()
