"""The embedded example, apart from the product: a toy tabletop world and everything built on it.

- :mod:`.world`: the tabletop world, its language and the synthetic demo scene (numpy only);
- :mod:`.sim`: the world as a ROS 2 simulator node (``oxygen-sim``, ``python -m oxygen_ros.toy.sim``);
- :mod:`.train`: demonstrations, losses, training and closed-loop evaluation of the toy model;
- :mod:`.demo`: the closed-loop demo over ROS 2 (``make demo``, ``oxygen-demo``, ``python -m oxygen_ros.toy.demo``);
- :mod:`.model`: the shipped toy model (package data) and its path, the node's default checkpoint.

The product rooms never import this room, except :mod:`.model`'s path (it imports nothing).
"""
