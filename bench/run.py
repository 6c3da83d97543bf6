"""`python -m bench.run [--quick] [--only 1,2,...]`: every experiment, then the report.

`--quick` (make bench-quick) runs fewer sizes and seconds so the whole suite
stays under five minutes on a 2-core machine. Every figure held to a target has
`REPEATS` repeats in both modes, the least `bench.verdicts` judges (the cluster's
apply → Ready among them: its 4-host slice is held to the 1-host slice).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import report  # noqa: E402
from bench.measure import Figure  # noqa: E402
from bench.verdicts import MIN_REPEATS  # noqa: E402

REPEATS = MIN_REPEATS


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="1,2,3,4,5,6,7,8,9")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    only = {int(x) for x in args.only.split(",")}
    quick = args.quick
    start_load = os.getloadavg()[0]
    figures: list[Figure] = []
    dispatch_table: dict[str, dict[str, float]] = {}

    def attempt(n: int, name: str, fn: object) -> None:
        if n not in only:
            return
        print(f"== experiment {n}: {name}", flush=True)
        try:
            got = fn()  # type: ignore[operator]
            figures.extend(got)
            for f in got:
                print(f"   {f.name}: {f.median:.4g} {f.unit} {f.note}", flush=True)
        except Exception as err:
            traceback.print_exc()
            figures.append(Figure(f"{n} {name}", "failed", "", float("nan"), float("nan"),
                                  float("nan"), 0, note=f"{type(err).__name__}: {err}"))

    if 1 in only or 2 in only:
        from bench import dispatch

        def one() -> list[Figure]:
            sizes = (0, 128, 512) if quick else (0, 64, 128, 256, 384, 512, 768)
            got, table = dispatch.run(sizes, REPEATS, 8 if quick else 32, 48 if quick else 128)
            dispatch_table.update(table)
            return got

        attempt(1, "dispatch", one)

    def two() -> list[Figure]:
        from bench import ray_peer

        row = dispatch_table.get("add f32[4]", {})
        chained = next((f.samples for f in figures if f.name == "add f32[4]: Chained"), [])
        overhead = row.get("overhead", row.get("Chained", float("nan")) - row.get("jax", 0.0))
        return ray_peer.run(overhead, row.get("jax", 0.0), 128, REPEATS, chained)

    attempt(2, "vs Ray", two)

    def three() -> list[Figure]:
        from bench import pipelining

        return pipelining.run((4, 16) if quick else (4, 8, 16), 3 if quick else 10, REPEATS)

    attempt(3, "pipelining", three)

    def four() -> list[Figure]:
        from bench import transfers

        return transfers.run((1, 16, 64) if quick else (1, 16, 64, 256), REPEATS)

    attempt(4, "transfers", four)

    def five() -> list[Figure]:
        from bench import sharing

        return sharing.run((1.0,) if quick else (1.0, 10.0), 15.0 if quick else 40.0, REPEATS)

    attempt(5, "multi-tenancy", five)

    def six() -> list[Figure]:
        from bench import control_plane

        return control_plane.run(REPEATS, REPEATS)

    attempt(6, "control plane", six)

    def seven() -> list[Figure]:
        from bench import checkpoints

        return checkpoints.run((1, 16) if quick else (1, 16, 64), 2 if quick else 4,
                               4 if quick else 16, 30 if quick else 60, 5)

    attempt(7, "checkpoints", seven)

    def eight() -> list[Figure]:
        from bench import training

        return training.run(30 if quick else 60, REPEATS)

    attempt(8, "training", eight)

    def nine() -> list[Figure]:
        from bench import driver_pods

        return driver_pods.run(3 if quick else REPEATS)

    attempt(9, "driver pods", nine)
    mode = "quick" if quick else "full"
    title = args.title or f"This machine ({os.cpu_count()} cores), {mode}"
    load = f"{start_load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    out = report.write(figures, mode, title, {"load average (1 min)": load})
    print(f"wrote {out} and {report.HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
