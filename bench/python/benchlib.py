"""Helpers shared by the Python benchmarks (bench/python): the machine line of a table."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The model name, and family and model numbers (the name alone can be generic on a VM)."""
    fields: dict = {}
    for line in open("/proc/cpuinfo"):
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor()
    return f"{name} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def machine() -> str:
    """CPU model, CPU count and kernel, for the first line of a results table."""
    return f"{cpu_model()} ({os.cpu_count()} CPUs), kernel {platform.release()}"
