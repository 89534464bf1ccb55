"""Built-in model_fns. Imports here force registration."""
from model_fns import digits  # noqa: F401
from model_fns import resnet  # noqa: F401
from model_fns import tabular  # noqa: F401
from model_fns import resnet50  # noqa: F401
