"""Embeddable runtimes: python/ is built; web and Swift are not yet (see README.md)."""
