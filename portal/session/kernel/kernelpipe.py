"""A kernel's pipe for its forked children's output, on a private unix socket instead of TCP.

ipykernel's IOPub thread listens on a TCP port of 127.0.0.1 (always, from the kernel's start) for
the output of processes the kernel forks (multiprocessing, os.fork): on a shared node anyone there
can connect to it, push messages (refused without its random key, but each one printed to the
kernel's log) and count it as one of the user's open ports. With the kernel's channels on private
unix sockets (portal.session.kernel.kernelsockets), the pipe goes beside them: ``<socket prefix>-pipe``,
in the session's runtime folder (0700). A kernel on TCP keeps ipykernel's own pipe.

Self-contained (standard library, zmq and ipykernel only), because it runs in two ways:
- host kernels call private_iopub_pipe() from the environment's ipython_kernel_config.py;
- container kernels, whose image has its own ipykernel and no dsportal, load a copy of this file
  as an extra IPython config file (``--config=...``, portal.session.kernel.specs writes it into the
  runtime folder), which calls it at the bottom.
Both run before the kernel opens its sockets. An ipykernel whose IOPub thread is built otherwise
(not 6.x or 7.x) keeps its own pipe.
"""

import atexit
import os

import zmq
from ipykernel import kernelapp
from zmq.eventloop.zmqstream import ZMQStream


def _remove_socket(path: str, owner_pid: int) -> None:
    """The kernel's exit removes its pipe's socket file (jupyter_client removes the channels' own);
    a forked child that exits normally runs atexit too, and must leave the kernel's socket alone."""
    if os.getpid() == owner_pid:
        try:
            os.unlink(path)
        except OSError:
            pass


def _private_pipe_address():
    """ipc://<the kernel's socket prefix>-pipe, or None where the kernel's channels are TCP."""
    if not kernelapp.IPKernelApp.initialized():
        return None
    app = kernelapp.IPKernelApp.instance()
    if app.transport != "ipc" or not app.ip:
        return None
    return f"ipc://{app.ip}-pipe"


def _with_private_pipe(iopub_thread_class):
    class IOPubThreadWithPrivatePipe(iopub_thread_class):
        """ipykernel's IOPub thread; its pipe from forked children binds a unix socket, not TCP."""

        def _setup_pipe_in(self):
            self._pipe_address = _private_pipe_address()
            if self._pipe_address is None:
                return super()._setup_pipe_in()
            self._pipe_uuid = os.urandom(16)  # as ipykernel: children prove they are the kernel's
            pipe_in = self.socket.context.socket(zmq.PULL)
            pipe_in.linger = 0
            pipe_in.bind(self._pipe_address)
            atexit.register(_remove_socket, self._pipe_address[len("ipc://"):], os.getpid())
            self._pipe_in = ZMQStream(pipe_in, self.io_loop)
            self._pipe_in.on_recv(self._handle_pipe_msg)

        def _setup_pipe_out(self):
            if getattr(self, "_pipe_address", None) is None:
                return super()._setup_pipe_out()
            context = zmq.Context()  # a forked child's own (as ipykernel)
            pipe_out = context.socket(zmq.PUSH)
            pipe_out.linger = 3000
            pipe_out.connect(self._pipe_address)
            return context, pipe_out

    return IOPubThreadWithPrivatePipe


def private_iopub_pipe():
    """Make the kernel about to start build its IOPub thread with the private pipe."""
    thread_class = getattr(kernelapp, "IOPubThread", None)
    known = all(hasattr(thread_class, name) for name in ("_setup_pipe_in", "_setup_pipe_out", "_handle_pipe_msg"))
    if known and not getattr(thread_class, "_dsportal_private_pipe", False):
        kernelapp.IOPubThread = _with_private_pipe(thread_class)
        kernelapp.IOPubThread._dsportal_private_pipe = True


if "get_config" in globals():  # loaded as an IPython config file (a container kernel's --config)
    private_iopub_pipe()
