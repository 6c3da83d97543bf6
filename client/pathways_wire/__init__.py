"""What crosses a process boundary in Kube-Pathways, shared by the client, the operator and the hosts.

The gRPC protocol and its slice tokens, the program IR, the transfer pieces (specs, slicing,
framing, assembly), the wording of counts in messages and the process-lifetime rules that tie
every child process to its parent. It imports none of ``pathways``, ``pathways_operator`` or
``pathways_worker``, so a host's sidecar loads it without the user API or JAX.
"""
