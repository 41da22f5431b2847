"""The README's first two commands are what CI runs."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_commands():
    readme = (ROOT / 'README.md').read_text()
    block = re.search(r'```bash\n(.*?)```', readme, re.S).group(1)
    readme_cmds = [line.strip() for line in block.splitlines() if line.strip()][:2]
    ci_cmds = [line.strip() for line in (ROOT / '.ci' / 'run').read_text().splitlines()
               if line.strip() and not line.startswith(('#', 'set ', 'cd '))]
    assert len(readme_cmds) == 2
    assert ci_cmds == readme_cmds
