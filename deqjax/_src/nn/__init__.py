"""Haiku layer of deqjax: the ``DEQ`` module, its cells, weight norm and variational dropout."""
