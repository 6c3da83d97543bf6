"""The `dataflow` sidecar of a host: between the controller, the worker, peers and clients.

`python -m pathways_worker.sidecar` starts it (`__main__`). It never loads JAX:
it moves bytes (inbox, peers, data_channel), budgets them (byte_budget), relays
the control stream to the worker (worker_link) and exports metrics.
"""
