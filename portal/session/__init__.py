"""Runs in each user's session job, as the user: the job's entry point, the Jupyter server
extension and its API handlers, multi-node jobs, TensorBoard, templates, the proxy guard,
activity reports, kernelspecs and container launch, and the kernels' IPython magics."""
