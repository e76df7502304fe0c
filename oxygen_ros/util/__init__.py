"""Small ROS-free, torch-free helpers every room may use (the host's CPU, percentiles); imports nothing else of the
package."""
