"""The README's first two commands are what CI runs; beside them it runs one more tested stack."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_commands_and_one_more_stack():
    readme = (ROOT / 'README.md').read_text()
    block = next(b for b in re.findall(r'```bash\n(.*?)```', readme, re.S) if 'tools/demo.sh' in b)
    readme_cmds = [line.strip() for line in block.splitlines() if line.strip()][:2]
    ci_lines = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()
                if line.strip() and not line.startswith(('#', 'set ', 'cd '))]
    assert len(readme_cmds) == 2
    at = [ci_lines.index(cmd) for cmd in readme_cmds]
    assert at == sorted(at)  # both, in the README's order
    rest = [line for line in ci_lines if line not in readme_cmds]
    # everything else in .ci/run is one more stack's leg: started, waited for, reported
    started = [line for line in rest if 'tools/test_stack.sh' in line]
    assert len(started) == 1 and started[0].endswith('& leg=$!')
    stack = re.search(r'tools/test_stack\.sh (\w+)', started[0]).group(1)
    assert (ROOT / 'requirements' / f'{stack}.txt').is_file()
    assert any(line.startswith('status=0; wait "$leg"') for line in rest)
    assert rest[-1] == 'exit "$status"'
    # the page on the stacks names the script, the leg CI runs and the one it leaves to a person
    install = (ROOT / 'docs' / 'install.md').read_text()
    assert f'tools/test_stack.sh {stack}' in install
    for other in {'oldest', 'newest'} - {stack}:
        assert f'tools/test_stack.sh {other}' in install
