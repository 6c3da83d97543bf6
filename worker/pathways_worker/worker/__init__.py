"""The `worker` container of a host: JAX devices, the object store, and the executor.

`python -m pathways_worker.worker` starts it (`__main__`).
"""
