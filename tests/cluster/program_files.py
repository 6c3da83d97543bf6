"""``prog.py`` files for the tests that compile or submit programs with the ``pathways`` CLI."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType


def double_inc_program(pool_name: str | None = None) -> str:
    """A program ``double-inc``: ``v * 2 + 1`` in two computations on one 2-device slice
    (named ``pool_name``, else by its position), called with ``[1.0, 2.0]``."""
    name = f", name={pool_name!r}" if pool_name else ""
    return textwrap.dedent(
        f"""
        import numpy as np
        import pathways as pw

        pool = pw.make_virtual_device_set().add_slice(devices=2{name})
        double = pw.pmap(lambda x: x * 2.0, devices=pool.devices)
        inc = pw.pmap(lambda x: x + 1.0, devices=pool.devices)

        @pw.program(name="double-inc")
        def program(v):
            return inc(double(v))

        def example_args():
            return (np.array([1.0, 2.0], np.float32),)
        """
    )


def example_module(path: Path) -> ModuleType:
    """A program file imported as a module of its own (for its ``reference`` results)."""
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None, f"{path} is not importable"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
