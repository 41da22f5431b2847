"""``python -m mmvit_ext.config_files [NAME ...]``: the path of each shipped config named, or
every config's relative name."""
import sys
from typing import List

from . import config_path, list_configs


def main(argv: List[str]) -> int:
    if not argv:
        print('\n'.join(list_configs()))
        return 0
    try:
        for name in argv:
            print(config_path(name))
    except FileNotFoundError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
