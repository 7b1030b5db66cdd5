"""Execute a notebook through a real Jupyter kernel (nbclient) and print every cell's output."""
import sys
import time

import nbformat
from nbclient import NotebookClient

path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
started = time.time()
ok = True
try:
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
except Exception as error:  # noqa: BLE001 - report, then print what ran
    ok = False
    print("NOTEBOOK ERROR:", str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__)
for cell in nb.cells:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            sys.stdout.write(out["text"])
print(f"NOTEBOOK {'PASSED' if ok else 'FAILED'} in {time.time() - started:.1f} s")
