"""The DEQ layer without a framework: settings, batching modes, the forward pass and its output,
shared by ``dq.nn.DEQ`` (Haiku), ``deqjax.nnx.DEQ`` and ``deqjax.equinox.DEQ``."""
