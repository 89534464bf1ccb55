"""Built-in input functions. Imports here force registration."""
from input_fns import digits  # noqa: F401
from input_fns import cifar  # noqa: F401
from input_fns import tabular  # noqa: F401
from input_fns import imagenet  # noqa: F401
from input_fns import tfrecord  # noqa: F401
