"""Built-in input functions. Imports here force registration."""
from input_fns import digits  # noqa: F401
