"""``python -m oxygen_ros.executor``: start the chunk executor (see :mod:`oxygen_ros.executor.node`)."""

import sys

from .main import main

sys.exit(main())
