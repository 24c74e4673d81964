"""Embeddable Python runtime for edge packages (onnxruntime + NumPy, no torch)."""

from edge.core.budget import BudgetError, parse_size
from edge.runtimes.python.loader import BlockLoader
from edge.runtimes.python.pipeline import Pipeline

__all__ = ["BlockLoader", "BudgetError", "Pipeline", "parse_size"]
