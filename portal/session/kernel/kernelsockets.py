"""A session's kernels talk to its Jupyter server over unix sockets that only the user can open.

Jupyter's default transport is TCP on 127.0.0.1: five ports per kernel that anyone on the node
can connect to. A kernel's IOPub channel is signed, not encrypted, so whoever subscribes reads the
code and output of every cell. Here every kernel of a session (the host "Python 3" kernel and the
container kernels) uses ZeroMQ's IPC transport instead: its channels are unix sockets next to its
connection file, in the session's runtime folder (JUPYTER_RUNTIME_DIR, mode 0700, the user's; the
sockets themselves the user's alone by the session's umask). Container kernels see that folder at the same
path (portal.session.kernel.specs binds it).

jupyter_client names a kernel's sockets after its connection file (``kernel-<uuid>-ipc-N``), but a
unix socket's path holds at most 107 bytes, and the runtime folder already takes 40-60 of them
(``/tmp/dsportal-<user>-<job id>-XXXXXXXXXX/runtime``): the sockets here are named after the
first 8 hex digits of the kernel id (``k1a2b3c4d-1`` .. ``-5``, and ``-pipe``: portal.session.kernel.kernelpipe).
A kernel id is random (uuid4), and jupyter_client skips a number whose file exists. A runtime
folder too deep even for these names fails the kernel's start with a message that says so.

Loaded by the session's Jupyter server when it starts its first kernel manager
(jupyter-config/jupyter_server_config.json names this class), not at session start.
"""

from __future__ import annotations

import os

from jupyter_server.services.kernels.kernelmanager import ServerKernelManager
from traitlets import default

from portal.upstream.session import IpcSocketsNamedByPrefix

UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
SOCKET_SUFFIX_MAX = len("-pipe")  # jupyter_client appends -1 .. -5 (one per channel), kernelpipe -pipe


class SocketPathTooLong(ValueError):
    """The session's runtime folder is too deep for a unix socket's path."""


def socket_prefix(connection_file: str) -> str:
    """Where a kernel's sockets go: beside its connection file, ``k`` + 8 hex digits of its id."""
    folder, name = os.path.split(connection_file)
    kernel_id = name.removeprefix("kernel-").removesuffix(".json")
    prefix = os.path.join(folder, "k" + kernel_id.replace("-", "")[:8])
    if len(os.fsencode(prefix)) + SOCKET_SUFFIX_MAX > UNIX_SOCKET_PATH_MAX:
        raise SocketPathTooLong(
            f"this session's runtime folder {folder} is too long for a kernel's unix sockets "
            f"({len(prefix) + SOCKET_SUFFIX_MAX} > {UNIX_SOCKET_PATH_MAX} bytes): ask your admin for a shorter TMPDIR")
    return prefix


class PrivateKernelManager(IpcSocketsNamedByPrefix, ServerKernelManager):
    """jupyter_server's kernel manager, with its kernel's channels on private unix sockets."""

    @default("transport")
    def _private_transport(self) -> str:
        return "ipc"

    def ipc_socket_prefix(self) -> str:
        return socket_prefix(self.connection_file)
