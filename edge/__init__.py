"""edge: an on-device inference toolkit for diffusion text-to-video models."""

__version__ = "0.1.0"
