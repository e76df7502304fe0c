"""``python -m oxygen_ros.evaluation BAG --params-file FILE [-p name:=value ...] --out DIR``."""

import sys

from oxygen_ros.evaluation.cli import main

sys.exit(main())
