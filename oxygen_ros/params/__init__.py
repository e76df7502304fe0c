"""The parameter schema, one for every shell: :func:`param` declares a parameter as a dataclass field,
:class:`ParamSpec` is what the node, the executor, ``oxygen-serve`` and the docs read from it, :func:`read_specs`
coerces and checks a mapping of values against specs, :func:`add_arguments` turns specs into argparse flags and
:func:`markdown_table` into a docs table. :mod:`oxygen_ros.params.robot` declares the parameters the node and the
chunk executor share (one preset file serves both). Imports neither torch nor ROS.
"""

from .cli import add_arguments, arg_type
from .robot import ROBOT_PARAMS, robot_param
from .schema import (
    MISSING,
    ParamError,
    ParamSpec,
    declared,
    lookup,
    markdown_table,
    param,
    read_specs,
    specs_of,
)

__all__ = ["MISSING", "ROBOT_PARAMS", "ParamError", "ParamSpec", "add_arguments", "arg_type", "declared", "lookup",
           "markdown_table", "param", "read_specs", "robot_param", "specs_of"]
