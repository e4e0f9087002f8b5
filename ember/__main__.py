"""`python -m ember ...`: the same command as the `ember` console script (`ember.cli:main`)."""
import sys

from ember.cli import main

if __name__ == "__main__":
    sys.exit(main())
