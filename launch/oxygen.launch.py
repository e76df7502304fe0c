"""Launch the oxygen_ros inference node (a lifecycle node; it configures and activates itself unless
``autostart:=false``, in which case a lifecycle manager drives it).

    # closed-loop demo: the embedded toy model (config/tabletop.yaml) driving the tabletop simulator
    ros2 launch oxygen_ros oxygen.launch.py with_sim:=true
    # a real robot
    ros2 launch oxygen_ros oxygen.launch.py \\
        config_file:=$(ros2 pkg prefix oxygen_ros)/share/oxygen_ros/config/libero.yaml \\
        checkpoint_path:=/models/pi05_libero namespace:=arm1
    # bag replay: follow /clock
    ros2 launch oxygen_ros oxygen.launch.py use_sim_time:=true
    # with the chunk executor (docs/executor.md): timed, limited setpoints at the controller's rate
    ros2 launch oxygen_ros oxygen.launch.py with_executor:=true executor_config_file:=/path/to/executor.yaml

(In the venv of ``make setup``, where there is no ros2cli: ``. tools/ros_env.sh`` then ``oxygen-launch`` with the same
arguments.)

Arguments: config_file, checkpoint_path (replaces the file's model when set), use_sim_time, namespace, node_name,
autostart, trajectory_topic (where ~/trajectory is remapped to), log_level, with_sim (also start the tabletop
simulator node, ``tabletop_sim``, that publishes the cameras, joint states and instruction and executes the chunks),
dds_profile (the Fast DDS profile for the started processes), respawn and respawn_delay (restart the node and the
executor after their process died; the respawned node comes back active on its own), with_executor (also start the
chunk executor, ``oxygen_executor``, in its own process, wired to the node's chunks and halt) and
executor_config_file (its parameters; the node's config_file is given to it first, so it shares action_rate_hz and
the limits.* parameters). The executor is a lifecycle node too: with autostart it configures and activates itself,
as the node does.

CPU layout (docs/executor.md, "CPU layout"): node_cpus pins the node's process (``taskset -c``) and sets its
torch_threads to that many CPUs; executor_cpus and executor_rt_priority give the executor's command loop thread its
CPUs (rt.cpus) and SCHED_FIFO priority (rt.priority), so inference and the command loop never share a core.

Every name is relative, so the file can be included under ``PushRosNamespace``: the node, and with ``with_sim`` the
simulator, live in the including namespace (plus ``namespace``), and the simulator is wired to the node's relative
outputs and inputs. With ``with_sim`` and ``use_sim_time`` the simulator owns the time: it publishes a simulated
``/clock`` (``publish_clock``) that the node follows. The processes are started in a scoped group: the DDS profile's
environment variables do not leak into an including launch description.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from launch.actions import DeclareLaunchArgument, GroupAction, LogInfo, OpaqueFunction, SetEnvironmentVariable
from launch.launch_context import LaunchContext
from launch.launch_description import LaunchDescription
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare

from oxygen_ros.executor.rt import parse_cpus
from oxygen_ros.ros.dds import PROFILE_FILE_NAME, dds_profile_environment
from oxygen_ros.toy.world import CAMERAS as SIM_CAMERAS  # the tabletop simulator's cameras

PACKAGE = "oxygen_ros"
EXECUTABLE = "oxygen_node"


class Argument(NamedTuple):
    """One launch argument, declared as ``DeclareLaunchArgument(name, default_value=default, description=...)``."""

    name: str
    default: Any
    description: str


ARGUMENTS: list[Argument] = [
    Argument("config_file", PathJoinSubstitution([FindPackageShare(PACKAGE), "config", "tabletop.yaml"]),
             "ROS parameters file (see share/oxygen_ros/config: tabletop, libero, droid, aloha, humanoid, synthetic)"),
    Argument("checkpoint_path", "", "pi0.5 checkpoint directory; overrides the config file's checkpoint_path (and "
             "its embedded model) when set"),
    Argument("use_sim_time", "false", "follow /clock (bag replay, simulation)"),
    Argument("namespace", "", "namespace of the node (relative topics such as joint_states and instruction move "
             "with it)"),
    Argument("node_name", "oxygen", "name of the node (its outputs are ~/action_chunk, ~/language_output, "
             "~/trajectory)"),
    Argument("autostart", "true", "configure and activate at startup; false: wait for lifecycle transitions"),
    Argument("trajectory_topic", "/joint_trajectory_controller/joint_trajectory",
             "where ~/trajectory is remapped to (ros2_control's joint_trajectory_controller input)"),
    Argument("log_level", "info", "ROS log level of the node"),
    Argument("with_sim", "false", "also start the tabletop simulator (tabletop_sim) as the robot: closed-loop demo "
             "(the node's cameras are wired to the simulator's; with use_sim_time the simulator publishes /clock)"),
    Argument("with_executor", "false", "also start the chunk executor (oxygen_executor, its own process): the "
             "node's chunks as timed, limited setpoints at the controller's rate (docs/executor.md)"),
    Argument("executor_config_file", PathJoinSubstitution([FindPackageShare(PACKAGE), "config", "executor.yaml"]),
             "the executor's parameters (output, output_topic, output_joints, switch, interpolation, ...)"),
    Argument("respawn", "false", "restart the node (and the executor) when its process dies (a crash, an OOM "
             "kill): the respawned node configures and activates itself (autostart) with the same parameters "
             "(docs/tasks.md)"),
    Argument("respawn_delay", "2.0", "seconds between a process's death and its restart (respawn:=true)"),
    Argument("node_cpus", "", "CPUs of the node's process, e.g. '4-13' (taskset -c; torch_threads set to their "
             "number); '' = any"),
    Argument("executor_cpus", "", "CPUs of the executor's command loop thread (rt.cpus), e.g. '1'; '' = the "
             "config file's"),
    Argument("executor_rt_priority", "", "SCHED_FIFO priority of the executor's command loop thread "
             "(rt.priority), e.g. '80'; '' = the config file's"),
    Argument("dds_profile", PathJoinSubstitution([FindPackageShare(PACKAGE), "config", PROFILE_FILE_NAME]),
             "Fast DDS profile for the started processes (sized for raw camera images); '' = none; a profile that "
             "the environment already names (FASTDDS_DEFAULT_PROFILES_FILE) is kept"),
]


def _as_bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise ValueError(f"expected true or false, got {text!r}")
    return value in ("true", "1")


def _as_delay(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"respawn_delay: expected seconds, got {text!r}") from None
    if not value >= 0.0:
        raise ValueError(f"respawn_delay: expected seconds >= 0, got {text!r}")
    return value


def oxygen_node(config_file: str | None = None, checkpoint_path: str = "", use_sim_time: bool = False,
                namespace: str = "", node_name: str = "oxygen", autostart: bool = True,
                trajectory_topic: str = "/joint_trajectory_controller/joint_trajectory", log_level: str = "info",
                extra_parameters: dict[str, Any] | None = None, **kwargs: Any) -> LifecycleNode:
    """The node action with plain values (for launch files that build it themselves). ``extra_parameters`` override
    the config file; ``kwargs`` go to the action (e.g. ``cached_output``, ``additional_env``, ``output``)."""
    overrides: dict[str, Any] = {**(extra_parameters or {}), "use_sim_time": use_sim_time, "autostart": autostart}
    if checkpoint_path:  # a checkpoint named on the command line replaces the config's embedded model
        overrides.update(checkpoint_path=checkpoint_path, model="")
    remappings = [
        # Remapping examples: send trajectories straight to a ros2_control joint_trajectory_controller ...
        ("~/trajectory", trajectory_topic),
        # ... or take inputs from differently named topics:
        # ("joint_states", "/franka/joint_states"),
        # ("instruction", "/operator/instruction"),
        # ("~/action_chunk", "/policy/action_chunk"),
    ]
    kwargs.setdefault("output", "screen")
    kwargs.setdefault("emulate_tty", True)
    return LifecycleNode(
        package=PACKAGE,
        executable=EXECUTABLE,
        name=node_name,
        namespace=namespace,
        parameters=([config_file] if config_file else []) + [overrides],  # later entries win
        remappings=remappings,
        ros_arguments=["--log-level", log_level],
        **kwargs,
    )


def sim_wiring() -> dict[str, Any]:
    """Node parameters that take the simulator's cameras, by names relative to the node's namespace (the
    simulator publishes ``cameras/<camera>/image_raw`` in the same namespace)."""
    return {"camera_names": list(SIM_CAMERAS), "camera_topics": [f"cameras/{c}/image_raw" for c in SIM_CAMERAS]}


def tabletop_sim(node_name: str = "oxygen", namespace: str = "", publish_clock: bool = False,
                 **kwargs: Any) -> Node:
    """The tabletop simulator node in the oxygen node's namespace, wired to its outputs by relative names
    (``<node_name>/action_chunk``, ``<node_name>/language_output``), so both move with an including namespace.
    ``publish_clock``: the simulator publishes its simulated time on /clock (it never uses sim time itself)."""
    kwargs.setdefault("output", "screen")
    return Node(package=PACKAGE, executable="tabletop_sim", name="tabletop_sim", namespace=namespace,
                parameters=[{"chunk_topic": f"{node_name}/action_chunk",
                             "language_topic": f"{node_name}/language_output",
                             "publish_clock": publish_clock, "use_sim_time": False}], **kwargs)


def chunk_executor(node_name: str = "oxygen", namespace: str = "", config_file: str | None = None,
                   executor_config_file: str | None = None, use_sim_time: bool = False,
                   extra_parameters: dict[str, Any] | None = None, **kwargs: Any) -> LifecycleNode:
    """The chunk executor (a lifecycle node; autostart activates it) in the oxygen node's namespace, wired to its
    ``~/action_chunk`` and ``~/halt`` by relative names. Parameters: the node's preset first (action_rate_hz,
    action_names, limits.*), then the executor's file, then ``extra_parameters`` (e.g. rt.cpus, rt.priority)."""
    kwargs.setdefault("output", "screen")
    files = [f for f in (config_file, executor_config_file) if f]
    return LifecycleNode(package=PACKAGE, executable="oxygen_executor", name="oxygen_executor", namespace=namespace,
                         parameters=[*files, {"chunk_topic": f"{node_name}/action_chunk",
                                              "halt_topic": f"{node_name}/halt", "use_sim_time": use_sim_time,
                                              **(extra_parameters or {})}], **kwargs)


def cpu_layout(node_cpus: str, executor_cpus: str, executor_rt_priority: str) -> tuple[dict[str, Any],
                                                                                       dict[str, Any],
                                                                                       dict[str, Any]]:
    """(the node action's extra kwargs, the node's extra parameters, the executor's extra parameters) for the
    launch arguments node_cpus, executor_cpus, executor_rt_priority ('' = not set).

    Raises:
        ValueError: a CPU list that does not parse, a priority that is not 1-99, or the same CPU for both.
    """
    node_kwargs: dict[str, Any] = {}
    node_params: dict[str, Any] = {}
    executor_params: dict[str, Any] = {}
    node_set = parse_cpus(node_cpus) if node_cpus else set()
    loop_set = parse_cpus(executor_cpus) if executor_cpus else set()
    if node_set & loop_set:
        raise ValueError(f"node_cpus {node_cpus!r} and executor_cpus {executor_cpus!r} share CPUs "
                         f"{sorted(node_set & loop_set)}: inference would preempt the command loop")
    if node_set:
        node_kwargs["prefix"] = f"taskset -c {node_cpus}"
        node_params["torch_threads"] = len(node_set)
    if loop_set:
        executor_params["rt.cpus"] = executor_cpus
    if executor_rt_priority:
        prio = int(executor_rt_priority)
        if not 1 <= prio <= 99:
            raise ValueError(f"executor_rt_priority must be 1-99, got {prio}")
        executor_params["rt.priority"] = prio
    return node_kwargs, node_params, executor_params


def _launch_setup(context: LaunchContext, *args: Any, **kwargs: Any) -> list[GroupAction]:
    def value(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    with_sim, use_sim_time = _as_bool(value("with_sim")), _as_bool(value("use_sim_time"))
    respawn = {"respawn": _as_bool(value("respawn")), "respawn_delay": _as_delay(value("respawn_delay"))}
    dds_env, dds_reason = dds_profile_environment(value("dds_profile"), context.environment)
    actions: list[Any] = [LogInfo(msg=f"oxygen.launch.py: {dds_reason}")]
    actions += [SetEnvironmentVariable(name, text) for name, text in dds_env.items()]
    if with_sim:
        if use_sim_time:
            actions.append(LogInfo(msg="oxygen.launch.py: with_sim + use_sim_time: the simulator publishes its "
                                       "simulated time on /clock and the node follows it"))
        actions.append(tabletop_sim(value("node_name"), value("namespace"), publish_clock=use_sim_time))
    node_kwargs, node_params, executor_params = cpu_layout(value("node_cpus"), value("executor_cpus"),
                                                           value("executor_rt_priority"))
    if _as_bool(value("with_executor")):
        actions.append(chunk_executor(value("node_name"), value("namespace"), value("config_file") or None,
                                      value("executor_config_file") or None, use_sim_time, executor_params,
                                      **respawn))
    actions.append(oxygen_node(
        config_file=value("config_file") or None,
        checkpoint_path=value("checkpoint_path"),
        use_sim_time=use_sim_time,
        namespace=value("namespace"),
        node_name=value("node_name"),
        autostart=_as_bool(value("autostart")),
        trajectory_topic=value("trajectory_topic"),
        log_level=value("log_level"),
        extra_parameters={**(sim_wiring() if with_sim else {}), **node_params},
        **node_kwargs,
        **respawn,
    ))
    return [GroupAction(actions, scoped=True, forwarding=True)]  # the environment set here stays in the group


def generate_launch_description() -> LaunchDescription:
    """Entry point of ``ros2 launch oxygen_ros oxygen.launch.py``."""
    return LaunchDescription(
        [DeclareLaunchArgument(a.name, default_value=a.default, description=a.description) for a in ARGUMENTS]
        + [OpaqueFunction(function=_launch_setup)]
    )
