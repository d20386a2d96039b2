"""tfopt: TensorFlow-native graph optimization (placement, optimizers, MoE
pruning, one-shot NAS, training at scale)."""

from setuptools import find_packages, setup

# keras-hub 0.32's own requirements except tensorflow-text (see "hub").
# sklearn's bundled digits: the NAS benchmark's and tests' data.
_NAS_DEPS = ["scikit-learn>=1.5,<2"]
_KERAS_HUB_DEPS = ["regex>=2023", "rich>=13", "kagglehub>=0.3,!=1.0.1",
                   "kagglesdk==0.1.28", "sentencepiece>=0.2,<0.3",
                   "tokenizers>=0.19,<1"]

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
                 "jax>=0.4.35,<0.11"] + _KERAS_HUB_DEPS + _NAS_DEPS,
        # keras-hub's Mixtral / Qwen-MoE layers (tfopt.pruning adapters).
        # keras-hub itself is installed with --no-deps (see Makefile): its
        # tensorflow-text requirement would pull the full `tensorflow` wheel
        # over tensorflow-cpu, and the MoE layers do not need it.
        "hub": _KERAS_HUB_DEPS,
        "nas": _NAS_DEPS,
    },
)
