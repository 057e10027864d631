"""``import deqjax`` loads neither ``deqjax.harness`` nor tyro (the harness's public names are
frozen in tests/test_public_api.py)."""

from __future__ import annotations

import subprocess
import sys


def test_import_deqjax_loads_neither_the_harness_nor_tyro():
    code = "import sys, deqjax; print('deqjax.harness' in sys.modules, 'tyro' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
