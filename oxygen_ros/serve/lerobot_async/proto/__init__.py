"""LeRobot 0.6.1's ``transport`` gRPC definitions (``services.proto``) and the message code protoc generated from
them (``services_pb2.py``; regenerate with the command in ``services.proto``). The service itself is registered by
hand: :mod:`..service`."""
