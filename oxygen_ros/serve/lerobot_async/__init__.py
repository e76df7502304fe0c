"""LeRobot 0.6.1's async inference (``--protocol lerobot``): its gRPC service (:mod:`.server`, registered by
:mod:`.service` over the proto's messages, :mod:`.proto`), the chunked transfer (:mod:`.transfer`), the API key
(:mod:`.api_key`), its observations read for the policy (:mod:`.observations`), and its pickled payloads
(:mod:`.payloads`), read by the allow-list unpickler (:mod:`.unpickler`: :mod:`.prescan`, :mod:`.numpy_state`,
:mod:`.torch_state`) and written by :mod:`.pickler`."""
