"""Entrypoints that misbehave the way user programs do, for the operator's cluster tests.

The test operator allows ``tests.cluster.faulty_programs:`` besides ``examples.``
(``harness.ALLOWED_ENTRYPOINTS``), and its drivers import this module from the repository root.
None of them needs its slice: each fails, or misuses results, logs or time, on its own --
but `chains`, which keeps its slice busy, so that programs sharing one compete for it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from pathways.context import ProgramContext


def exits_with_status(ctx: ProgramContext) -> dict[str, Any]:
    """``sys.exit(args.status)`` (default 3) after a line of output."""
    print("exits_with_status: giving up", flush=True)
    sys.exit(int(ctx.args.get("status", 3)))


def hard_exit(ctx: ProgramContext) -> dict[str, Any]:
    """``os._exit(args.status)`` (default 7): no exception, no results file."""
    print("hard_exit: leaving without a word", flush=True)
    os._exit(int(ctx.args.get("status", 7)))


def raises(ctx: ProgramContext) -> dict[str, Any]:
    """Raises ValueError after recording a step."""
    ctx.step_done(0)
    raise ValueError("the data set is empty")


def returns_results(ctx: ProgramContext) -> dict[str, Any]:
    """Returns ``args.results`` as given: keys the manifest chooses (``a/b``, ``""``, ``../x``)."""
    return dict(ctx.args.get("results") or {})


def returns_unserializable(ctx: ProgramContext) -> dict[str, Any]:
    """Returns an object that is no array of numbers."""
    return {"model": object()}


def returns_floats(ctx: ProgramContext) -> dict[str, Any]:
    """Returns ``args.floats`` zeros under key ``big`` (300000 of them take 1.5 MB as JSON)."""
    return {"big": [0.0] * int(ctx.args.get("floats", 300_000))}


def forges_results(ctx: ProgramContext) -> dict[str, Any]:
    """Reports results itself, with a key no ConfigMap accepts, and exits 0.

    A driver pod reports them to the controller with its program's token; a child-process
    driver writes its results file. The driver's own checks never see these results: only
    the operator and the API server do.
    """
    forged = {"results": {"a/b": 1.0}}
    if "--results-file" in sys.argv and sys.argv[sys.argv.index("--results-file") + 1]:
        with open(sys.argv[sys.argv.index("--results-file") + 1], "w") as out:
            json.dump(forged, out)
    else:
        import threading

        from pathways.driver_reports import ControllerReporter
        from pathways_wire.driver_protocol import ENV_PROGRAM_TOKEN_FILE

        token = open(os.environ[ENV_PROGRAM_TOKEN_FILE]).read().strip()
        controller = sys.argv[sys.argv.index("--controller") + 1]
        named = (os.environ.get("PATHWAYS_NAMESPACE", ""), sys.argv[sys.argv.index("--program") + 1])
        ControllerReporter(controller, token, threading.Event(), named).outcome(forged)
    os._exit(0)


def sleeps(ctx: ProgramContext) -> dict[str, Any]:
    """Records a step, then sleeps ``args.seconds`` (default 600): a hung program."""
    ctx.step_done(0)
    time.sleep(float(ctx.args.get("seconds", 600)))
    return {"slept": 1.0}


def chained_small_calls(ctx: ProgramContext) -> dict[str, Any]:
    """``args.calls`` (default 20) calls in a row, each given the handle of the one before,
    whose answer has not come: a small call's. ``v`` is the last one's value (``calls`` on
    every device); ``calls_port`` is 1.0 where the calls went over the controller's calls port."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pathways as pw

    vslice = ctx.slice(ctx.slice_names[0])

    def slow_add(v: Any) -> Any:
        busy = jax.lax.fori_loop(0, 200, lambda _, m: jnp.tanh(m) * 0.5, jnp.ones((64, 64)))
        return v + 1.0 + 0.0 * busy[0, 0]

    add = pw.jit(slow_add, slice=vslice)

    @pw.program(name="chained-small-calls")
    def chain(v: Any) -> Any:
        return add(v)

    v: Any = np.zeros(len(vslice.devices), np.float32)
    for _ in range(int(ctx.args.get("calls", 20))):
        v = chain(v)
    ctx.step_done(0)
    return {"v": np.asarray(v), "calls_port": float(pw.default_runtime().calls_port is not None)}


def stalls_once(ctx: ProgramContext) -> dict[str, Any]:
    """Counts its steps in its state; on a fresh start (no snapshot restored) it hangs inside
    step ``args.stall_at`` (default 4) for ``args.seconds`` (default 600), as a program stuck
    in a long computation never reaches ``ctx.step_done``. Returns ``steps``, the count."""
    import numpy as np

    state = ctx.restore(default={"steps": np.zeros((), np.int32)})
    stall_at = int(ctx.args.get("stall_at", 4))
    for step in range(ctx.start_step, ctx.steps):
        if step == stall_at and ctx.restored_step is None:
            time.sleep(float(ctx.args.get("seconds", 600)))
        state = {"steps": np.asarray(state["steps"] + 1, np.int32)}
        ctx.step_done(step, state=state)
    return {"steps": state["steps"]}


def loses_host(ctx: ProgramContext) -> dict[str, Any]:
    """Fails the way a lost host does (the controller is unavailable), every run."""
    from pathways_wire.errors import RuntimeUnavailableError

    ctx.step_done(ctx.start_step)
    raise RuntimeUnavailableError("host 1 of slice main is gone (simulated)")


def prints(ctx: ProgramContext) -> dict[str, Any]:
    """Prints ``args.mib`` MiB of numbered lines (default 20), then ``the end``."""
    line = "x" * 1000
    for i in range(int(ctx.args.get("mib", 20)) * 1024):
        print(f"{i:08d} {line}")
    print("the end", flush=True)
    return {"lines": float(int(ctx.args.get("mib", 20)) * 1024)}


def probes_credentials(ctx: ProgramContext) -> dict[str, Any]:
    """Looks for Kubernetes API credentials where a pod finds them, and asks the API anonymously.

    Results: ``token_files`` (files under the ServiceAccount mount, 0 when none is
    mounted), ``api_status`` (the HTTP status of listing the namespace's Secrets without
    credentials: 401 or 403 when refused), ``program_token`` (1 when the program's own
    token is readable, as a driver pod's must be).
    """
    import ssl
    import urllib.error
    import urllib.request
    from pathlib import Path

    from pathways_wire.driver_protocol import ENV_PROGRAM_TOKEN_FILE

    mount = Path("/var/run/secrets/kubernetes.io/serviceaccount")
    token_files = sum(1 for p in mount.iterdir()) if mount.is_dir() else 0
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    namespace = os.environ.get("PATHWAYS_NAMESPACE", "default")
    status = 0
    if host and port:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(f"https://{host}:{port}/api/v1/namespaces/{namespace}/secrets",
                                        context=context, timeout=10) as reply:
                status = reply.status
        except urllib.error.HTTPError as err:
            status = err.code
    print(f"probes_credentials: {token_files} token files, API answered {status}", flush=True)
    readable = Path(os.environ.get(ENV_PROGRAM_TOKEN_FILE, "/nonexistent")).is_file()
    ctx.step_done(0)
    return {"token_files": float(token_files), "api_status": float(status), "program_token": float(readable)}


def chains(ctx: ProgramContext) -> dict[str, Any]:
    """Each step one call: ``args.length`` (default 320) computations in a chain on the slice.

    A call longer than the island scheduler's window (256 grants ahead per slice) keeps
    work queued there, so two such programs on one slice make the scheduler choose
    between them; each computation is ``args.work`` (default 50) rounds of a small loop.
    The result ``v`` is ``steps * length`` on every device.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pathways as pw

    devices = ctx.slice(ctx.slice_names[0]).devices
    length, work = int(ctx.args.get("length", 320)), int(ctx.args.get("work", 50))

    def inc(x: Any) -> Any:
        busy = jax.lax.fori_loop(0, work, lambda _, m: jnp.tanh(m) * 0.5, jnp.ones((32, 32)))
        return x + 1.0 + 0.0 * busy[0, 0]

    step_fn = pw.pmap(inc, devices=devices)

    @pw.program(name="chains", weight=ctx.weight)
    def chain(v: Any) -> Any:
        for _ in range(length):
            v = step_fn(v)
        return v

    v: Any = np.zeros(len(devices), np.float32)
    for step in range(ctx.start_step, ctx.steps):
        v = chain(v)
        ctx.step_done(step)
    return {"v": np.asarray(v)}


def holds_objects(ctx: ProgramContext) -> dict[str, Any]:
    """Keeps ``args.values`` (3) outputs of ``args.mib`` (1) MiB on its slice's hosts and sleeps,
    so a test can kill its driver while it owns them. A later start (``args.marker`` exists)
    returns at once: only the first driver holds anything."""
    import numpy as np

    import pathways as pw

    marker = str(ctx.args["marker"])
    if os.path.exists(marker):
        return {"held": 0.0}
    vslice = ctx.slice(ctx.slice_names[0])
    plus = pw.jit(lambda x: x + 1.0, slice=vslice)

    @pw.program(name="holds-objects", weight=ctx.weight)
    def plus_one(x: Any) -> Any:
        return plus(x)

    size = int(float(ctx.args.get("mib", 1)) * (1 << 20)) // 4
    held = [plus_one(np.zeros(size, np.float32)) for _ in range(int(ctx.args.get("values", 3)))]
    for value in held:
        value.block_until_ready()
    with open(marker, "w") as out:
        out.write("held\n")
    ctx.step_done(0)
    time.sleep(600)
    return {"held": float(len(held))}
