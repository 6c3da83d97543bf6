"""Names the operator derives from users' names, and the limits Kubernetes puts on them.

A VirtualSlice's name becomes the value of the ``pathways.dev/slice`` label on its
pods and token Secret, and the stem of their names (``<slice>-<index>``,
``<slice>-pathways-token``). A PathwaysProgram's name becomes the
``pathways.dev/program`` label on the slices and results ConfigMap it creates and,
joined with a slice's name, the name of each VirtualSlice it creates from a template
(``<program>-<slice>``). Label values are at most 63 characters; object names at most
253. So a slice name of at most 63 and a program name, and every ``<program>-<slice>``
of its templates, of at most 63 make every derived name fit.

The CRDs refuse longer names (CEL rules on ``metadata.name``). These checks are for
objects stored before those rules existed: the operator fails such an object, naming
the field and the limit, rather than failing every API call it makes for it.
"""

from __future__ import annotations

from collections.abc import Iterable

LABEL_VALUE_MAX = 63
"""Kubernetes' limit on a label value (and on a DNS-1123 label)."""


def slice_name_problem(name: str) -> str | None:
    """Why VirtualSlice ``name`` cannot be served, or None when it can."""
    if len(name) <= LABEL_VALUE_MAX:
        return None
    return (
        f"metadata.name {name!r} is {len(name)} characters; a VirtualSlice name may have at most "
        f"{LABEL_VALUE_MAX} (it is the value of the pathways.dev/slice label on the slice's pods): "
        "delete this VirtualSlice and create it again with a shorter name"
    )


def program_name_problem(name: str, template_slices: Iterable[tuple[int, str]]) -> str | None:
    """Why PathwaysProgram ``name`` cannot be served, or None.

    ``template_slices``: (index in ``spec.slices``, name) of each entry with a template.
    """
    if len(name) > LABEL_VALUE_MAX:
        return (
            f"metadata.name {name!r} is {len(name)} characters; a PathwaysProgram name may have at "
            f"most {LABEL_VALUE_MAX} (it is the value of the pathways.dev/program label on the "
            "slices and results it creates): delete this PathwaysProgram and create it again "
            "with a shorter name"
        )
    for i, slice_name in template_slices:
        derived = inline_slice_name(name, slice_name)
        if len(derived) > LABEL_VALUE_MAX:
            return (
                f"metadata.name and spec.slices[{i}].name make VirtualSlice {derived!r}, "
                f"{len(derived)} characters; the VirtualSlice a template creates is named "
                f"<program>-<slice> and may have at most {LABEL_VALUE_MAX}: delete this "
                "PathwaysProgram and create it again with a shorter name or slice name"
            )
    return None


def inline_slice_name(program: str, slice_name: str) -> str:
    """The VirtualSlice a program creates for its template slice ``slice_name``."""
    return f"{program}-{slice_name}"
