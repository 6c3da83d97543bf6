"""The Pathways paper's example (section 4.1) as a program file for ``pathways run|compile|submit``.

``pathways run examples/paper_program.py`` runs it on the embedded runtime;
``pathways compile examples/paper_program.py -o paper.yaml`` writes a ConfigMap holding
its IR, ``jax.export`` artifacts and inputs, plus a PathwaysProgram with
``spec.source.configMapRef`` that the operator runs with no Python of this file
(``pathways submit`` creates both in the cluster). The program brings its own 2-device
slice (spec.slices ``template``); its results are ``output_0 = y = [3, 5]`` and
``output_1 = z = [2, 4]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import pathways as pw

main = pw.make_virtual_device_set().add_slice(devices=2)
a = pw.pmap(lambda x: x * 2.0, devices=main.devices)
b = pw.pmap(lambda x: x + 1.0, devices=main.devices)
c = pw.pmap(lambda x: x / 2.0, devices=main.devices)


@pw.program(name="paper-program")
def program(v: Any) -> Any:
    x = a(v)
    y = b(x)
    z = a(c(x))
    return (y, z)


def example_args() -> tuple[np.ndarray]:
    return (np.array([1.0, 2.0], np.float32),)
