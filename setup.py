"""pip install path for oxygen_ros (the engine works without ROS).

colcon on a ROS 2 robot follows package.xml (build_type ament_cmake, see CMakeLists.txt);
this file serves `pip install .` / `pip install -e .` for researchers and for the test environment.
"""

from glob import glob

from setuptools import find_packages, setup

package_name = "oxygen_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(include=["oxygen_ros", "oxygen_ros.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{package_name}"]),
        (f"share/{package_name}", ["package.xml"]),
        # the presets (demo, launch) and the Fast DDS profile (oxygen_ros.ros.dds)
        (f"share/{package_name}/config", sorted(glob("config/*.yaml") + glob("config/*.xml"))),
        (f"share/{package_name}/launch", sorted(glob("launch/*.py"))),
    ],
    # the model's files only: training logs and curves stay in the repository (runs/train_toy/)
    # (oxygen_ros/toy/model/, found by oxygen_ros.policy.shipped_model)
    package_data={"oxygen_ros.toy": [f"model/{name}" for name in ("config.json", "model.safetensors", "norm_stats.json",
                                                                  "tokenizer.model", "README.md")]},
    install_requires=["torch>=2.5", "numpy", "safetensors", "sentencepiece", "transformers", "tqdm"],
    extras_require={"ros": ["rosbags", "opencv-python-headless<5", "cv-bridge", "pyyaml", "urdf-parser-py"],
                    "ray": ["ray>=2.40"]},  # fleet evaluation on a Ray cluster (oxygen-evaluate-bag over many bags)
    zip_safe=False,
    maintainer="oxygen_ros developers",
    maintainer_email="oxygen-ros@example.org",
    description="pi0.5 VLA inference with a unified KV cache (OxyGen) for ROS 2.",
    license="Apache-2.0",
    python_requires=">=3.10",
    entry_points={
        "console_scripts": [
            "oxygen-node = oxygen_ros.ros.main:main",
            "oxygen-executor = oxygen_ros.executor.main:main",
            "oxygen-doctor = oxygen_ros.ros.doctor:main",
            "oxygen-profile = oxygen_ros.tools.profile:main",
            "oxygen-make-checkpoint = oxygen_ros.tools.make_checkpoint:main",
            "oxygen-make-tokenizer = oxygen_ros.tools.make_tokenizer:main",
            "oxygen-bench = oxygen_ros.bench.cli:main",
            "oxygen-make-demo-bag = oxygen_ros.tools.make_demo_bag:main",
            "oxygen-replay-bag = oxygen_ros.evaluation.cli:replay_bag_main",
            "oxygen-evaluate-bag = oxygen_ros.evaluation.cli:main",
            "oxygen-export-lerobot = oxygen_ros.export.cli:main",
            "oxygen-sim = oxygen_ros.toy.sim.node:main",
            "oxygen-launch = oxygen_ros.tools.launch_file:main",
            "oxygen-ask = oxygen_ros.tools.ask:main",
            "oxygen-run = oxygen_ros.tools.run_task:main",
            "oxygen-serve = oxygen_ros.tools.serve:main",
            "oxygen-compile = oxygen_ros.tools.compile:main",
            "oxygen-demo = oxygen_ros.toy.demo.run:main",
            "oxygen-train-toy = oxygen_ros.toy.train.train:main",
            "oxygen-evaluate-toy = oxygen_ros.toy.train.evaluate:main",
            "oxygen-rtc-eval = oxygen_ros.toy.train.rtc_eval:main",
        ],
    },
)
