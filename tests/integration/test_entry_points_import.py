"""Hosts' sidecars and the operator start without the user API or JAX.

They share only ``pathways_wire`` with the client; a fresh interpreter shows what each
entry point really loads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = (
    "import sys, importlib\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "loaded = sorted(m for m in ('jax', 'pathways') if m in sys.modules)\n"
    "print(','.join(loaded) or 'none')\n"
)


@pytest.mark.parametrize("modules", [
    # the entry point, and what its serve() imports
    ["pathways_worker.sidecar.__main__", "pathways_worker.sidecar.dataflow",
     "pathways_worker.sidecar.dataflow_service", "pathways_worker.sidecar.sidecar_metrics"],
    ["pathways_operator.__main__", "pathways_operator.k8s.handlers"],
])
def test_entry_point_loads_neither_the_user_api_nor_jax(modules: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK, *modules], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none", f"{modules} loaded {done.stdout.strip()}"


NUMPY_CHECK = (
    "import sys, importlib\n"
    "importlib.import_module(sys.argv[1])\n"
    "print('numpy' in sys.modules)\n"
)


@pytest.mark.parametrize("module", ["pathways_worker.sidecar.__main__", "pathways_worker.worker.__main__"])
def test_a_host_entry_point_imports_no_numpy_before_it_keeps_openblas_to_one_thread(module: str) -> None:
    """OpenBLAS reads its thread count when numpy loads it: `single_threaded_blas` must come first."""
    done = subprocess.run([sys.executable, "-c", NUMPY_CHECK, module], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", f"importing {module} imported numpy"


PROMETHEUS_CHECK = (
    "import sys, importlib\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "print('prometheus_client' in sys.modules)\n"
)


def test_a_sidecar_that_serves_no_metrics_never_imports_prometheus() -> None:
    """Every host's sidecar starts at once with its gang, on the same cores as the workers'
    JAX: `sidecar_metrics` (and `prometheus_client`) load only with `--metrics-port`."""
    serving = ["pathways_worker.sidecar.__main__", "pathways_worker.sidecar.dataflow",
               "pathways_worker.sidecar.dataflow_service", "pathways_worker.slice_auth"]
    done = subprocess.run([sys.executable, "-c", PROMETHEUS_CHECK, *serving], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", "a sidecar without --metrics-port imported prometheus_client"


ML_DTYPES_CHECK = (
    "import sys, importlib\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "before = 'ml_dtypes' in sys.modules\n"
    "from pathways_wire import transfer\n"
    "print(before, transfer.parse_dtype('float32').name, 'ml_dtypes' in sys.modules,\n"
    "      transfer.parse_dtype('bfloat16').name, 'ml_dtypes' in sys.modules)\n"
)


def test_a_sidecar_imports_ml_dtypes_only_for_a_value_of_its_types() -> None:
    """bfloat16 and the float8s are numpy dtypes only once ml_dtypes is imported: the sidecar
    imports it when a value of one of them first comes, not as its host starts."""
    serving = ["pathways_worker.sidecar.__main__", "pathways_worker.sidecar.dataflow",
               "pathways_worker.sidecar.dataflow_service", "pathways_worker.slice_auth"]
    done = subprocess.run([sys.executable, "-c", ML_DTYPES_CHECK, *serving], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "float32", "False", "bfloat16", "True"], done.stdout
