"""Small ROS-free, torch-free helpers every room may use (the host's CPU, percentiles, threads kept off a
real-time policy); imports nothing else of the package."""
