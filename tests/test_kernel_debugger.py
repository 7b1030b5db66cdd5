"""A session's Python kernel has ipykernel's debugger: a breakpoint in a cell stops the cell, the stack
shows the cell's frame and its variables, and the cell finishes once continued.

A real kernel of the session environment (its ipython_kernel_config.py, as every session's kernel),
driven over the Jupyter protocol as JupyterLab's debugger panel drives it.
"""

from __future__ import annotations

import itertools

import pytest
from jupyter_client.manager import start_new_kernel

pytestmark = pytest.mark.quick

TIMEOUT = 60
CODE = "def f(a, b):\n    c = a + b\n    return c\nresult = f(2, 3)\nprint('result', result)\n"


@pytest.fixture
def kernel():
    manager, client = start_new_kernel(kernel_name="python3", startup_timeout=TIMEOUT)
    try:
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run(client, code: str) -> str:
    """The cell's printed output (its errors raised)."""
    msg_id = client.execute(code)
    out = []
    while True:
        msg = client.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise AssertionError(f"{msg['content']['ename']}: {msg['content']['evalue']}")
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(out)


_seq = itertools.count(1)


def debug(client, command: str, arguments: dict | None = None) -> dict:
    """One debug_request on the control channel, as JupyterLab sends it; its reply's content."""
    msg = client.session.msg("debug_request", {"type": "request", "seq": next(_seq), "command": command,
                                               "arguments": arguments or {}})
    client.control_channel.send(msg)
    while True:
        reply = client.get_control_msg(timeout=TIMEOUT)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]


def debug_event(client, event: str) -> dict:
    for _ in range(1000):
        msg = client.get_iopub_msg(timeout=TIMEOUT)
        if msg["msg_type"] == "debug_event" and msg["content"].get("event") == event:
            return msg["content"]
    raise AssertionError(f"no {event} event")


def test_a_kernels_debugger_stops_at_a_breakpoint(kernel):
    features = kernel.kernel_info(reply=True, timeout=TIMEOUT)["content"].get("supported_features", [])
    assert "debugger" in features  # JupyterLab shows the debugger's switch

    reply = debug(kernel, "initialize", {"clientID": "dsportal-test", "adapterID": "", "pathFormat": "path",
                                         "linesStartAt1": True, "columnsStartAt1": True, "locale": "en"})
    assert reply["success"], reply
    assert debug(kernel, "attach")["success"]
    source = debug(kernel, "dumpCell", {"code": CODE})["body"]["sourcePath"]
    breakpoints = debug(kernel, "setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": source},
                                                   "sourceModified": False})
    assert breakpoints["body"]["breakpoints"][0]["verified"], breakpoints
    assert debug(kernel, "configurationDone")["success"]

    msg_id = kernel.execute(CODE)
    stopped = debug_event(kernel, "stopped")
    assert stopped["body"]["reason"] == "breakpoint", stopped
    frames = debug(kernel, "stackTrace", {"threadId": stopped["body"]["threadId"]})["body"]["stackFrames"]
    assert frames[0]["name"] == "f" and frames[0]["line"] == 2, frames[0]
    scopes = debug(kernel, "scopes", {"frameId": frames[0]["id"]})["body"]["scopes"]
    local = debug(kernel, "variables", {"variablesReference": scopes[0]["variablesReference"]})["body"]["variables"]
    assert {v["name"]: v["value"] for v in local if v["name"] in ("a", "b")} == {"a": "2", "b": "3"}
    assert debug(kernel, "continue", {"threadId": stopped["body"]["threadId"]})["success"]

    printed = []
    while True:  # the cell finishes
        msg = kernel.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert "".join(printed) == "result 5\n"
    debug(kernel, "disconnect", {"restart": False, "terminateDebuggee": True})
