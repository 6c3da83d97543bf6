"""The `worker` container of a host: JAX devices, the object store, and the executor.

`python -m pathways_worker.worker` starts it (`__main__`). What the host decides
lives in the pure `host_state` machine (with its `states`, `stimuli` and
`instructions`); `executor` is the threaded driver that feeds it commands and
carries out what it returns: JAX dispatch, waiting for results (`finisher`),
shared-memory exports and the event `outbox`.
"""
