"""Launch tools/train.py or tools/test.py on several processes: torchrun on this node (dist) or
srun on a Slurm cluster (slurm). Run by the launch scripts, whose interpreter (``$PYTHON``, else
the repository's .venv python) is the one every process runs:

  bash tools/dist_train.sh CONFIG NUM_PROCS [train.py args...]
  bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py args...]
  bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]
  bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]

dist reads NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1) and PORT (29500); gloo on CPU, nccl
on GPU. slurm reads GPUS (8), GPUS_PER_NODE (8), CPUS_PER_TASK (5) and SRUN_ARGS, and starts one
task per GPU: tools/train.py --launcher slurm reads the ranks from the SLURM_* variables.
"""
import os
import shlex
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
USAGE = {('dist', 'train'): 'CONFIG NUM_PROCS', ('dist', 'test'): 'CONFIG CHECKPOINT NUM_PROCS',
         ('slurm', 'train'): 'PARTITION JOB_NAME CONFIG WORK_DIR',
         ('slurm', 'test'): 'PARTITION JOB_NAME CONFIG CHECKPOINT'}


def command(how: str, tool: str, args: Sequence[str], env: Mapping[str, str] = os.environ,
            python: str = sys.executable) -> List[str]:
    """The command line that launches ``tools/TOOL.py`` with ``args`` (the script's own)."""
    script = str(ROOT / 'tools' / f'{tool}.py')
    if how == 'dist':
        count = len(USAGE[how, tool].split())
        *given, nproc = args[:count]
        return [python, '-m', 'torch.distributed.run', f'--nnodes={env.get("NNODES", "1")}',
                f'--node_rank={env.get("NODE_RANK", "0")}',
                f'--master_addr={env.get("MASTER_ADDR", "127.0.0.1")}',
                f'--master_port={env.get("PORT", "29500")}', f'--nproc_per_node={nproc}', script,
                *given, '--launcher', 'pytorch', *args[count:]]
    partition, job, config, fourth, *rest = args
    gpus, per_node = env.get('GPUS', '8'), env.get('GPUS_PER_NODE', '8')
    return ['srun', '-p', partition, f'--job-name={job}', f'--gres=gpu:{per_node}',
            f'--ntasks={gpus}', f'--ntasks-per-node={per_node}',
            f'--cpus-per-task={env.get("CPUS_PER_TASK", "5")}', '--kill-on-bad-exit=1',
            *shlex.split(env.get('SRUN_ARGS', '')), python, '-u', script, config,
            f'--work-dir={fourth}' if tool == 'train' else fourth, '--launcher=slurm', *rest]


def main(argv: Optional[Sequence[str]] = None) -> int:
    how, tool, *args = sys.argv[1:] if argv is None else argv
    if len(args) < len(USAGE[how, tool].split()):
        print(f'usage: tools/{how}_{tool}.sh {USAGE[how, tool]} [{tool}.py args...]', file=sys.stderr)
        return 2
    if how == 'dist' and find_spec('torch') is None:
        print(f'no torch in {sys.executable}: run tools/setup_env.sh, or set PYTHON=/path/to/python',
              file=sys.stderr)
        return 2
    paths = [str(ROOT), *filter(None, [os.environ.get('PYTHONPATH')])]
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(paths)} if how == 'slurm' else dict(os.environ)
    argv = command(how, tool, args)
    os.execvpe(argv[0], argv, env)


if __name__ == '__main__':
    sys.exit(main())
