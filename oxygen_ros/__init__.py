"""oxygen_ros: pi0.5 VLA inference with a unified KV cache (OxyGen) for ROS 2."""

# The generated ROS messages (oxygen_ros.msg) are installed by rosidl into the venv's site-packages while the
# sources may be imported from the repository: merge both locations into one package.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
