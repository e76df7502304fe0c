"""``python -m oxygen_ros.ros --ros-args --params-file config/tabletop.yaml``: run the oxygen node."""

import sys

from oxygen_ros.ros.main import main

sys.exit(main())
