import os

import pytest
from hypothesis import settings

# Hypothesis' per-example deadline (200 ms by default) is a wall-clock assertion: on a loaded 2-core machine it fails
# good code. No test of opendpu asserts a duration (tests/test_no_duration_asserts.py), so none has a deadline.
settings.register_profile("opendpu", deadline=None)
settings.load_profile("opendpu")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("OPENDPU_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
MODELS = os.path.join(SHARED, "models")
MODEL_NAMES = ("dpu_mnist_classifier", "tf2_custom_op", "pointpillars_custom_op", "yolox_nano_b4096",
               "yolox_nano_b512")


def model_path(name: str) -> str:
    p = os.path.join(MODELS, name + ".xmodel")
    if not os.path.isfile(p):
        pytest.skip(f"shared model {p} not present")
    return p


@pytest.fixture
def mnist_path():
    return model_path("dpu_mnist_classifier")
