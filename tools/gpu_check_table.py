"""The GPU check's markdown table: a row per step (its log's summary lines, or how it failed)
under a header line, then a status line and the memory ladder (used by tools/gpu_check.py)."""
import re
import time
from typing import Optional, Sequence

SUMMARY_LINE = re.compile(r'^(PROBE|CONTRACT|SUMMARY|GOAL|TRAIN)')
OOM = re.compile(r'out of memory|OutOfMemoryError')


def escape(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace('|', '\\|')


def summary_of(log_text: str, returncode: int, log_name: str) -> str:
    """A row's summary: the log's last 3 PROBE / CONTRACT / SUMMARY / GOAL / TRAIN lines; for a
    failure, the exit status, the log's name, its last line and whether it ran out of memory."""
    lines = log_text.splitlines()
    summary = escape(' '.join([line for line in lines if SUMMARY_LINE.match(line)][-3:]))
    if returncode == 0:
        return summary
    if OOM.search(log_text):
        summary = f'OOM. {summary}'
    last = escape(lines[-1][:300] if lines else '')
    return f'FAILED (exit {returncode}, {log_name}): {last} {summary}'.rstrip()


def table_row(name: str, returncode: int, summary: str, seconds: float) -> str:
    return f'| {name} | {"ok" if returncode == 0 else "FAILED"} | {summary} | {int(seconds)} |'


def render_table(device: str, desc: str, steps: str, seconds: float, rows: Sequence[str],
                 status: str, ladder: Optional[str] = None, now: Optional[time.struct_time] = None) -> str:
    """The whole markdown file: a header line, the rows so far, a status line, the ladder."""
    stamp = time.strftime('%Y-%m-%d %H:%M UTC', now or time.gmtime())
    lines = [f'# gpu_check ({device}): {stamp}, {desc}, steps {steps}, {int(seconds)} s', '',
             '| step | result | summary | seconds |', '|---|---|---|---|', *rows, '', status]
    text = '\n'.join(lines) + '\n'
    return text + f'\n{ladder}' if ladder is not None else text
