"""CI runs the README's first two commands, then the stack runs the README names; the other stacks
are run by hand."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_commands_and_the_stacks_page_names_the_others():
    readme = (ROOT / 'README.md').read_text()
    block = next(b for b in re.findall(r'```bash\n(.*?)```', readme, re.S) if 'tools/demo.sh' in b)
    readme_cmds = [line.strip() for line in block.splitlines() if line.strip()][:2]
    ci_lines = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()
                if line.strip() and not line.startswith(('#', 'set ', 'cd '))]
    assert len(readme_cmds) == 2
    assert ci_lines[:2] == readme_cmds  # the README's two commands first, in its order
    for line in ci_lines[2:]:  # then the stack runs the README names for CI
        assert re.fullmatch(r'bash tools/test_stack\.sh (pinned|newest)', line), line
        assert f'then `{line}`' in readme or f'`{line}`' in readme, line
    # the page on the stacks names the script of each stack run by hand, with its requirements
    install = (ROOT / 'docs' / 'install.md').read_text()
    for stack in ('oldest', 'newest'):
        assert (ROOT / 'requirements' / f'{stack}.txt').is_file()
        assert f'tools/test_stack.sh {stack}' in install
