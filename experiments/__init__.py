"""The experiments. Each module is a script (``python experiments/<name>.py``) that imports
``deqjax`` and its own parts (``experiments/parts/``), and a module importable as
``experiments.<name>`` from the repository root (the tests do so; ``python -m experiments.<name>``
runs it the same way)."""
