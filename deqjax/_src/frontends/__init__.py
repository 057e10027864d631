"""The Flax NNX and Equinox front-ends behind ``deqjax.nnx`` and ``deqjax.equinox``: each a DEQ
module, its cells and a classifier, over the framework-free layer (:mod:`deqjax._src.deq`) and
cells (:mod:`deqjax._src.cells`). A file imports its own framework only."""
