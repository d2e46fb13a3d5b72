"""Where things are, for tests that start a Python subprocess or read files of the repository.

``HELPERS`` is this folder (``tests/conftest.py`` puts it on ``sys.path``; a subprocess that imports a helper
puts it on its own), ``ROOT`` the repository's root.
"""

from pathlib import Path

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
ROOT = TESTS.parent
