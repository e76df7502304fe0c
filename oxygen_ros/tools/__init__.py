"""Command-line tools for oxygen_ros."""
