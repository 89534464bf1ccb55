"""estimator-dist: Estimator-based data-parallel training for TensorFlow 2.15 (tf.compat.v1 surface)."""
import os

from setuptools import find_packages, setup

# The runtime pins are the platform decision: 2.15 is the last TensorFlow with
# tf.estimator. ESTIMATOR_DIST_GPU=1 (make GPU=1) installs the CUDA build instead
# of the small CPU wheel.
TENSORFLOW = ("tensorflow[and-cuda]==2.15.1" if os.environ.get("ESTIMATOR_DIST_GPU")
              else "tensorflow-cpu==2.15.1")
INSTALL_REQUIRES = [
    TENSORFLOW,
    "tensorflow-estimator==2.15.0",
    "keras==2.15.0",
    "numpy>=1.23,<2",
    "protobuf>=3.20,<5",
    "pandas>=2.0,<3",
    "PyYAML>=6.0",
    "scikit-learn>=1.3,<1.6",
    "matplotlib>=3.7,<4",
]

setup(
    name="estimator-dist",
    version="0.7.0",
    description="Estimator-based distributed training service for TensorFlow",
    python_requires=">=3.9,<3.12",
    packages=find_packages(include=["estimator_dist*", "model_fns*", "input_fns*"]),
    install_requires=INSTALL_REQUIRES,
    # pytest-xdist: `make test` runs a worker per core; pytest-cov: coverage of estimator_dist/.
    # pytest < 9: pytest 9.2 ignores xdist 3.8's `--dist loadgroup` (tests/conftest.py checks).
    extras_require={"test": ["pytest>=7,<9", "pytest-timeout>=2.1", "pytest-xdist>=3.5,<4",
                             "pytest-cov>=5,<8"]},
    entry_points={"console_scripts": ["estimator-dist=estimator_dist.cli.main:main"]},
)
