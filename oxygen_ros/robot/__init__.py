"""The robot side the node and the chunk executor share, free of rclpy and torch: joint limits (URDF and
parameters), the chunk limiter, the enable gate, the per-publisher filter, the fault counter and the frame watchdog."""
