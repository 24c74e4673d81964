"""Embeddable runtimes (Python, web, Swift). None is implemented yet: see README.md."""
