"""ROS 2 integration: message conversion and the oxygen_ros node."""
