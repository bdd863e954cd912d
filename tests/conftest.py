import os

import pytest

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
