"""Operator log lines name the object they are about (``k8s/log_context.py``)."""

from __future__ import annotations

import io
import logging
import threading

from pathways_operator.k8s.log_context import FORMAT, ObjectFilter, about


def test_lines_logged_inside_about_name_the_object_and_others_a_dash() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(ObjectFilter())
    log = logging.getLogger("test.log_context")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        with about("program:ns/p"):
            log.info("inside")
            other = threading.Thread(target=log.info, args=("another thread",))
            other.start()
            other.join()
        log.info("outside")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("test.log_context [program:ns/p]: inside")
    assert lines[1].endswith("[-]: another thread"), "a thread's object is its own"
    assert lines[2].endswith("[-]: outside")
