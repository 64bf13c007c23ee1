"""Shared test set-up: quiet TensorFlow, fixed threads, one parameter list for optimizers."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

# One shared list: every optimizer the exactness promise covers.
OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "rmsprop_momentum": lambda: keras.optimizers.RMSprop(0.01, momentum=0.9),
    "adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "lion": lambda: keras.optimizers.Lion(0.001),
}


@pytest.fixture(params=sorted(OPTIMIZERS))
def optimizer_factory(request):
    """Each optimizer of the exactness promise, as a factory."""
    return OPTIMIZERS[request.param]
