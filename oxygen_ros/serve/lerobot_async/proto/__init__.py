"""LeRobot 0.6.1's ``transport`` gRPC service definitions (``services.proto``) and the code grpcio-tools generated
from them (``services_pb2.py``, ``services_pb2_grpc.py``; regenerate with the command in ``services.proto``)."""
