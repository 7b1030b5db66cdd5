"""The session's Python 3 kernel: ipykernel's launcher, with Python's cyclic garbage collector paused
while the kernel loads.

A kernel's start creates many objects that live as long as the kernel (modules, classes, the
shell and its traits) and hardly any garbage; with the collector on, it ran again and again while
they were made, each time looking over all of them. Here the collector is off until the kernel is
built; then what the start made is frozen (gc.freeze: left out of every later collection, which
looks at what the user's code makes) and it runs again, before the kernel answers anything.

Otherwise this is ipykernel_launcher: the kernelspec runs it as
``python -P -m portal.session.kernelstart -f {connection_file}`` (-P: the notebook's folder is not
searched for this module; IPython puts it on sys.path for the user's imports, as it does with
ipykernel_launcher). Written into every session by portal.session.kernel.specs.write_host_kernel.
Self-contained (standard library and ipykernel): listed in portal/upstream/session.py's PATCHES.
"""

import gc


def main() -> None:
    gc.disable()
    from ipykernel.kernelapp import IPKernelApp  # what ipykernel_launcher's launch_new_instance runs

    app = IPKernelApp.instance()
    app.initialize()
    gc.freeze()
    gc.enable()
    app.start()


if __name__ == "__main__":
    main()
