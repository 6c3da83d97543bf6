"""``python -m pathways.driver``: run one PathwaysProgram against a controller.

The Kubernetes operator starts this process, in the program's driver pod
``<program>-driver``, when every slice of a PathwaysProgram is Ready. It is an
ordinary Pathways *client* — it imports ``pathways`` only and talks to the
controller over the wire protocol, exactly like a notebook would — so what runs
under the operator is what runs locally. In its pod it holds no Kubernetes API
credential, only its program's client token, and reports its steps and outcome to
the controller (``--report-to-controller``, :mod:`pathways.driver_reports`).

Entrypoint contract (see also :mod:`pathways.context`)::

    def my_program(ctx: pathways.context.ProgramContext) -> dict[str, ArrayLike]:
        s = ctx.slice("main")                      # spec.slices[].name
        f = pw.pmap(lambda x: x * 2.0, devices=s.devices)
        for step in range(ctx.start_step, ctx.steps):
            ...
            ctx.step_done(step, {"loss": loss})
        return {"y": y}

The entrypoint is ``package.module:function`` importable where the driver runs.

A program compiled by ``pathways compile`` (``spec.source.configMapRef``) needs no
Python of the user's: the operator reads its ConfigMap and checks it, and the driver pod
mounts it (``--compiled-program DIR``; a child-process driver gets it as a JSON file); the
driver loads it with
:meth:`pathways_wire.compiled_program.CompiledProgram.from_config_map`, binds each IR slice to the
VirtualSlice that ``spec.slices`` gives the same name, and runs it ``steps`` times on the
inputs stored with it. Its results are its flat outputs, ``output_0``, ``output_1``, ...
of the last step. The driver never talks to the API server: only the operator holds
credentials; the IR's fingerprint, checked against its artifacts as it loads, keeps a
ConfigMap edited after the operator's check from running unnoticed.

Command line (all written by the operator)::

    --entrypoint pkg.mod:fn | --compiled-program FILE
    --args JSON   --steps N   [--start-step N]   [--weight W]
    --controller HOST:PORT    --namespace NS
    --slices JSON             slice name -> {"virtualSlice": NAME, "devices": N}
    --progress-file F         JSON lines, one per ctx.step_done
    --results-file R          written at exit: {"results": {key: nested list}} or
                              {"error": text, "retryable": bool}
    | --report-to-controller  (a driver pod) report both through the controller's
                              ReportProgress / ReportResult, with the program token
    [--token-file F]          from F (default $PATHWAYS_PROGRAM_TOKEN_FILE, else the
                              mounted Secret /var/run/pathways/driver/token)
    [--exit-with-parent]      exit when the process that started us exits
    [--checkpoint-dir D]      orbax snapshots of ctx's state; start from the newest one
    [--checkpoint-every N]    snapshot every N steps (and always before a suspend)

Before the entrypoint runs, the driver prints where the run starts, and from which snapshot
(:class:`pathways_wire.driver_protocol.RunStart`)::

    pathways.driver: starting at step 6 (restored the snapshot of step 6)

SIGUSR1, or a ``ReportProgress`` reply saying ``suspend``, asks for a suspend: the current step finishes, ``ctx.step_done`` snapshots the
state and unwinds, and the results file says ``{"suspended": true, "stepsCompleted": N}``
(exit status 0).

Exit status: 0 success; 75 (EX_TEMPFAIL) when the program lost a host or a
slice was unavailable, so running it again from ``stepsCompleted`` can
succeed; 2 for a bad entrypoint or arguments; 1 for any other failure (the
entrypoint raised, called ``sys.exit``, or returned results that cannot be stored:
keys that are not ConfigMap keys, values that are not JSON, more than 1 MiB); 143
when stopped by SIGTERM (calls in flight are finished first, freeing their
buffers on the hosts; no results file is written).

The module runs to about 480 lines because it is one process's contract with the
operator, read together: its command line, its signals, its reports and its exit statuses.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathways.driver_reports import ControllerReporter, FileReporter, Reporter
from pathways.context import (
    ProgramContext,
    ProgramSuspended,
    SliceBinding,
    results_problem,
)

from pathways_wire.driver_protocol import (
    DRIVER_TOKEN_DIR,
    DRIVER_TOKEN_KEY,
    ENV_PROGRAM_TOKEN_FILE,
    EXIT_BAD_PROGRAM,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_RETRYABLE,
    START_LINE,
    RunStart,
    steps_completed,
)

if TYPE_CHECKING:
    from pathways_wire.compiled_program import CompiledProgram



class DriverError(Exception):
    """The driver cannot run the program; ``code`` is the exit status to use."""

    def __init__(self, message: str, code: int = EXIT_BAD_PROGRAM) -> None:
        super().__init__(message)
        self.code = code


def load_entrypoint(text: str) -> Callable[..., Any]:
    """``pkg.module:function`` -> the function, or a DriverError naming what is missing."""
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise DriverError(f"entrypoint {text!r} is not of the form package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise DriverError(
            f"entrypoint {text!r}: module {module_name!r} is not importable where the driver runs (install it "
            f"in the driver's image, spec.driver.image): {err}"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise DriverError(f"entrypoint {text!r}: module {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def load_compiled(path: str) -> Callable[[ProgramContext], dict[str, Any]]:
    """A compiled program (ConfigMap JSON in ``path``, or mounted there) as an entrypoint, or a DriverError."""
    from pathways_wire.compiled_program import CompiledProgram
    from pathways_wire.errors import InvalidProgramError

    try:
        config_map = read_mounted_config_map(path) if Path(path).is_dir() else json.loads(Path(path).read_text())
        compiled = CompiledProgram.from_config_map(config_map)
    except (OSError, ValueError, InvalidProgramError) as err:
        raise DriverError(f"compiled program {path}: {err}") from None

    def entrypoint(ctx: ProgramContext) -> dict[str, Any]:
        return run_compiled(ctx, compiled)

    return entrypoint


def read_mounted_config_map(directory: str) -> dict[str, Any]:
    """A compiled program's ConfigMap mounted as a volume, as the object ``load_compiled`` reads.

    A volume holds the keys only: the operator checked the ConfigMap's format annotation
    before it mounted it, so it is restored here; every key of a compiled program is
    binaryData but its summary (the feeds and weight), which is text.
    """
    import base64

    from pathways_wire.compiled_program import FORMAT, FORMAT_ANNOTATION, SUMMARY_KEY

    root = Path(directory)
    try:
        files = {p.name: p.read_bytes() for p in sorted(root.iterdir()) if not p.name.startswith(".") and p.is_file()}
    except OSError as err:
        raise DriverError(f"--compiled-program-dir {directory}: {err}") from None
    summary = files.pop(SUMMARY_KEY, b"{}")
    return {
        "metadata": {"name": root.name, "annotations": {FORMAT_ANNOTATION: FORMAT}},
        "data": {SUMMARY_KEY: summary.decode()},
        "binaryData": {k: base64.b64encode(v).decode() for k, v in files.items()},
    }


def run_compiled(ctx: ProgramContext, compiled: CompiledProgram) -> dict[str, Any]:
    """Runs steps ``ctx.start_step .. ctx.steps`` of a CompiledProgram; the last step's outputs.

    A program whose steps are all done (the operator restarted before recording its
    results) runs once more, so it still has results to give.
    """
    import numpy as np

    from pathways_wire.errors import InvalidProgramError
    from pathways.runtime import default_runtime

    try:
        held = {s.id: ctx.slice(s.id) for s in compiled.program.slices}
        program = compiled.bound_to({k: (v.name, v.devices_count) for k, v in held.items()})
    except InvalidProgramError as err:
        raise DriverError(str(err)) from None
    runtime = default_runtime()
    inputs: list[Any] = list(compiled.inputs)
    fed = [feed.input for feed in compiled.feeds]
    restored = ctx.restore() if fed else None
    if restored is not None:
        missing = [_state_key(i) for i in fed if _state_key(i) not in restored]
        if missing:
            raise DriverError(
                f"the snapshot of step {ctx.restored_step} holds {sorted(restored)}, not the fed "
                f"inputs {missing}: was the program compiled with other feeds? Remove the snapshots "
                "under spec.checkpoint to start from the stored inputs"
            )
        for i in fed:
            inputs[i] = np.asarray(restored[_state_key(i)])
    outputs: list[Any] | None = None
    for step in range(ctx.start_step, ctx.steps):
        outputs = runtime.run(program, inputs, ctx.weight)
        inputs = compiled.next_inputs(inputs, outputs)
        # The fed inputs are the state: they come to the client only for a snapshot. The
        # step is reported once all its outputs exist (a failed one raises there), while
        # the next steps are dispatched (`ProgramContext.step_done`).
        ctx.step_done(step, state={_state_key(i): inputs[i] for i in fed} if fed else None, outputs=outputs)
    if outputs is None:
        outputs = runtime.run(program, inputs, ctx.weight)
    return dict(zip(compiled.output_names(), outputs))


def _state_key(input_index: int) -> str:
    """A fed input's key in the snapshots of a compiled program's state."""
    return f"input_{input_index}"


def parse_slices(text: str) -> dict[str, SliceBinding]:
    """``--slices`` JSON into bindings: each slice name of the program -> VirtualSlice and its devices."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise DriverError(f"--slices is not JSON: {err}") from None
    if not isinstance(raw, dict):
        raise DriverError(f"--slices must map slice names to VirtualSlices, got {raw!r}")
    bindings: dict[str, SliceBinding] = {}
    for name, value in raw.items():
        if isinstance(value, dict) and isinstance(value.get("virtualSlice"), str):
            devices = value.get("devices")
            if not isinstance(devices, int) or devices < 1:
                raise DriverError(f"--slices: slice {name!r} needs a positive 'devices', got {devices!r}")
            bindings[name] = SliceBinding(value["virtualSlice"], devices)
        else:
            raise DriverError(
                f"--slices: slice {name!r} must be {{\"virtualSlice\": NAME, \"devices\": N}}, got {value!r}"
            )
    return bindings


def results_json(results: object) -> dict[str, Any]:
    """The entrypoint's return value as JSON-able nested lists, checked against the contract.

    Everything the operator will store is checked here, before the program ends: each
    value converts to JSON, each key is a ConfigMap key, and all fit in one ConfigMap
    (:func:`pathways.context.results_problem`). A DriverError names the key and the limit.
    """
    import numpy as np

    if results is None:
        return {}
    if not isinstance(results, Mapping):
        raise DriverError(
            f"the entrypoint returned {type(results).__name__}; it must return a dict of "
            "name -> array-like",
            EXIT_FAILED,
        )
    out: dict[str, Any] = {}
    stored: dict[str, str] = {}
    for key, value in results.items():
        if not isinstance(key, str):
            raise DriverError(
                f"result key {key!r} is a {type(key).__name__}; result keys must be strings", EXIT_FAILED
            )
        try:
            out[key] = np.asarray(value).tolist()
            stored[key] = json.dumps(out[key])
        except Exception as err:
            raise DriverError(
                f"result {key!r} ({type(value).__name__}) is not an array-like of numbers that "
                f"converts to JSON: {err}",
                EXIT_FAILED,
            ) from None
    problem = results_problem(stored)
    if problem is not None:
        raise DriverError(problem, EXIT_FAILED)
    return out


_PARENT: list[int] = []
"""Our parent's pid, with ``--exit-with-parent``."""


def _orphaned() -> bool:
    """The operator that started us (``--exit-with-parent``) is gone.

    We notice it as a new parent, or as our output pipe with no reader left (the
    operator reads it): output fails with BrokenPipeError then. That is no failure of
    the program, and no outcome is written; the next operator runs it again from its
    last step.
    """
    if not _PARENT:
        return False
    if os.getppid() != _PARENT[0]:
        return True
    try:
        if not stat.S_ISFIFO(os.fstat(1).st_mode):
            return False
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except OSError:
        return True


def _exit_with(parent: int) -> None:
    """Exit as soon as ``parent`` is no longer our parent (it died; we were re-parented)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(EXIT_RETRYABLE)


_SUSPEND = threading.Event()
"""Set by SIGUSR1: the program stops at its next ``ctx.step_done``, after snapshotting its state."""


def _suspend_on_signal(_signum: int, _frame: object) -> None:
    _SUSPEND.set()


class _Stopped(SystemExit):
    """SIGTERM: the operator stops the program; no outcome is written."""


def _stop_on_signal(signum: int, _frame: object) -> None:
    raise _Stopped(128 + signum)


def _retryable(err: Exception) -> bool:
    from pathways_wire.errors import ExecutionError, RuntimeUnavailableError

    if isinstance(err, RuntimeUnavailableError):
        return True
    return isinstance(err, ExecutionError) and "being relaunched" in str(err)


def reporter_for(args: argparse.Namespace) -> Reporter:
    """The controller (``--report-to-controller``, a driver pod) or the progress and results files."""
    if args.report_to_controller:
        token_file = Path(args.token_file or os.environ.get(ENV_PROGRAM_TOKEN_FILE)
                          or f"{DRIVER_TOKEN_DIR}/{DRIVER_TOKEN_KEY}")
        try:
            token = token_file.read_text().strip()
        except OSError as err:
            raise DriverError(f"--report-to-controller: cannot read the program token {token_file}: {err}") from None
        if not token:
            raise DriverError(f"--report-to-controller: the program token file {token_file} is empty")
        from pathways.runtime import RECONNECT_S

        return ControllerReporter(args.controller, token, _SUSPEND, (args.namespace, args.program),
                                  reconnect_s=RECONNECT_S)
    if not args.progress_file or not args.results_file:
        raise DriverError("give --progress-file and --results-file, or --report-to-controller")
    return FileReporter(Path(args.progress_file), Path(args.results_file))


def run(args: argparse.Namespace, reporter: Reporter) -> int:
    progress_file = Path(args.progress_file) if args.progress_file else None
    try:
        try:
            program_args = json.loads(args.args)
        except ValueError as err:
            raise DriverError(f"--args is not JSON: {err}") from None
        if not isinstance(program_args, dict):
            raise DriverError(f"--args must be a JSON object, got {program_args!r}")
        bindings = parse_slices(args.slices)
        fn = load_compiled(args.compiled_program) if args.compiled_program else load_entrypoint(args.entrypoint)
        if args.start_step is not None:
            start = args.start_step
        elif progress_file is not None:
            start = steps_completed(progress_file)
        else:
            raise DriverError("--report-to-controller needs --start-step (the steps the operator recorded)")
        start = min(start, args.steps)
        if args.report_to_controller:  # in its own pod, the driver's log is its own
            print(START_LINE.format(step=start), flush=True)
        if args.namespace:
            os.environ["PATHWAYS_NAMESPACE"] = args.namespace
        import pathways as pw

        pw.connect(args.controller)
        checkpointer = None
        if args.checkpoint_dir:
            from pathways.checkpoint import Checkpointer

            checkpointer = Checkpointer(args.checkpoint_dir)
        ctx = ProgramContext(
            args=program_args,
            steps=args.steps,
            start_step=start,
            slices=bindings,
            reporter=reporter,
            weight=args.weight,
            checkpointer=checkpointer,
            every_steps=args.checkpoint_every,
            suspend_event=_SUSPEND,
        )
        run_start = RunStart(ctx.start_step, ctx.restored_step)
        print(run_start.line, flush=True)
        reporter.started(run_start)
        try:
            returned = fn(ctx)
            ctx.flush()  # every step reported before the results
            results = results_json(pw.fetch(returned))  # a failed call raises here, as itself
        except SystemExit as err:
            if isinstance(err, _Stopped):
                raise
            raise DriverError(
                f"the entrypoint called sys.exit({err.code!r}) instead of returning its results",
                EXIT_FAILED,
            ) from None
        finally:
            ctx.close()
    except ProgramSuspended as stop:
        return _report(reporter, {"suspended": True, "stepsCompleted": stop.steps_completed}, EXIT_OK)
    except DriverError as err:
        if _orphaned():
            return EXIT_RETRYABLE
        print(f"pathways.driver: {err}", file=sys.stderr)
        payload = {"error": str(err), "retryable": False, "badProgram": err.code == EXIT_BAD_PROGRAM}
        return _report(reporter, payload, err.code)
    except Exception as err:
        if _orphaned():
            return EXIT_RETRYABLE
        retry = _retryable(err)
        text = f"{type(err).__name__}: {err}"
        tail = traceback.format_exc()
        print(tail, file=sys.stderr, end="")
        payload = {"error": text, "retryable": retry, "logTail": tail[-LOG_TAIL_CHARS:]}
        return _report(reporter, payload, EXIT_RETRYABLE if retry else EXIT_FAILED)
    return _report(reporter, {"results": results}, EXIT_OK)


LOG_TAIL_CHARS = 1500
"""How much of a failure's traceback the driver reports with its error."""


def _report(reporter: Reporter, payload: Mapping[str, Any], code: int) -> int:
    """Report the outcome and return ``code``; a controller that cannot be told makes it a retry."""
    try:
        reporter.outcome(payload)
    except Exception as err:  # the controller is gone: the operator runs us again from the last step
        print(f"pathways.driver: could not report the outcome ({err}); exiting for a retry", file=sys.stderr)
        return EXIT_RETRYABLE
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pathways.driver", description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--entrypoint", help="package.module:function")
    source.add_argument("--compiled-program",
                        help="a ConfigMap written by `pathways compile`: a JSON file, or the directory "
                        "it is mounted at")
    parser.add_argument("--args", default="{}", help="JSON object passed as ctx.args")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--start-step", type=int, default=None,
                        help="default: the steps already recorded in --progress-file")
    parser.add_argument("--weight", type=float, default=1.0, help="ctx.weight (spec.weight)")
    parser.add_argument("--controller", required=True, help="HOST:PORT of the controller")
    parser.add_argument("--namespace", default="", help="namespace of the VirtualSlices")
    parser.add_argument("--slices", required=True, help="JSON: slice name -> VirtualSlice")
    parser.add_argument("--progress-file", default="")
    parser.add_argument("--results-file", default="")
    parser.add_argument("--report-to-controller", action="store_true",
                        help="report steps and the outcome to the controller (a driver pod) instead of files")
    parser.add_argument("--program", default="", help="the PathwaysProgram's name (named in reports)")
    parser.add_argument("--token-file", default="",
                        help=f"the program token (default ${ENV_PROGRAM_TOKEN_FILE}, else "
                        f"{DRIVER_TOKEN_DIR}/{DRIVER_TOKEN_KEY})")
    parser.add_argument("--exit-with-parent", action="store_true")
    parser.add_argument("--checkpoint-dir", default="",
                        help="orbax snapshots of the program's state (spec.checkpoint.volume)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="snapshot every N steps (spec.checkpoint.everySteps); 0: only on suspend")
    args = parser.parse_args(argv)
    # SIGTERM (the operator stopping the program) unwinds like an exception, so calls in
    # flight are finished and their buffers freed on the hosts, and no outcome is written.
    signal.signal(signal.SIGTERM, _stop_on_signal)
    signal.signal(signal.SIGUSR1, _suspend_on_signal)
    if args.exit_with_parent:
        _PARENT.append(os.getppid())
        threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    try:
        reporter = reporter_for(args)
    except DriverError as err:
        print(f"pathways.driver: {err}", file=sys.stderr)
        return err.code
    code = run(args, reporter)
    try:
        import pathways as pw

        pw.shutdown()
    except Exception:
        pass  # releasing slices is best effort: the operator owns their lifetime
    return code


if __name__ == "__main__":
    sys.exit(main())
