"""Planning from shapes: a package's blocks against a memory budget (partition, residency),
each call's activation memory and its compute cost, for `edge export --dry-run` and the
exporters' budget checks."""
