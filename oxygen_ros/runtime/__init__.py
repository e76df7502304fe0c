"""The node's side that needs no ROS: its parameters (:mod:`.params`, ``NodeParams``), loading the checkpoint and
building the frame runner for them (:mod:`.model_loader`) and the generated parameter page (:mod:`.param_docs`).
The ROS node (:mod:`oxygen_ros.ros`) and the bag evaluation share them."""
