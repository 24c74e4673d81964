"""Model definitions; tiny-sora is the default model."""
