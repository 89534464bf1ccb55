"""Built-in model_fns. Imports here force registration."""
from model_fns import digits  # noqa: F401
