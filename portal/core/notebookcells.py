"""What a headless notebook run says about its cells, and the parameters it is given.

Shared by ``dsportal templates check`` (portal/admin/templatecheck.py) and notebooks run as jobs
(portal/session/notebookjob.py): a failure names the cell (its number among code cells and its first
line) and the error in one line; parameters follow papermill's convention, which JupyterLab users know:
the cell tagged ``parameters`` holds the defaults, and a cell tagged ``injected-parameters`` placed right
after it overrides them.
"""

from __future__ import annotations

import ast
import json
import re
import traceback

PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
RESULTS_TAG = "results"


def failure_reason(error: Exception, cell: str | None, timeout: int | None) -> str:
    """One line: ``cell N (first line): Error: message`` (N counts code cells from 1)."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    if isinstance(error, CellExecutionError):
        what = f"{error.ename}: {one_line(error.evalue)}"
    elif isinstance(error, CellTimeoutError):
        what = f"no result within {timeout} s" + (" (--timeout)" if timeout else "")
    elif isinstance(error, DeadKernelError):
        what = "the kernel died"
    else:
        return f"{type(error).__name__}: {one_line(str(error))}"
    return f"{cell}: {what}" if cell else what


def cell_label(cells: list, index: int) -> str:
    """``cell 3 (%%horovod --nodes 2)``: the cell's number among the notebook's code cells (as its author
    counts them: a cell of injected parameters is not one of them) and its first line."""
    if INJECTED_TAG in tags(cells[index]):
        return "the cell of this run's parameters"
    number = code_cells(cells[:index + 1])
    first = next((line.strip() for line in cells[index].source.splitlines() if line.strip()), "")
    return f"cell {number} ({first[:60]})"


def code_cells(cells: list) -> int:
    """How many of ``cells`` are code cells of the notebook's author (injected parameters not counted)."""
    return sum(cell.cell_type == "code" and INJECTED_TAG not in tags(cell) for cell in cells)


def one_line(text: str) -> str:
    return " ".join(without_colours(text).split())


def without_colours(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def full_traceback(error: Exception) -> str:
    """The kernel's traceback for a failed cell (with the cell's source), else ours."""
    from nbclient.exceptions import CellControlSignal

    if isinstance(error, CellControlSignal):  # nbclient's message holds the cell and the kernel's traceback
        return without_colours(str(error))
    return "".join(traceback.format_exception(error))


def tags(cell) -> list[str]:
    found = (cell.get("metadata") or {}).get("tags")
    return [tag for tag in found if isinstance(tag, str)] if isinstance(found, list) else []


def inject_parameters(nb, parameters: dict) -> None:
    """A code cell tagged ``injected-parameters`` that sets each parameter, right after the cell tagged
    ``parameters`` (at the top where there is none), as papermill places it. Names are identifiers and
    values JSON (checked before a job is submitted: portal/core/rules.py), written as Python literals."""
    import nbformat

    for cell in [c for c in nb.cells if INJECTED_TAG in tags(c)]:
        nb.cells.remove(cell)  # a notebook papermill ran before: its old injection goes
    if not parameters:
        return
    lines = ["# Parameters of this run (dsportal), overriding the cell tagged 'parameters' above"]
    lines += [f"{name} = {python_literal(value)}" for name, value in parameters.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines))
    cell.metadata["tags"] = [INJECTED_TAG]
    at = next((i + 1 for i, c in enumerate(nb.cells) if c.cell_type == "code" and PARAMETERS_TAG in tags(c)), 0)
    nb.cells.insert(at, cell)


def python_literal(value) -> str:
    """A JSON value (null, true/false, number, text, list) as the Python literal of the same value."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value)  # quotes and escapes: never code
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    raise TypeError(f"not a parameter value: {type(value).__name__}")


def results_of(nb) -> dict | None:
    """What the cell tagged ``results`` gave last as one object: a line of JSON it printed, or its value
    (a dict's JSON or Python literal)."""
    found = None
    for cell in nb.cells:
        if cell.cell_type != "code" or RESULTS_TAG not in tags(cell):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                candidates = str(output.get("text", "")).splitlines()
            elif output.get("output_type") == "execute_result":
                data = output.get("data") or {}
                candidates = [data.get("application/json"), data.get("text/plain")]
            else:
                continue
            for candidate in candidates:
                value = _an_object(candidate)
                if value is not None:
                    found = value
    return found


def _an_object(candidate) -> dict | None:
    """A dict from JSON text, a Python literal's text, or a JSON object already read; else None."""
    if isinstance(candidate, dict):
        return candidate
    if not isinstance(candidate, str) or not candidate.strip().startswith("{"):
        return None
    try:
        value = json.loads(candidate)
    except ValueError:
        try:
            value = ast.literal_eval(candidate)  # a dict's repr (the cell's value): literals only, never code
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, dict) else None
