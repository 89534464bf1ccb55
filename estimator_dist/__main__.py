"""`python -m estimator_dist` is the `estimator-dist` command."""
import sys

from estimator_dist.cli.main import main

sys.exit(main())
