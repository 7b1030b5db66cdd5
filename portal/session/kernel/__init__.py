"""A session's kernels: kernelspecs for images, containers, private sockets and pipes, her own environments."""
