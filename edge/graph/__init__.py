"""Graph pieces: what a model is cut into (blocks and their chunking), the contract the
exporters hold a family to (FamilyModel), the attention and feed-forward chunking every target
traces inside, and tracing without weights (shapes only, lazy weights)."""
