"""The operator's pure core: every decision, none of the I/O.

``phases`` and ``reasons`` declare the states, transitions, condition types and
reasons written to status; ``placement`` and ``admission`` decide where and when
a VirtualSlice's gang gets devices; ``island_scheduler`` orders every
computation on every slice; ``program_graph`` validates a program's dataflow;
``slice_machine`` and ``program_machine`` decide each look at a VirtualSlice or
a PathwaysProgram (observation in: ``slice_look``, ``program_look``; status,
Events and typed actions out, built in a ``status_report``).
Nothing here imports kopf, kubernetes, grpc or jax, reads a clock, or touches a
socket (an import-linter contract checks the imports), so all of it is tested
as plain functions in ``tests/unit``.
"""
