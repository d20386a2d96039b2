"""tfopt: TensorFlow-native graph optimization (placement, optimizers, MoE
pruning, one-shot NAS, training at scale)."""

from setuptools import find_packages, setup

setup(
    name="tfopt",
    version="0.1.0",
    description="TensorFlow-native graph optimization: capture, cost, place.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tfopt", "tfopt.*"]),
    python_requires=">=3.10,<3.13",
    install_requires=[
        # Keras 3 ships with TF >= 2.16; 2.21 is what is tested here. The CPU
        # wheel is enough for everything tfopt verifies on CI; users with a
        # GPU install `tensorflow[and-cuda]` in the same range instead.
        "tensorflow-cpu>=2.16,<2.22",
        "keras>=3.3,<4",
        "networkx>=3.1,<4",
        "numpy>=1.26,<3",
        "absl-py>=2.0,<3",
        "ortools>=9.10,<10",
        # Plots: Gantt charts of placements, NAS scatterplots, MFU timelines.
        "matplotlib>=3.7,<4",
    ],
    extras_require={
        # jax: the optimizers are checked on Keras' JAX backend too.
        "test": ["pytest>=8,<10", "pytest-timeout>=2.2,<3",
                 "jax>=0.4.35,<0.11"],
    },
)
