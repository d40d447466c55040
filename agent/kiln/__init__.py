"""kiln: plan, start and serve vLLM on the GPU machine it boots on."""

__version__ = "0.1.0"
