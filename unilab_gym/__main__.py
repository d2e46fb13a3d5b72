"""``python -m unilab_gym ...`` is the ``unilab-gym`` command."""

import sys

from unilab_gym.cli import main

sys.exit(main())
