"""`edge eval`: attribute classifier, metrics and the evaluation loop."""
